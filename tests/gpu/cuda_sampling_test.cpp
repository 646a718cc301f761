// Backend::argmax_rows and sample_rows on the GPU against the CPU backend. argmax_rows: the same ids, bitwise.
// sample_rows (sample_token's rules, the same Philox draws): the same token for every row, over vocabularies up
// to DeepSeek-V4's 129,280, every filter alone and combined, ties, -0, masked and NaN logits, rows the kernel
// compacts (few tokens near the top) and rows it does not. The kernel's exp() and sums round differently from the host's, so a draw within
// rounding of a token boundary could differ; over these rows that has probability ~1e-4, and any mismatch fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

using Row = Backend::SampleRow;

// Logits of one row: kind 0 continuous (scaled normal), 1 few distinct values (ties), 2 peaked like a trained
// model (one large logit, a long low tail), 3 signed zeros and small integers; about 1 in 20 masked (-inf) and
// 1 in 200 NaN, never at index 0.
void fill_row(float* row, int64_t vocab, int kind, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < vocab; ++i) {
        switch (kind) {
            case 0: row[i] = 3.0f * normal(rng); break;
            case 1: row[i] = static_cast<float>(rng() % 8); break;
            case 2: row[i] = i % 997 == 5 ? 20.0f + normal(rng) : normal(rng) - 5.0f; break;
            default: row[i] = rng() % 3 == 0 ? (rng() % 2 ? 0.0f : -0.0f) : static_cast<float>(rng() % 3); break;
        }
        const unsigned u = rng() % 1000;
        if (i > 0 && u < 50) row[i] = -inf;
        if (i > 0 && u >= 50 && u < 55) row[i] = std::numeric_limits<float>::quiet_NaN();
    }
}

std::vector<int32_t> sample_on(Backend& be, const Tensor& host_logits, const std::vector<Row>& rows) {
    const int64_t n = host_logits.dim(0);
    Tensor logits = to_backend(be, host_logits), ids = be.alloc(DType::kI32, Shape{n});
    be.sample_rows(ids, logits, rows);
    std::vector<int32_t> out(static_cast<size_t>(n));
    be.download(out.data(), ids);
    return out;
}

// A generator with a fresh seed, printed so that a failure can be replayed.
std::mt19937 seeded_rng() {
    const unsigned seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    return std::mt19937(seed);
}

// Backend::argmax_rows: the same ids as the CPU (ties to the lower index, NaN skipped, -1 for a NaN first logit
// or an all-masked row), over vocabularies from 1 to DeepSeek-V4's 129,280.
TEST(CudaArgmax, MatchesTheCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto cpu = create_backend("cpu", 0);
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng = seeded_rng();
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (const auto& [rows, vocab] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 7}, {33, 8192}, {5, 129280}}) {
        Tensor logits = Tensor::f32(Shape{rows, vocab});
        for (int64_t i = 0; i < logits.numel(); ++i) {
            const unsigned u = rng() % 1000;
            logits.f32()[i] = u < 5 ? nan : u < 100 ? -inf : static_cast<float>(rng() % 64);  // ties
        }
        if (rows > 3) {
            logits.f32()[2 * vocab] = nan;  // row 2: NaN first
            std::fill(logits.f32() + 3 * vocab, logits.f32() + 4 * vocab, -inf);  // row 3: all masked
        }
        Tensor want(DType::kI32, Shape{rows});
        cpu->argmax_rows(want, logits);
        Tensor ids = gpu->alloc(DType::kI32, Shape{rows}), logits_d = to_backend(*gpu, logits);
        gpu->argmax_rows(ids, logits_d);
        std::vector<int32_t> got(rows);
        gpu->download(got.data(), ids);
        for (int64_t r = 0; r < rows; ++r)
            EXPECT_EQ(got[r], want.view().as<int32_t>()[r]) << "row " << r << " vocab " << vocab;
    }
}

