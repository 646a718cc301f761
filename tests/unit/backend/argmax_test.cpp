// Backend::argmax_rows and sample_rows on the CPU backend: the host sampler's choice (for greedy the lowest index
// on ties, NaN entries skipped) and -1 exactly where the host sampler reports an error (NaN first logit, all
// masked).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "sample/sampler.h"

namespace deepinfer {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<int32_t> argmax_rows(const std::vector<std::vector<float>>& rows) {
    auto be = create_backend("cpu", 1);
    const int64_t v = static_cast<int64_t>(rows[0].size());
    Tensor logits = Tensor::f32(Shape{static_cast<int64_t>(rows.size()), v});
    for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), logits.f32() + r * v);
    Tensor ids(DType::kI32, Shape{static_cast<int64_t>(rows.size())});
    be->argmax_rows(ids, logits);
    return std::vector<int32_t>(ids.view().as<int32_t>(), ids.view().as<int32_t>() + rows.size());
}

TEST(ArgmaxRows, TiesNanAndMaskedRows) {
    const std::vector<int32_t> ids = argmax_rows({
        {1, 5, 5, 2},           // tie: the lower index
        {-kInf, 3, kNaN, 7},    // NaN skipped
        {kNaN, 1, 2, 3},        // NaN first: the host sampler's error
        {-kInf, -kInf, -kInf, -kInf},  // all masked
        {-kInf, kNaN, -kInf, -kInf},   // masked and NaN
        {-5, -kInf, -4, -4},
    });
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, -1, -1, -1, 2}));
}

TEST(ArgmaxRows, AgreesWithTheHostSampler) {
    std::mt19937 rng(3);
    std::vector<std::vector<float>> rows(50, std::vector<float>(300));
    for (auto& row : rows)
        for (float& x : row) {
            const unsigned u = rng() % 100;
            x = u < 3 ? kNaN : u < 20 ? -kInf : static_cast<float>(rng() % 40);  // many ties
        }
    const std::vector<int32_t> ids = argmax_rows(rows);
    for (size_t r = 0; r < rows.size(); ++r) {
        int32_t host = -1;
        try {
            host = argmax(std::span<const float>(rows[r]));
        } catch (const std::exception&) {
            host = -1;
        }
        EXPECT_EQ(ids[r], host) << "row " << r;
    }
}

// sample_rows: each row the token sample_token() picks with its options and token index; -1 for the rows it
// cannot decide.
TEST(SampleRows, AgreesWithTheHostSampler) {
    auto be = create_backend("cpu", 2);
    std::mt19937 rng(4);
    const int64_t n = 40, v = 500;
    Tensor logits = Tensor::f32(Shape{n, v});
    std::vector<Backend::SampleRow> rows(n);
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < v; ++i) {
            const unsigned u = rng() % 100;
            logits.f32()[r * v + i] = i > 0 && u < 2 ? kNaN : u < 10 ? -kInf : static_cast<float>(rng() % 1000) / 100;
        }
        rows[r] = {static_cast<float>(r % 4) * 0.5f, static_cast<int32_t>(r % 3 == 0 ? 0 : 20), r % 2 ? 0.8f : 1.0f,
                   r % 5 == 0 ? 0.2f : 0.0f, static_cast<uint64_t>(r) * 7919, static_cast<uint64_t>(r % 9)};
    }
    logits.f32()[5 * v] = kNaN;
    std::fill(logits.f32() + 6 * v, logits.f32() + 7 * v, -kInf);
    Tensor ids(DType::kI32, Shape{n});
    be->sample_rows(ids, logits, rows);
    for (int64_t r = 0; r < n; ++r) {
        int32_t host = -1;
        try {
            const Backend::SampleRow& o = rows[r];
            host = sample_token(std::span<const float>(logits.f32() + r * v, v),
                                SamplingOptions{o.temperature, o.top_k, o.top_p, o.min_p, o.seed}, o.token_index);
        } catch (const std::exception&) {
            host = -1;
        }
        EXPECT_EQ(ids.view().as<int32_t>()[r], host) << "row " << r;
    }
    EXPECT_EQ(ids.view().as<int32_t>()[5], -1);
    EXPECT_EQ(ids.view().as<int32_t>()[6], -1);
}

}  // namespace
}  // namespace deepinfer
