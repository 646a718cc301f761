// The CUDA backend's side queue (Backend::side_begin): ops issued there overlap the main queue's and give the
// results of the same ops issued in order; the join makes later ops wait; a throwing side op leaves the backend
// issuing on its main queue.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "cuda_test_support.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

using testing_support::make_weight;

class CudaSideQueue : public testing_support::CudaCompare {
public:
    CudaSideQueue() : CudaCompare("auto") {}

protected:
    // c = (long chain of a = x . W1^T) + (b = x . W2^T)[first n1 columns], with the chain on the side queue when
    // `side`; the chain is long (many dependent launches) so that an add that did not wait for it would read a
    // partial result.
    std::vector<float> run(bool side, const LinearWeight& w1, const LinearWeight& w2, const Tensor& x) {
        Backend& be = *gpu_;
        const int64_t t = x.dim(0), n1 = w1.rows;
        Tensor a, b = be.alloc(DType::kF32, Shape{t, w2.rows});
        SideQueue q(be);
        if (side) q.begin();
        a = be.alloc(DType::kF32, Shape{t, n1});
        be.linear(a, x, w1);
        for (int i = 0; i < 200; ++i) be.scale(a, i % 2 ? 2.0f : 0.5f);
        be.linears(x, {{a, &w1}});  // overwritten once more: the last writer is the side queue's
        for (int i = 0; i < 200; ++i) be.scale(a, i % 2 ? 0.25f : 4.0f);
        if (side) q.end();
        be.linear(b, x, w2);
        if (side) q.join();
        be.add(a, b.view().reshape(Shape{t * w2.rows}).slice_rows(0, t * n1).reshape(Shape{t, n1}));
        return fetch(a);
    }
};

TEST_F(CudaSideQueue, OverlappedOpsGiveTheInOrderResults) {
    for (int64_t t : {1, 8, 64}) {
        const LinearWeight w1 = to_backend(*gpu_, make_weight(rng_, 6, 2048, 4096).w, &storage_);
        const LinearWeight w2 = to_backend(*gpu_, make_weight(rng_, 1, 4096, 4096).w, &storage_);
        const Tensor x = device(host(randn(t * 4096), Shape{t, 4096}));
        const std::vector<float> in_order = run(false, w1, w2, x), overlapped = run(true, w1, w2, x);
        ASSERT_EQ(in_order.size(), overlapped.size());
        EXPECT_EQ(std::memcmp(in_order.data(), overlapped.data(), in_order.size() * 4), 0) << t << " rows";
    }
}

TEST_F(CudaSideQueue, AThrowingSideOpLeavesTheMainQueueInCharge) {
    Tensor t = gpu_->alloc(DType::kF32, Shape{4});
    const std::vector<float> v = {1.0f, 2.0f, 3.0f, 4.0f};
    {
        SideQueue q(*gpu_);
        q.begin();
        EXPECT_THROW(gpu_->upload(t, v.data()), Error);  // no uploads on the side queue
        EXPECT_THROW(q.join(), Error);                   // not ended
    }                                                    // ends and joins the queue
    gpu_->upload(t, v.data());
    EXPECT_EQ(fetch(t), v);
    SideQueue again(*gpu_);  // a new queue opens and closes cleanly
    again.begin();
    gpu_->scale(t, 2.0f);
    again.end();
    again.join();
    EXPECT_EQ(fetch(t), (std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
}

}  // namespace
}  // namespace deepinfer
