// Read-only access to safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
// Files are memory-mapped; tensors are views into the maps (copied only when misaligned for their dtype).
// Every header is validated: a truncated file, a corrupt header or an out-of-range tensor is an Error
// naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/tensor.h"

namespace deepinfer {

struct TensorInfo {
    std::string name;
    DType dtype = DType::kF32;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);
    // Parses an in-memory file image (used by tests); `what` names it in errors. The bytes must outlive this.
    SafetensorsFile(const uint8_t* bytes, size_t size, const std::string& what);

    const std::string& path() const { return path_; }
    const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find(const std::string& name) const;
    // Pointer to a tensor's first byte.
    const uint8_t* data(const TensorInfo& t) const { return data_ + t.begin; }

private:
    void parse(const uint8_t* bytes, size_t size);

    std::string path_;
    MappedFile map_;
    const uint8_t* data_ = nullptr;
    std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a checkpoint directory.
class Checkpoint {
public:
    // Opens DIR/model.safetensors.index.json if present, else every *.safetensors file in DIR.
    explicit Checkpoint(const std::string& dir);
    // A checkpoint with no files, filled by add() (random weights drawn under `seed`); `what` names it in
    // messages.
    static Checkpoint synthetic(const std::string& what, uint64_t seed);
    Checkpoint(Checkpoint&&) = default;

    bool is_synthetic() const { return synthetic_; }
    uint64_t seed() const { return seed_; }
    // Adds an owned tensor (synthetic checkpoints only); the name must be new.
    void add(const std::string& name, Tensor tensor);

    const std::string& dir() const { return dir_; }
    bool has(const std::string& name) const { return index_.count(name) != 0; }
    const TensorInfo* find(const std::string& name) const;
    // A view of the tensor (aligned for its dtype). Throws if absent.
    TensorView view(const std::string& name);
    std::vector<std::string> names() const;
    // File that holds a tensor (for error messages).
    std::string file_of(const std::string& name) const;

private:
    Checkpoint() = default;

    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> index_;
    std::vector<Tensor> realigned_;  // copies of tensors whose offset is misaligned for their dtype
    bool synthetic_ = false;
    uint64_t seed_ = 0;
    struct Owned {
        TensorInfo info;
        Tensor data;
    };
    std::map<std::string, std::unique_ptr<Owned>> owned_;  // tensors added to a synthetic checkpoint
};

}  // namespace deepinfer
