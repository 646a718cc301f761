// Backend::fill_index_ranges on the CPU backend: two runs of consecutive indices per row, at its offset, and
// nothing else written; a row that would write past the array is an error.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(FillIndexRanges, WritesTwoRunsPerRowAndNothingElse) {
    auto be = create_backend("cpu", 1);
    Tensor dst(DType::kI32, Shape{12}), runs(DType::kI32, Shape{3, 5});
    for (int64_t i = 0; i < 12; ++i) dst.view().as<int32_t>()[i] = -1;
    const std::vector<int32_t> r = {0, 10, 3, 50, 2,   // 10 11 12 50 51
                                    5, 7, 0, 0, 0,     // empty
                                    7, 100, 1, 20, 3};  // 100 20 21 22, then two slots left alone
    std::copy(r.begin(), r.end(), runs.view().as<int32_t>());
    be->fill_index_ranges(dst, runs);
    const std::vector<int32_t> got(dst.view().as<int32_t>(), dst.view().as<int32_t>() + 12);
    EXPECT_EQ(got, (std::vector<int32_t>{10, 11, 12, 50, 51, -1, -1, 100, 20, 21, 22, -1}));

    runs.view().as<int32_t>()[14] = 5;  // the last row now ends past the array (7 + 1 + 5 > 12)
    EXPECT_THROW(be->fill_index_ranges(dst, runs), Error);
}

}  // namespace
}  // namespace deepinfer
