#include "kv/block_pool.h"

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "deepinfer/error.h"

namespace deepinfer::kv {

void BlockPool::Free::operator()(uint8_t* p) const { std::free(p); }

BlockPool::BlockPool(size_t block_bytes, int64_t num_blocks, void* arena)
    : block_bytes_(block_bytes), num_blocks_(num_blocks), arena_(static_cast<uint8_t*>(arena)) {
    DI_CHECK(block_bytes > 0 && block_bytes % 64 == 0, "block size must be a positive multiple of 64 bytes, got ",
             block_bytes);
    DI_CHECK(num_blocks >= 0 && num_blocks <= std::numeric_limits<int32_t>::max(), "bad block count ", num_blocks);
    DI_CHECK(reinterpret_cast<uintptr_t>(arena) % 64 == 0, "state memory arena is not 64-byte aligned");
    if (!arena_ && num_blocks > 0) {
        // Pages of the arena are committed by the OS on first write, so an unused budget costs nothing.
        auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, block_bytes * static_cast<size_t>(num_blocks)));
        DI_CHECK(p, "cannot allocate ", block_bytes * static_cast<size_t>(num_blocks), " bytes of state memory");
        owned_.reset(p);
        arena_ = p;
    }
    free_.reserve(num_blocks);
    for (int64_t i = num_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
    used_.assign(num_blocks, 0);
}

BlockPool::~BlockPool() = default;

bool BlockPool::allocate(int64_t n, std::vector<int32_t>& out) {
    DI_ICHECK(n >= 0, "negative block count");
    if (n > num_free()) return false;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t id = free_.back();
        free_.pop_back();
        used_[id] = 1;
        out.push_back(id);
    }
    return true;
}

void BlockPool::release(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
        DI_ICHECK(id >= 0 && id < num_blocks_ && used_[id], "releasing block ", id, " that is not allocated");
        used_[id] = 0;
        free_.push_back(id);
    }
}

}  // namespace deepinfer::kv
