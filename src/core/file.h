// File access: read-only memory maps and whole-file reads (transparently gunzipping *.gz).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace deepinfer {

class MappedFile {
public:
    MappedFile() = default;
    explicit MappedFile(const std::string& path);  // throws Error naming the path on failure
    ~MappedFile();
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    void release();
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Whole file as bytes; a path ending in ".gz" is decompressed.
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
std::string path_join(const std::string& dir, const std::string& name);

}  // namespace deepinfer
