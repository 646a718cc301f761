// Backend::indexer_select on the GPU against the CPU backend: the same entries in the same slots, bitwise
// (a selection has no rounding). Scores drawn from few values force ties at the threshold; limits cover
// 0, below k, equal to k and far above it; rows far apart in the destination check `starts`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

struct Case {
    int64_t rows, entries;
    int k;
    int distinct;  // scores take this many values (0: continuous)
};

class CudaSelect : public ::testing::TestWithParam<Case> {};

TEST_P(CudaSelect, MatchesTheCpuBitwise) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const Case c = GetParam();
    auto cpu = create_backend("cpu", 0);
    auto gpu = create_backend("cuda", 2);
    const unsigned seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);

    Tensor scores = Tensor::f32(Shape{c.rows, c.entries});
    for (int64_t i = 0; i < scores.numel(); ++i) {
        scores.f32()[i] = c.distinct ? static_cast<float>(rng() % c.distinct) - 2.0f : normal(rng);
        const unsigned u = rng() % 200;  // NaN ranks as -inf and -0 equals +0 on both backends
        if (u == 0) scores.f32()[i] = std::numeric_limits<float>::quiet_NaN();
        if (u == 1) scores.f32()[i] = c.distinct ? -0.0f : scores.f32()[i];
    }
    Tensor starts(DType::kI32, Shape{c.rows}), limits(DType::kI32, Shape{c.rows});
    int64_t capacity = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
        const int64_t choice = rng() % 5;
        const int64_t limit = choice == 0 ? 0 : choice == 1 ? c.k : choice == 2 ? rng() % (c.k + 1) : c.entries - rng() % 3;
        limits.view().as<int32_t>()[r] = static_cast<int32_t>(std::clamp<int64_t>(limit, 0, c.entries));
        capacity += 5;  // a gap between rows that must stay untouched
        starts.view().as<int32_t>()[r] = static_cast<int32_t>(capacity);
        capacity += std::min<int64_t>(c.k, limits.view().as<int32_t>()[r]);
    }
    Tensor ref(DType::kI32, Shape{capacity + 1});
    std::fill(ref.view().as<int32_t>(), ref.view().as<int32_t>() + ref.numel(), -9);
    cpu->indexer_select(ref, starts, scores, limits, c.k, 11);

    Tensor dst = gpu->alloc(DType::kI32, ref.shape());
    std::vector<int32_t> fill(ref.numel(), -9);
    gpu->upload(dst, fill.data());
    Tensor s_d = to_backend(*gpu, scores), st_d = to_backend(*gpu, starts), li_d = to_backend(*gpu, limits);
    gpu->indexer_select(dst, st_d, s_d, li_d, c.k, 11);
    std::vector<int32_t> got(ref.numel());
    gpu->download(got.data(), dst);
    const int32_t* want = ref.view().as<int32_t>();
    for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_EQ(got[i], want[i]) << "slot " << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSelect,
                         ::testing::Values(Case{1, 1024, 512, 0}, Case{8, 1024, 512, 7}, Case{33, 5000, 512, 0},
                                           Case{3, 70000, 512, 3}, Case{17, 200, 16, 2}, Case{5, 600, 0, 0},
                                           Case{4, 3000, 1024, 1}, Case{2, 9, 4, 0}));

}  // namespace
}  // namespace deepinfer
