// StepArrays: staged arrays arrive in backend memory intact and aligned, and reserved arrays get room of their own
// in the same block, after the staged ones, without overlapping them or each other. RowRuns: rows described as runs
// expand (fill_row_addresses) to the addresses a row-by-row walk gives, long runs split, paged buffers a run a page.
#include "model/step_arrays.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

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

// Reserved I64 rows next to staged I64 runs: fill_row_addresses expands the runs into them.
TEST(RowRuns, ExpandToTheRowByRowAddresses) {
    auto be = create_backend("cpu", 1);
    const int64_t d = 6, per_page = 5;
    std::vector<float> ring(20 * d), step(3 * d), page0(per_page * d), page1(per_page * d), page2(per_page * d);
    const PagedRows paged{{page0.data(), page1.data(), page2.data()}, per_page, d};
    std::vector<float> long_run(static_cast<size_t>((RowRuns::kMaxRunRows + 10) * 2));
    RowRuns keys, index;
    std::vector<const float*> want;
    keys.add(ring.data() + 17 * d, 3, d);  // a window wrapping at the ring's end: rows 17..19, then 0..1
    keys.add(ring.data(), 2, d);
    keys.add(step.data(), 0, d);  // no run
    keys.add(step.data(), 3, d);
    keys.add_paged(paged, 12);  // pages of 5, 5, 2
    for (int64_t r : {17, 18, 19, 0, 1}) want.push_back(ring.data() + r * d);
    for (int64_t r = 0; r < 3; ++r) want.push_back(step.data() + r * d);
    for (int64_t e = 0; e < 12; ++e) want.push_back(paged.row(e));
    const int64_t nk = keys.rows;
    index.add(long_run.data(), RowRuns::kMaxRunRows + 10, 2);  // split in two runs
    for (int64_t r = 0; r < RowRuns::kMaxRunRows + 10; ++r) want.push_back(long_run.data() + 2 * r);
    EXPECT_EQ(nk, 20);
    EXPECT_EQ(keys.values.size(), 4u * 6);   // 2 window + 1 step + 3 pages
    EXPECT_EQ(index.values.size(), 4u * 2);  // kMaxRunRows, then 10
    EXPECT_TRUE(keys.aligned(8));

    StepArrays arrays(*be);
    const std::vector<int64_t> runs = keys.concat(index);
    const StepArrays::Handle runs_h = arrays.stage_i64(runs);
    const StepArrays::Handle rows_h = arrays.reserve_rows(nk + index.rows);
    arrays.upload_staged();
    const TensorView rows = arrays.view(rows_h), r = arrays.view(runs_h);
    be->fill_row_addresses(rows, r.reshape(Shape{r.numel() / 4, 4}));
    ASSERT_EQ(rows.numel(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(rows.as<float*>()[i], want[i]) << "row " << i;

    RowRuns odd;
    odd.add(ring.data() + 1, 2, d);  // 4 bytes past an aligned row
    EXPECT_FALSE(odd.aligned(8));
}

}  // namespace
}  // namespace deepinfer
