// Backend::fill_index_ranges and fill_row_addresses on the CPU backend: runs of consecutive indices (equally
// spaced addresses) at their offsets, nothing else written; a run that would write past the array is an error.
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

TEST(FillRowAddresses, WritesEquallySpacedAddressesAndNothingElse) {
    auto be = create_backend("cpu", 1);
    Tensor dst(DType::kI64, Shape{9}), runs(DType::kI64, Shape{3, 4});
    for (int64_t i = 0; i < 9; ++i) dst.view().as<int64_t>()[i] = -1;
    const int64_t big = int64_t{1} << 40;                // addresses above 2^32 keep their high bits
    const std::vector<int64_t> r = {0, 4096, 3, 512,     // 4096 4608 5120
                                    3, 77,   0, 16,      // empty
                                    5, big,  3, -2048};  // big, big - 2048, big - 4096, then one slot left alone
    std::copy(r.begin(), r.end(), runs.view().as<int64_t>());
    be->fill_row_addresses(dst, runs);
    const std::vector<int64_t> got(dst.view().as<int64_t>(), dst.view().as<int64_t>() + 9);
    EXPECT_EQ(got, (std::vector<int64_t>{4096, 4608, 5120, -1, -1, big, big - 2048, big - 4096, -1}));

    runs.view().as<int64_t>()[10] = 5;  // the last run now ends past the array (5 + 5 > 9)
    EXPECT_THROW(be->fill_row_addresses(dst, runs), Error);
}

}  // namespace
}  // namespace deepinfer
