// A host-side cache of freed device blocks in front of the stream-ordered allocator (cudaMallocAsync /
// cudaFreeAsync). A decode step allocates and frees the same few hundred tensor sizes every step, and each
// allocator call costs the host ~0.7 us (the per-op profile: ~0.26 ms of host time a step at batch 1, when the
// host's launches already pace the GPU). A block freed on a stream is handed out again only for allocations on that
// stream, which the stream orders after the free, exactly as the allocator's own same-stream reuse does.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deepinfer::cuda {

class BlockCache {
public:
    // Blocks up to max_block bytes are kept, at most max_bytes of them in all; the rest go back at once.
    BlockCache(size_t max_bytes, size_t max_block) : max_bytes_(max_bytes), max_block_(max_block) {}
    ~BlockCache() { release_all(); }
    BlockCache(const BlockCache&) = delete;
    BlockCache& operator=(const BlockCache&) = delete;

    // At least `bytes` of device memory for work queued on `stream`: a cached block of that rounded size freed on
    // it, else a fresh one from the allocator. Throws on allocation failure.
    void* take(size_t bytes, cudaStream_t stream);
    // `p` (from take) freed, its last use queued on `stream`: cached for that stream, or back to the allocator.
    void give(void* p, cudaStream_t stream);
    // Every cached block back to the allocator, on the stream it was freed on.
    void release_all();
    size_t cached_bytes() const;

    // As an owner's tensor allocator. Tensors may outlive their owner (a model's weights destroyed after its
    // backend), so the owner creates the cache with new, frees its tensors through release (a Tensor release
    // function, context = the cache) onto the stream *current names, and on its way out calls detach (before its
    // streams go): cached blocks return to the allocator, later frees go onto the legacy stream, and the cache
    // deletes itself once its last block is back.
    void set_current_stream(const cudaStream_t* current) { current_ = current; }
    static void release(void* context, void* p);
    static void detach(BlockCache* cache);

private:
    static size_t rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }
    bool give_locked(void* p, cudaStream_t stream);  // false: not cached, the caller frees it

    const size_t max_bytes_, max_block_;
    const cudaStream_t* current_ = nullptr;  // the owner's current stream; null once detached
    bool detached_ = false;
    mutable std::mutex mu_;
    std::unordered_map<void*, size_t> sizes_;                             // every block out, by address
    std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_;  // cached, by (stream, size)
    size_t cached_ = 0;
};

}  // namespace deepinfer::cuda