TEST(CudaSampling, MatchesTheCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto cpu = create_backend("cpu", 0);
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng = seeded_rng();
    const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
    const int top_ks[] = {0, 1, 3, 40, 1 << 20};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-3f};
    const float min_ps[] = {0.0f, 0.1f, 1.0f};
    for (const int64_t vocab : {7, 1000, 129280}) {
        const int64_t n = vocab == 129280 ? 96 : 240;
        Tensor logits = Tensor::f32(Shape{n, vocab});
        std::vector<Row> rows(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) {
            fill_row(logits.f32() + r * vocab, vocab, static_cast<int>(r % 4), rng);
            Row& o = rows[static_cast<size_t>(r)];
            o.temperature = temps[1 + rng() % 3];  // greedy rows below
            o.top_k = top_ks[rng() % 5];
            o.top_p = top_ps[rng() % 4];
            o.min_p = min_ps[rng() % 3];
            o.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
            o.token_index = rng() % 5000;
        }
        rows[0].temperature = 0.0f;                                  // greedy
        rows[1] = Row{1.0f, 0, 1.0f, 0.0f, 7, 0};                    // plain temperature
        logits.f32()[2 * vocab] = std::numeric_limits<float>::quiet_NaN();  // NaN first: -1
        std::fill(logits.f32() + 3 * vocab, logits.f32() + 4 * vocab, -std::numeric_limits<float>::infinity());
        const std::vector<int32_t> want = sample_on(*cpu, logits, rows), got = sample_on(*gpu, logits, rows);
        EXPECT_EQ(want[2], -1);
        EXPECT_EQ(want[3], -1);
        for (int64_t r = 0; r < n; ++r) {
            const Row& o = rows[static_cast<size_t>(r)];
            EXPECT_EQ(got[r], want[r]) << "vocab " << vocab << " row " << r << " (kind " << r % 4 << ") T "
                                       << o.temperature << " top_k " << o.top_k << " top_p " << o.top_p << " min_p "
                                       << o.min_p << " seed " << o.seed << " index " << o.token_index;
        }
    }
}

// A row's token depends only on its logits, options and token index: alone or among others, and again.
TEST(CudaSampling, RowsAreIndependentAndRepeatable) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng(11);
    const int64_t vocab = 129280, n = 16;
    Tensor logits = Tensor::f32(Shape{n, vocab});
    std::vector<Row> rows(n);
    for (int64_t r = 0; r < n; ++r) {
        fill_row(logits.f32() + r * vocab, vocab, 2, rng);
        rows[r] = Row{0.8f, static_cast<int32_t>(r % 3 == 0 ? 0 : 50), r % 2 ? 0.9f : 1.0f, 0.0f, 1234, 77};
    }
    const std::vector<int32_t> all = sample_on(*gpu, logits, rows);
    EXPECT_EQ(sample_on(*gpu, logits, rows), all);
    for (int64_t r = 0; r < n; r += 5) {
        Tensor one = Tensor::f32(Shape{1, vocab});
        std::copy(logits.f32() + r * vocab, logits.f32() + (r + 1) * vocab, one.f32());
        EXPECT_EQ(sample_on(*gpu, one, {rows[r]})[0], all[r]) << "row " << r;
    }
}

// Not a benchmark: prints the time of one call (the step benchmark measures decode), so a slow kernel shows.
TEST(CudaSampling, PrintsItsTime) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng(5);
    const int64_t vocab = 129280;
    for (const int64_t n : {1, 128}) {
        Tensor logits = Tensor::f32(Shape{n, vocab});
        for (int64_t r = 0; r < n; ++r) fill_row(logits.f32() + r * vocab, vocab, 2, rng);
        const std::vector<Row> rows(static_cast<size_t>(n), Row{0.7f, 0, 0.9f, 0.0f, 3, 0});
        Tensor d = to_backend(*gpu, logits), ids = gpu->alloc(DType::kI32, Shape{n});
        gpu->sample_rows(ids, d, rows);
        gpu->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 5; ++i) gpu->sample_rows(ids, d, rows);
        gpu->synchronize();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 5;
        std::printf("sample_rows: %lld rows of %lld logits (top_p 0.9): %.1f us a call\n", static_cast<long long>(n),
                    static_cast<long long>(vocab), us);
    }
}

}  // namespace
}  // namespace deepinfer
