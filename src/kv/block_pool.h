// A pool of fixed-size memory blocks carved from one arena sized by a memory budget. Allocation and
// release are O(1) bookkeeping (a free stack); the memory itself is never touched here, so a block may be
// handed to a new owner while its previous owner's last computation is still reading it, as long as the new
// owner writes only after that computation ends (the engine's async step loop relies on this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace deepinfer::kv {

class BlockPool {
public:
    // num_blocks blocks of block_bytes (a multiple of 64) each, in host memory the pool allocates, or in `arena`
    // (e.g. device memory of a backend; at least block_bytes * num_blocks bytes, 64-byte aligned, owned by
    // the caller and never dereferenced here).
    BlockPool(size_t block_bytes, int64_t num_blocks, void* arena = nullptr);
    ~BlockPool();
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    size_t block_bytes() const { return block_bytes_; }
    int64_t num_blocks() const { return num_blocks_; }
    int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
    int64_t num_used() const { return num_blocks_ - num_free(); }
    // Every block is free (no leak).
    bool whole() const { return num_free() == num_blocks_; }

    // Appends n block ids to out, or nothing when fewer than n are free. Returns whether it did.
    bool allocate(int64_t n, std::vector<int32_t>& out);
    // Returns blocks to the pool; freeing a block that is not allocated is an internal error.
    void release(const std::vector<int32_t>& ids);

    float* data(int32_t id) const {
        return reinterpret_cast<float*>(arena_ + static_cast<size_t>(id) * block_bytes_);
    }

private:
    struct Free {
        void operator()(uint8_t* p) const;
    };
    size_t block_bytes_;
    int64_t num_blocks_;
    std::unique_ptr<uint8_t, Free> owned_;
    uint8_t* arena_ = nullptr;
    std::vector<int32_t> free_;  // stack of free ids; the lowest ids are handed out first
    std::vector<uint8_t> used_;  // [num_blocks] 1 = allocated
};

}  // namespace deepinfer::kv
