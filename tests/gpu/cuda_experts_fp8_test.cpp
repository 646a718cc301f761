// The FP8 routed experts (backend/cuda/experts_fp8.cu) against the CPU backend on the same FP4 weights, one product
// at a time: the kernels' SwiGLU output h (before its quantization) against swiglu(W1 q(x), W3 q(x)) on the CPU, and
// their output against W2 q(h) on the CPU from the kernels' own h, q() fake_quantize's kFp8Ue8m0 over 128 columns
// (the kernels' quantizer is that recipe bit for bit). Each product multiplies exact e4m3 values (the weights' FP4
// values re-expressed exactly, the same activation codes), so what differs is the summation: a 128-k block summed by
// the FP8 wgmma, which keeps fewer bits than f32, then promoted in f32. That error scales with the sum of the terms'
// magnitudes, not with the result: a gate of 5 summed from 512 terms of ~10 has it ~20 times its own size. So h is
// held element by element to kSumBound = 2^-10 of that sum (|W1| |q(x)| and |W3| |q(x)| on the CPU) times SwiGLU's
// slopes there, and each run's output to kProductBound = 2e-3 of its norm (no clamp after it); the tests print the
// worst they see. A wrong k order, swizzle, scale, row or tile is off by the whole term sum or more.
//
// Why not the whole op against the CPU's: the two h differ by f32 noise, and the codes of h that sit next to a
// rounding boundary flip between them, each moving its row by an e4m3 step (1/16 to 1/8) of that term. SwiGLU's clamp
// makes that systematic: a clamped h = silu(10) 10 = 99.95 is code 399.8 at scale 1/4, next to the midpoint 400 of
// 384 and 416, so noise of 1e-4 moves the whole output by ~5% (measured on the CPU alone). The backend-level checks
// therefore compare with the kernels run directly (bitwise); the throughput case holds the whole op to the default
// sequence on the same GPU, without the clamp, at kWholeOpBound = 5e-2 (seen: 2e-2; flips alone, without the clamp,
// reach a few percent: each code near a boundary is 1/16 to 1/8 of its element).
//
// Run patterns cover empty runs, 1-row runs, every wgmma width the last tile of a run takes, a run of 700 rows,
// D = 512 / I = 256 and the model width D = 4096 / I = 2048, SwiGLU with and without its clamp, rows read and written
// by address, and weights whose scales span too many binades (the backend keeps them off the kernels). A throughput
// case (256 experts x 384 rows at the model width) times the kernels against the bf16 wgmma kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/experts_fp8.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"
#include "support/scoped_env.h"

