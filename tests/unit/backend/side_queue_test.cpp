// SideQueue's protocol (begin, end, join in that order) on a backend that runs ops one at a time, where the
// side queue's calls are no-ops and its ops run in issue order.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(SideQueue, CallsOutOfOrderThrow) {
    const std::unique_ptr<Backend> be = create_backend("cpu", 1);
    SideQueue a(*be);
    EXPECT_THROW(a.end(), Error);
    EXPECT_THROW(a.join(), Error);
    a.begin();
    EXPECT_THROW(a.begin(), Error);
    EXPECT_THROW(a.join(), Error);
    a.end();
    EXPECT_THROW(a.end(), Error);
    a.join();
    EXPECT_THROW(a.join(), Error);
}

TEST(SideQueue, OpsRunInIssueOrderOnTheCpu) {
    const std::unique_ptr<Backend> be = create_backend("cpu", 1);
    Tensor x = be->alloc(DType::kF32, Shape{3});
    const std::vector<float> v = {1.0f, -2.0f, 4.0f};
    be->upload(x, v.data());
    {
        SideQueue q(*be);
        q.begin();
        be->scale(x, 3.0f);
        q.end();
        be->scale(x, 0.5f);
        q.join();
    }
    std::vector<float> out(3);
    be->download(out.data(), x);
    EXPECT_EQ(out, (std::vector<float>{1.5f, -3.0f, 6.0f}));
}

}  // namespace
}  // namespace deepinfer
