// Backend::copy on the CPU: the bytes, and a size mismatch as an error (the CUDA op test compares the GPU's).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(BackendCopy, CopiesTheBytesAndChecksTheSize) {
    const std::unique_ptr<Backend> be = create_backend("cpu", 1);
    const std::vector<float> v = {1.5f, -0.0f, 3e-40f, -7.25f, 1e30f, 2.0f};
    Tensor src = be->alloc(DType::kF32, Shape{2, 3}), dst = be->alloc(DType::kF32, Shape{3, 2});
    be->upload(src, v.data());
    be->copy(dst, src);
    std::vector<float> out(6);
    be->download(out.data(), dst);
    EXPECT_EQ(std::memcmp(out.data(), v.data(), 6 * 4), 0);
    Tensor small = be->alloc(DType::kF32, Shape{5});
    EXPECT_THROW(be->copy(small, src), Error);
}

}  // namespace
}  // namespace deepinfer
