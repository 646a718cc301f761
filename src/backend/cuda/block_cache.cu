#include "backend/cuda/block_cache.h"

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

void* BlockCache::take(size_t bytes, cudaStream_t stream) {
    const size_t n = rounded(bytes);
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = free_.find({stream, n});
        if (it != free_.end() && !it->second.empty()) {
            void* p = it->second.back();
            it->second.pop_back();
            cached_ -= n;
            sizes_[p] = n;
            return p;
        }
    }
    void* p = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(&p, n, stream));
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = n;
    return p;
}

bool BlockCache::give_locked(void* p, cudaStream_t stream) {
    const auto it = sizes_.find(p);
    const size_t n = it == sizes_.end() ? 0 : it->second;
    if (it != sizes_.end()) sizes_.erase(it);
    if (n == 0 || detached_ || n > max_block_ || cached_ + n > max_bytes_) return false;
    free_[{stream, n}].push_back(p);
    cached_ += n;
    return true;
}

void BlockCache::give(void* p, cudaStream_t stream) {
    bool cached = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        cached = give_locked(p, stream);
    }
    if (!cached) cudaFreeAsync(p, stream);  // a destructor's path: an error would surface at the next CUDA call
}

void BlockCache::release(void* context, void* p) {
    BlockCache* c = static_cast<BlockCache*>(context);
    bool cached = false, last = false;
    cudaStream_t stream = nullptr;
    {
        std::lock_guard<std::mutex> lock(c->mu_);
        if (c->current_) stream = *c->current_;
        cached = c->give_locked(p, stream);
        last = c->detached_ && c->sizes_.empty();
    }
    if (!cached) cudaFreeAsync(p, stream);
    if (last) delete c;
}

void BlockCache::detach(BlockCache* c) {
    c->release_all();
    bool last = false;
    {
        std::lock_guard<std::mutex> lock(c->mu_);
        c->detached_ = true;
        c->current_ = nullptr;
        last = c->sizes_.empty();
    }
    if (last) delete c;
}

void BlockCache::release_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, blocks] : free_)
        for (void* p : blocks) cudaFreeAsync(p, key.first);
    free_.clear();
    cached_ = 0;
}

size_t BlockCache::cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
}

}  // namespace deepinfer::cuda
