// StepArrays: staged arrays arrive in backend memory intact and aligned, and reserved arrays get room of their own
// in the same block, after the staged ones, without overlapping them or each other.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/step_arrays.h"

namespace deepinfer {
namespace {

TEST(StepArrays, StagedArraysArriveAndReservedOnesHaveTheirOwnRoom) {
    auto be = create_backend("cpu", 1);
    StepArrays arrays(*be);
    const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5, 6, 7, 8};
    float row = 0.0f;
    const std::vector<float*> rows = {&row, nullptr};
    const StepArrays::Handle ha = arrays.stage_i32(a);
    const StepArrays::Handle r1 = arrays.reserve_i32(7);
    const StepArrays::Handle hr = arrays.stage_rows(rows);
    const StepArrays::Handle r2 = arrays.reserve_i32(3);
    const StepArrays::Handle hb = arrays.stage_i32(b);
    arrays.upload_staged();

    const TensorView va = arrays.view(ha), vb = arrays.view(hb), vr = arrays.view(hr);
    EXPECT_EQ(std::vector<int32_t>(va.as<int32_t>(), va.as<int32_t>() + 3), a);
    EXPECT_EQ(std::vector<int32_t>(vb.as<int32_t>(), vb.as<int32_t>() + 5), b);
    EXPECT_EQ(vr.as<float*>()[0], &row);
    EXPECT_EQ(vr.as<float*>()[1], nullptr);
    // Reserved arrays: writable, 16-byte aligned, after every staged byte, apart from each other.
    const TensorView v1 = arrays.view(r1), v2 = arrays.view(r2);
    EXPECT_EQ(v1.numel(), 7);
    EXPECT_EQ(v2.numel(), 3);
    for (const TensorView& v : {v1, v2}) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 16, 0u);
        EXPECT_GE(static_cast<const uint8_t*>(v.data()), static_cast<const uint8_t*>(vb.data()) + vb.nbytes());
    }
    EXPECT_GE(static_cast<const uint8_t*>(v2.data()), static_cast<const uint8_t*>(v1.data()) + v1.nbytes());
    for (int i = 0; i < 7; ++i) v1.as<int32_t>()[i] = -1;
    for (int i = 0; i < 3; ++i) v2.as<int32_t>()[i] = -2;
    EXPECT_EQ(std::vector<int32_t>(vb.as<int32_t>(), vb.as<int32_t>() + 5), b);
}

}  // namespace
}  // namespace deepinfer
