// Backend::indexer_select on the CPU backend (the oracle the CUDA kernel is tested against): which entries,
// in which order, ties, limits, and a brute-force check on random rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {
namespace {

// dst filled with -7 so untouched slots are visible.
std::vector<int32_t> select(Backend& be, const std::vector<float>& scores, int64_t entries,
                            const std::vector<int32_t>& starts, const std::vector<int32_t>& limits, int k,
                            int32_t base, int64_t capacity) {
    const int64_t rows = static_cast<int64_t>(limits.size());
    Tensor s = Tensor::f32(Shape{rows, entries});
    std::copy(scores.begin(), scores.end(), s.f32());
    Tensor st(DType::kI32, Shape{rows}), li(DType::kI32, Shape{rows}), dst(DType::kI32, Shape{capacity});
    std::copy(starts.begin(), starts.end(), st.view().as<int32_t>());
    std::copy(limits.begin(), limits.end(), li.view().as<int32_t>());
    std::fill(dst.view().as<int32_t>(), dst.view().as<int32_t>() + capacity, -7);
    be.indexer_select(dst, st, s, li, k, base);
    return std::vector<int32_t>(dst.view().as<int32_t>(), dst.view().as<int32_t>() + capacity);
}

TEST(IndexerSelect, TopKInEntryOrderWithTiesToTheLowerIndex) {
    auto be = create_backend("cpu", 2);
    // Row 0: top 3 of 6 = entries 1 (9), 4 (7) and the lower-indexed of the two 5s (entry 2).
    // Row 1: limit 2 <= k: both visible entries, whatever their scores. Row 2: limit 0: nothing.
    const std::vector<float> scores = {1, 9, 5, 0, 7, 5,  //
                                       3, 1, 99, 99, 99, 99,  //
                                       4, 4, 4, 4, 4, 4};
    const std::vector<int32_t> out = select(*be, scores, 6, {1, 5, 7}, {6, 2, 0}, 3, 100, 9);
    EXPECT_EQ(out, (std::vector<int32_t>{-7, 101, 102, 104, -7, 100, 101, -7, -7}));
}

TEST(IndexerSelect, AllEqualScoresKeepTheFirstEntries) {
    auto be = create_backend("cpu", 2);
    const std::vector<int32_t> out = select(*be, std::vector<float>(10, 0.5f), 10, {0}, {10}, 4, 0, 4);
    EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(IndexerSelect, MatchesBruteForceOnRandomRows) {
    auto be = create_backend("cpu", 2);
    std::mt19937 rng(5);
    const int64_t rows = 40, entries = 700;
    const int k = 64;
    std::vector<float> scores(rows * entries);
    for (float& v : scores) v = static_cast<float>(rng() % 50) * 0.25f - 3.0f;  // many ties
    std::vector<int32_t> starts, limits;
    int64_t capacity = 0;
    for (int64_t r = 0; r < rows; ++r) {
        limits.push_back(static_cast<int32_t>(r * 17 % (entries + 1)));
        starts.push_back(static_cast<int32_t>(capacity));
        capacity += std::min<int64_t>(k, limits.back());
    }
    const std::vector<int32_t> out = select(*be, scores, entries, starts, limits, k, 3, capacity);
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> order(limits[r]);
        std::iota(order.begin(), order.end(), 0);
        const float* s = scores.data() + r * entries;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
        order.resize(std::min<size_t>(order.size(), k));
        std::sort(order.begin(), order.end());
        for (size_t i = 0; i < order.size(); ++i) ASSERT_EQ(out[starts[r] + i], order[i] + 3) << "row " << r;
    }
}

}  // namespace
}  // namespace deepinfer
