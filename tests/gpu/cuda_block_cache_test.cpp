// The CUDA backend's host-side block cache: a freed block is handed out again for the same rounded size on the
// stream it was freed on, never on another stream; past its byte cap, and for blocks over its size cap, memory
// goes back to the allocator; the backend's tensors keep their contents across reuse of the blocks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/block_cache.h"
#include "cuda_test_support.h"

namespace deepinfer {
namespace {

class CudaBlockCache : public testing_support::CudaCompare {
public:
    CudaBlockCache() : CudaCompare("auto") {}
};

TEST_F(CudaBlockCache, ReusesBlocksPerStreamAndSize) {
    cudaStream_t a = nullptr, b = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    {
        cuda::BlockCache cache(1 << 20, 1 << 19);
        void* p = cache.take(1000, a);
        cache.give(p, a);
        EXPECT_EQ(cache.cached_bytes(), 1024u);  // 1000 rounded up to 256-byte granules
        EXPECT_EQ(cache.take(1024, a), p);       // the same rounded size on the same stream
        cache.give(p, a);
        void* q = cache.take(1000, b);  // another stream: a fresh block
        EXPECT_NE(q, p);
        void* r = cache.take(2000, a);  // another size: a fresh block
        EXPECT_NE(r, p);
        cache.give(q, b);
        cache.give(r, a);
        EXPECT_EQ(cache.cached_bytes(), 1024u + 1024u + 2048u);
        void* big = cache.take(1 << 20, a);  // over the block cap: not kept
        cache.give(big, a);
        EXPECT_EQ(cache.cached_bytes(), 1024u + 1024u + 2048u);
        cache.release_all();
        EXPECT_EQ(cache.cached_bytes(), 0u);
        std::vector<void*> held;
        for (int i = 0; i < 5; ++i) held.push_back(cache.take(300 << 10, a));
        for (void* h : held) cache.give(h, a);
        EXPECT_LE(cache.cached_bytes(), size_t{1} << 20);  // the byte cap: three of the five kept
        EXPECT_EQ(cache.cached_bytes(), 3u * (300u << 10));
    }
    ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

TEST_F(CudaBlockCache, ReusedTensorsHoldWhatIsWritten) {
    // Tensors of one size freed and allocated again in turn: each holds its own upload when read back.
    for (int round = 0; round < 20; ++round) {
        std::vector<Tensor> ts;
        std::vector<std::vector<float>> vs;
        for (int i = 0; i < 4; ++i) {
            vs.push_back(randn(4096));
            ts.push_back(gpu_->alloc(DType::kF32, Shape{4096}));
            gpu_->upload(ts.back(), vs.back().data());
            gpu_->scale(ts.back(), 2.0f);
        }
        for (int i = 0; i < 4; ++i) {
            std::vector<float> want = vs[i];
            for (float& x : want) x *= 2.0f;
            EXPECT_EQ(fetch(ts[i]), want) << "round " << round << ", tensor " << i;
        }
    }
}

TEST_F(CudaBlockCache, TensorsMayOutliveTheirBackend) {
    // A model's weights destroyed after its backend: the tensors free themselves onto the legacy stream.
    std::vector<Tensor> kept;
    {
        const std::unique_ptr<Backend> be = create_backend("cuda", 1);
        for (int i = 0; i < 3; ++i) kept.push_back(be->alloc(DType::kF32, Shape{1024}));
        Tensor freed_first = be->alloc(DType::kF32, Shape{1024});  // cached, then returned by the backend's exit
    }
    kept.clear();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace deepinfer