namespace deepinfer {
namespace {

using testing_support::make_weight;
using testing_support::rel_error;
using testing_support::swiglu;

constexpr double kProductBound = 2e-3;
constexpr double kSumBound = 1.0 / 1024;
constexpr double kWholeOpBound = 5e-2;
constexpr int kBlock = 128;

class CudaExpertsFp8 : public testing_support::CudaCompare {
public:
    CudaExpertsFp8() : CudaCompare("auto") {}

protected:
    using Ffns = testing_support::ExpertFfns;
    Ffns make_ffns(int64_t e, int64_t d, int64_t inter) {
        Ffns f;
        for (int64_t i = 0; i < e; ++i) {
            f.hw.push_back(make_weight(rng_, 4, inter, d));
            f.hw.push_back(make_weight(rng_, 4, inter, d));
            f.hw.push_back(make_weight(rng_, 4, d, inter));
        }
        f.place(*gpu_, &storage_);
        return f;
    }
    // The backend's grouped_experts over a device copy of x, with FP8 activations.
    std::vector<float> run_backend(const Ffns& f, const std::vector<float>& x, const std::vector<int64_t>& counts,
                                   float limit) {
        const int64_t d = f.d(), rows = static_cast<int64_t>(x.size()) / d;
        Tensor xd = gpu_->alloc(DType::kF32, Shape{rows, d});
        gpu_->upload(xd, x.data());
        gpu_->grouped_experts(xd, counts, f.d1, f.d3, f.d2, limit, kBlock);
        std::vector<float> got(rows * d);
        gpu_->download(got.data(), xd);
        gpu_->synchronize();
        return got;
    }
    // The kernels run directly over a device copy of x: the output, and h into *h.
    std::vector<float> run_kernels(const Ffns& f, const std::vector<float>& x, const std::vector<int64_t>& counts,
                                   float limit, std::vector<float>* h) {
        const int64_t d = f.d(), rows = static_cast<int64_t>(x.size()) / d;
        Tensor xd = gpu_->alloc(DType::kF32, Shape{rows, d}), hd = gpu_->alloc(DType::kF32, Shape{rows, f.inter()});
        gpu_->upload(xd, x.data());
        gpu_->synchronize();  // the backend's stream is non-blocking: the upload lands before the default stream runs
        cuda::run_grouped_experts_fp8_sync(xd.f32(), testing_support::run_starts(counts), f.d1, f.d3, f.d2, limit,
                                           hd.f32());
        std::vector<float> got(rows * d);
        gpu_->download(got.data(), xd);
        if (h) {
            h->resize(rows * f.inter());
            gpu_->download(h->data(), hd);
        }
        gpu_->synchronize();
        return got;
    }
    // The largest change of swiglu(g, u) per unit change of g and of u within band_g and band_u of (g, u): SiLU's slope
    // (at most 1.1) times |u| and |SiLU(g)|; 0 only where the whole band lies past a clamp (a g just over the clamp on
    // one side may be just under it on the other).
    static void swiglu_slopes(float g, float u, float limit, double band_g, double band_u, double* dg, double* du) {
        const double gc = limit > 0 ? std::fmin(g, limit) : g;
        const double uc = limit > 0 ? std::fmin(std::fmax(u, -limit), limit) : u;
        const double sig = 1.0 / (1.0 + std::exp(-gc));
        *dg = (limit > 0 && g - band_g > limit ? 0.0 : 1.1) * std::fabs(uc);
        *du = (limit > 0 && std::fabs(u) - band_u > limit ? 0.0 : 1.0) * std::fabs(gc * sig);
    }
    // Copies of FP4 weights with every code's sign cleared: |W|.
    std::vector<LinearWeight> magnitudes(const std::vector<LinearWeight>& ws) {
        std::vector<LinearWeight> out;
        for (const LinearWeight& w : ws) {
            abs_store_.emplace_back(static_cast<const uint8_t*>(w.data.data()),
                                    static_cast<const uint8_t*>(w.data.data()) + w.rows * w.cols / 2);
            for (uint8_t& b : abs_store_.back()) b &= 0x77;
            LinearWeight a = w;
            a.data = TensorView(abs_store_.back().data(), w.data.dtype(), w.data.shape());
            out.push_back(a);
        }
        return out;
    }
    std::deque<std::vector<uint8_t>> abs_store_;
    // Each product of each run against the CPU (see the header).
    void check(const Ffns& f, const std::vector<int64_t>& counts, float limit) {
        const int64_t d = f.d(), inter = f.inter();
        int64_t rows = 0;
        for (int64_t n : counts) rows += n;
        const std::vector<float> x = randn(rows * d);
        std::vector<float> h;
        const std::vector<float> got = run_kernels(f, x, counts, limit, &h);
        std::string pattern;
        for (int64_t n : counts) pattern += std::to_string(n) + " ";
        const std::string what = "D " + std::to_string(d) + ", I " + std::to_string(inter) + ", limit " +
                                 std::to_string(limit) + ", runs [ " + pattern + "]";
        const std::vector<LinearWeight> a1 = magnitudes(f.h1), a3 = magnitudes(f.h3);
        double worst_h = 0, worst_out = 0;
        int64_t r0 = 0;
        for (size_t e = 0; e < counts.size(); ++e) {
            const int64_t n = counts[e];
            if (n > 0) {
                Tensor xq = host(std::vector<float>(x.begin() + r0 * d, x.begin() + (r0 + n) * d), Shape{n, d});
                cpu_->fake_quantize(xq, QuantSim::kFp8Ue8m0, kBlock);
                Tensor g = Tensor::f32(Shape{n, inter}), u = Tensor::f32(Shape{n, inter});
                cpu_->linear(g, xq, f.h1[e]);
                cpu_->linear(u, xq, f.h3[e]);
                Tensor xa = host(values(xq), Shape{n, d}), ga = Tensor::f32(Shape{n, inter}),
                       ua = Tensor::f32(Shape{n, inter});
                for (float& v : std::span<float>(xa.f32(), n * d)) v = std::fabs(v);
                cpu_->linear(ga, xa, a1[e]);
                cpu_->linear(ua, xa, a3[e]);
                const std::vector<float> got_h(h.begin() + r0 * inter, h.begin() + (r0 + n) * inter);
                double eh = 0;  // the largest error of h as a fraction of its bound
                for (int64_t i = 0; i < n * inter; ++i) {
                    double dg, du;
                    swiglu_slopes(g.f32()[i], u.f32()[i], limit, kSumBound * ga.f32()[i], kSumBound * ua.f32()[i], &dg,
                                  &du);
                    const float want = swiglu(g.f32()[i], u.f32()[i], limit);
                    // + the f32 rounding of SwiGLU itself (expf differs by an ulp or two between the two)
                    const double bound =
                        kSumBound * (dg * ga.f32()[i] + du * ua.f32()[i]) + 4e-6 * std::fabs(want) + 1e-30;
                    eh = std::max(eh, std::fabs(got_h[i] - want) / bound);
                }
                Tensor hq = host(got_h, Shape{n, inter}), out = Tensor::f32(Shape{n, d});
                cpu_->fake_quantize(hq, QuantSim::kFp8Ue8m0, kBlock);
                cpu_->linear(out, hq, f.h2[e]);
                const std::vector<float> got_out(got.begin() + r0 * d, got.begin() + (r0 + n) * d);
                const double eo = rel_error(got_out, values(out));
                worst_h = std::max(worst_h, eh), worst_out = std::max(worst_out, eo);
                EXPECT_LE(eh, 1.0) << what << ": expert " << e << "'s h, in units of its bound";
                EXPECT_LE(eo, kProductBound) << what << ": expert " << e << "'s output from its h";
            }
            r0 += n;
        }
        std::printf("  %s: h within %.3f of its bound, output within %.2e\n", what.c_str(), worst_h, worst_out);
    }
};

// D = 512, I = 256: uneven runs with empty ones, 1-row runs, tails of every wgmma width (16: 1, 2, 3, 7, 12; 32: 17,
// 20; 64: 33, 40, 44; 128: 65, 127, 130), exact tiles, one run of 700 rows; both SwiGLU modes.
TEST_F(CudaExpertsFp8, SmallWidthMatchesCpu) {
    const Ffns f = make_ffns(12, 512, 256);
    ASSERT_TRUE(cuda::experts_fp8_shapes_ok(f.d1, f.d3, f.d2));
    const std::vector<std::vector<int64_t>> cases = {{0, 300, 1, 0, 7, 12, 40, 3, 0, 130, 2, 20},
                                                     {17, 33, 65, 127, 16, 32, 64, 128, 0, 0, 1, 256},
                                                     {0, 0, 0, 0, 0, 700, 0, 0, 0, 0, 0, 0}};
    for (float limit : {0.0f, 10.0f})
        for (const std::vector<int64_t>& counts : cases) check(f, counts, limit);
}

// The model width, D = 4096 and I = 2048 (32 and 16 k stages), a few experts.
TEST_F(CudaExpertsFp8, ModelWidthMatchesCpu) {
    const Ffns f = make_ffns(3, 4096, 2048);
    check(f, {200, 0, 1}, 10.0f);
    check(f, {0, 129, 64}, 0.0f);
}

// B by bulk tensor copies (the default) and by the producer threads' cp.async copies
// (DEEPINFER_CUDA_FP8_EXPERTS_TMA=0) put the same codes in every row a tile's valid columns read: bitwise the same
// outputs and h, for runs that end in tiles of every width and a last tile reaching past R.
TEST_F(CudaExpertsFp8, BulkTensorCopiesMatchTheCopyLoop) {
    for (const int64_t d : {512, 4096}) {
        const int64_t inter = d / 2;
        const Ffns f = make_ffns(6, d, inter);
        const std::vector<int64_t> counts = {300, 1, 0, 17, 130, 45};
        int64_t rows = 0;
        for (int64_t n : counts) rows += n;
        const std::vector<float> x = randn(rows * d);
        std::vector<float> h_tma, h_loop, loop;
        const std::vector<float> tma = run_kernels(f, x, counts, 10.0f, &h_tma);
        {
            const testing_support::ScopedEnv off("DEEPINFER_CUDA_FP8_EXPERTS_TMA", "0");
            loop = run_kernels(f, x, counts, 10.0f, &h_loop);
        }
        ASSERT_EQ(tma.size(), loop.size());
        ASSERT_EQ(h_tma.size(), h_loop.size());
        EXPECT_EQ(0, std::memcmp(tma.data(), loop.data(), tma.size() * 4)) << "D " << d << ": outputs";
        EXPECT_EQ(0, std::memcmp(h_tma.data(), h_loop.data(), h_tma.size() * 4)) << "D " << d << ": h";
    }
}

// The backend takes the kernels with FP8 activations: its grouped_experts is bitwise the kernels run directly.
TEST_F(CudaExpertsFp8, BackendTakesTheKernels) {
    const Ffns f = make_ffns(6, 512, 256);
    const std::vector<int64_t> counts = {300, 1, 0, 130, 700, 45};
    int64_t rows = 0;
    for (int64_t n : counts) rows += n;
    const std::vector<float> x = randn(rows * 512);
    const std::vector<float> got = run_backend(f, x, counts, 10.0f);
    const std::vector<float> direct = run_kernels(f, x, counts, 10.0f, nullptr);
    EXPECT_EQ(0, std::memcmp(got.data(), direct.data(), got.size() * 4)) << "the backend's against the kernels'";
}

// grouped_experts_rows reads each slot's token row and writes its output row by address: bitwise the in-place
// result on the gathered rows; the token rows are left as they are.
TEST_F(CudaExpertsFp8, RowsByAddressMatchInPlace) {
    const int64_t d = 512, tokens = 70;
    const Ffns f = make_ffns(5, d, 256);
    const std::vector<int64_t> counts = {40, 0, 130, 1, 9};
    const std::vector<float> x = randn(tokens * d);
    testing_support::SlotRows slots(rng_, counts, x, tokens, d);
    const std::vector<float> in_place = run_backend(f, slots.gathered, counts, 10.0f);
    slots.place(*gpu_, x);
    gpu_->grouped_experts_rows(slots.out_ptrs, slots.in_ptrs, d, counts, f.d1, f.d3, f.d2, 10.0f, kBlock);
    std::vector<float> got(slots.rows * d), x_after(tokens * d);
    gpu_->download(got.data(), slots.out);
    gpu_->download(x_after.data(), slots.x);
    gpu_->synchronize();
    const int64_t mismatched = slots.mismatched(got, in_place);
    EXPECT_EQ(mismatched, 0) << "slots whose output differs from the in-place result";
    EXPECT_EQ(0, std::memcmp(x_after.data(), x.data(), x.size() * 4)) << "the token rows changed";
}

// experts_fp8_prepare: each row's largest E8M0 byte, and whether every row spans at most 14 binades. A row with
// scales 2^-27 and 2^0 (27 binades) or a NaN scale (255) keeps the experts off the kernels; the backend then takes
// the default sequence, which matches the CPU closely.
TEST_F(CudaExpertsFp8, RowsSpanningTooManyBinadesKeepTheDefaultPath) {
    const int64_t e = 2, d = 256, inter = 128;
    Ffns f = make_ffns(e, d, inter);
    const auto prepare = [&](const Ffns& g, std::vector<uint8_t>* tops) {
        const int64_t bytes = cuda::experts_fp8_row_bytes(static_cast<int>(e), d, inter);
        Tensor row_max = gpu_->alloc(DType::kI32, Shape{(bytes + 3) / 4});
        gpu_->synchronize();
        const bool ok = cuda::experts_fp8_prepare(g.d1, g.d3, g.d2, static_cast<uint8_t*>(row_max.view().data()));
        std::vector<uint8_t> all((bytes + 3) / 4 * 4);
        gpu_->download(all.data(), row_max);
        gpu_->synchronize();
        if (tops) tops->assign(all.begin(), all.begin() + bytes);
        return ok;
    };
    std::vector<uint8_t> tops;
    ASSERT_TRUE(prepare(f, &tops));
    // Order: w1's rows expert by expert, then w3's, then w2's.
    int64_t at = 0;
    for (int which = 0; which < 3; ++which)
        for (int64_t x = 0; x < e; ++x) {
            const testing_support::HostWeight& w = f.hw[3 * x + which];
            const int64_t rows = w.w.rows, groups = w.w.cols / 32;
            for (int64_t r = 0; r < rows; ++r, ++at) {
                const uint8_t top = *std::max_element(w.scale.begin() + r * groups, w.scale.begin() + (r + 1) * groups);
                ASSERT_EQ(tops[at], top) << "matrix " << which << " of expert " << x << ", row " << r;
            }
        }

    for (uint8_t bad : {uint8_t{100}, uint8_t{255}}) {
        Ffns g = make_ffns(e, d, inter);
        g.hw[4].scale[5 * (inter / 32) + 2] = bad;  // expert 1's w3, row 5
        g.h1.clear(), g.h3.clear(), g.h2.clear(), g.d1.clear(), g.d3.clear(), g.d2.clear();
        g.place(*gpu_, &storage_);
        EXPECT_FALSE(prepare(g, nullptr)) << "scale byte " << int{bad};
        if (bad == 100) {  // the default sequence (a warning says so): the CPU's sums, in another order
            const std::vector<float> x = randn(14 * d);
            Tensor ref = host(x, Shape{14, d});
            cpu_->grouped_experts(ref, {5, 9}, g.h1, g.h3, g.h2, 10.0f, kBlock);
            EXPECT_LE(rel_error(run_backend(g, x, {5, 9}, 10.0f), values(ref)), 1e-4);
        }
    }
}

// Prefill's shape: 16,384 tokens x top-6 over 256 experts (384 rows each) at D = 4096, I = 2048. Times the FP8 kernels
// (grouped_experts with FP8 activations) against the bf16 wgmma kernels (without), and holds the FP8 result to the
// default sequence with FP8 activations on the same GPU, without SwiGLU's clamp (see the header).
TEST_F(CudaExpertsFp8, PrefillThroughput) {
    std::vector<Tensor> keep;
    const PrefillExperts pe = prefill_experts(0.1f, &keep);
    const int64_t d = pe.kD, rows = pe.kRows;
    const std::vector<LinearWeight>&w1 = pe.ex.w1, &w3 = pe.ex.w3, &w2 = pe.ex.w2;
    const std::vector<float>& x = pe.x;
    const std::vector<int64_t>& counts = pe.counts;
    Tensor xd = gpu_->alloc(DType::kF32, Shape{rows, d});
    const double flop = pe.kFlop;
    const auto seconds = [](auto t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const auto time = [&](int act_block, std::vector<float>* out) {
        double best = 1e30;
        for (int it = 0; it < 4; ++it) {
            gpu_->upload(xd, x.data());
            gpu_->synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            gpu_->grouped_experts(xd, counts, w1, w3, w2, 10.0f, act_block);
            gpu_->synchronize();
            if (it > 0) best = std::min(best, seconds(t0));
        }
        if (out) {
            out->resize(rows * d);
            gpu_->download(out->data(), xd);
        }
        return best;
    };
    std::vector<float> got, want;
    double copy_loop = 0;
    {
        const testing_support::ScopedEnv off("DEEPINFER_CUDA_FP8_EXPERTS_TMA", "0");
        copy_loop = time(kBlock, nullptr);
    }
    const double fp8 = time(kBlock, &got), bf16 = time(0, nullptr);
    std::printf(
        "  FP8 experts with B by the producer threads' cp.async (DEEPINFER_CUDA_FP8_EXPERTS_TMA=0): %.2f ms "
        "(%.0f TFLOP/s)\n",
        copy_loop * 1e3, flop / copy_loop * 1e-12);
    gpu_->upload(xd, x.data());
    gpu_->grouped_experts(xd, counts, w1, w3, w2, 0.0f, kBlock);  // without the clamp (see the header)
    got.resize(rows * d);
    gpu_->download(got.data(), xd);
    gpu_->upload(xd, x.data());
    gpu_->Backend::grouped_experts(xd, counts, w1, w3, w2, 0.0f, kBlock);  // the default sequence
    want.resize(rows * d);
    gpu_->download(want.data(), xd);
    gpu_->synchronize();
    std::printf("  FP8 experts %.2f ms (%.0f TFLOP/s), bf16 wgmma experts %.2f ms (%.0f TFLOP/s): %.2fx\n", fp8 * 1e3,
                flop / fp8 * 1e-12, bf16 * 1e3, flop / bf16 * 1e-12, bf16 / fp8);
    const double err = rel_error(got, want);
    std::printf("  against the default sequence with FP8 activations: %.2e\n", err);
    EXPECT_LE(err, kWholeOpBound);
}

}  // namespace
}  // namespace deepinfer
