// Backend::copy on the CPU: the bytes, and a size mismatch as an error (the CUDA op test compares the GPU's); and
// Backend::copy_rows: rows of mixed widths address to address, the rest untouched, mismatched lists as an error.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(BackendCopy, CopyRowsCopiesEachRowAtItsWidth) {
    const std::unique_ptr<Backend> be = create_backend("cpu", 1);
    std::vector<float> src(40), dst(40, -1.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.5f;
    // Three rows: 5 floats from src[0] to dst[30], 0 floats, 7 floats from src[11] to dst[2].
    std::vector<float*> from = {src.data(), src.data() + 20, src.data() + 11};
    std::vector<float*> to = {dst.data() + 30, dst.data() + 20, dst.data() + 2};
    const std::vector<int32_t> cols = {5, 0, 7};
    Tensor from_t(DType::kI64, Shape{3}), to_t(DType::kI64, Shape{3}), cols_t(DType::kI32, Shape{3});
    std::memcpy(from_t.view().data(), from.data(), 3 * 8);
    std::memcpy(to_t.view().data(), to.data(), 3 * 8);
    std::memcpy(cols_t.view().data(), cols.data(), 3 * 4);
    be->copy_rows(to_t, from_t, cols_t);
    std::vector<float> want(40, -1.0f);
    std::copy_n(src.begin(), 5, want.begin() + 30);
    std::copy_n(src.begin() + 11, 7, want.begin() + 2);
    EXPECT_EQ(dst, want);
    EXPECT_THROW(be->copy_rows(to_t, from_t.view().slice_rows(0, 2), cols_t), Error);
}

}  // namespace
}  // namespace deepinfer
