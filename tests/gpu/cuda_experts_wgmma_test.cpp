// The fused wgmma routed experts (backend/cuda/experts_wgmma.cu) against the CPU backend's grouped_experts on the
// same FP4 weights, per expert run:
//  - within kBf16Bound (3e-2) of the CPU op (fp32 activations), the tolerance table's GPU bound;
//  - within kSameNumericsBound (4e-3) of the CPU fed the kernels' numerics: x rounded to bf16, W1 x and W3 x in
//    fp32, SwiGLU in fp32, h rounded to bf16, W2 h in fp32. Only the fp32 summation order differs, and the bf16
//    roundings of h that it tips: each moves its row by up to 2^-9 of that h's term, and without SwiGLU's clamp
//    h is heavy-tailed (one term can dominate a row): seen up to 1.1e-3 there. A wrong k permutation, swizzle,
//    scale, tile or fragment (each off by 1e-2 or more) cannot hide under the looser bound.
// Run patterns cover empty runs, 1-row runs, every wgmma width the last tile of a run takes (16, 32, 64, 128 and
// the sizes just past them), a run of 700 rows, D = 512 / I = 256 and the model width D = 4096 / I = 2048, SwiGLU
// with and without its clamp, FP4 group scales that take the decoder's slow path, and an x that is not 16-byte
// aligned. A throughput case (256 experts x 384 rows at the model width) times the kernels against the backend's
// grouped_experts and checks their agreement.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/experts_wgmma.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"
#include "support/scoped_env.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::kBf16Bound;
using testing_support::make_weight;
using testing_support::rel_error;
using testing_support::swiglu;

constexpr double kSameNumericsBound = 4e-3;

class CudaExpertsWgmma : public testing_support::CudaCompare {
public:
    CudaExpertsWgmma() : CudaCompare("auto") {}

protected:
    // E experts' w1, w3 [inter, d] and w2 [d, inter] in `format` (make_weight's), on the host and on the device.
    // slow_scales: about one FP4 group scale in 8 becomes 0, 1, 127 or 128 (2^-127, 2^-126, 1, 2): the ends of the
    // fast range and the slow path of the decoders (expert_linear's: below 2; the wgmma kernels': 2 and above).
    using Ffns = testing_support::ExpertFfns;
    static constexpr uint8_t kEdgeScales[4] = {0, 1, 127, 128};
    Ffns make_ffns(int format, int64_t e, int64_t d, int64_t inter, bool slow_scales = false) {
        Ffns f;
        for (int64_t i = 0; i < e; ++i) {
            f.hw.push_back(make_weight(rng_, format, inter, d));
            f.hw.push_back(make_weight(rng_, format, inter, d));
            f.hw.push_back(make_weight(rng_, format, d, inter));
        }
        for (HostWeight& h : f.hw) {
            if (slow_scales)
                for (uint8_t& s : h.scale)
                    if (rng_() % 8 == 0) s = kEdgeScales[rng_() % 4];
        }
        f.place(*gpu_, &storage_);
        return f;
    }
    // The fused kernels over a device copy of x; misaligned: x starts 4 bytes past a 16-byte boundary.
    std::vector<float> run_wgmma(const Ffns& f, const std::vector<float>& x, const std::vector<int64_t>& counts,
                                 float limit, bool misaligned = false) {
        const int64_t d = f.h1[0].cols, rows = static_cast<int64_t>(x.size()) / d;
        Tensor buf = gpu_->alloc(DType::kF32, Shape{rows * d + 4});
        const TensorView xd(buf.f32() + (misaligned ? 1 : 0), DType::kF32, Shape{rows, d});
        gpu_->upload(xd, x.data());
        gpu_->synchronize();  // the backend's stream is non-blocking: the upload must land before our stream runs
        cuda::run_grouped_experts_wgmma_sync(xd.f32(), testing_support::run_starts(counts), f.d1, f.d3, f.d2, limit);
        std::vector<float> got(rows * d);
        gpu_->download(got.data(), xd);
        return got;
    }
    // The CPU with the kernels' roundings (see the header), expert by expert.
    std::vector<float> same_numerics(const Ffns& f, const std::vector<float>& x, const std::vector<int64_t>& counts,
                                     float limit) {
        const int64_t d = f.h1[0].cols, inter = f.h1[0].rows;
        std::vector<float> out(x.size());
        int64_t r0 = 0;
        for (size_t e = 0; e < counts.size(); ++e) {
            const int64_t n = counts[e];
            if (n > 0) {
                std::vector<float> xr(x.begin() + r0 * d, x.begin() + (r0 + n) * d);
                for (float& v : xr) v = round_to_bf16(v);
                Tensor g = Tensor::f32(Shape{n, inter}), u = Tensor::f32(Shape{n, inter}), o = Tensor::f32(Shape{n, d});
                const Tensor xt = host(xr, Shape{n, d});
                cpu_->linear(g, xt, f.h1[e]);
                cpu_->linear(u, xt, f.h3[e]);
                std::vector<float> h(n * inter);
                for (int64_t i = 0; i < n * inter; ++i) h[i] = round_to_bf16(swiglu(g.f32()[i], u.f32()[i], limit));
                cpu_->linear(o, host(h, Shape{n, inter}), f.h2[e]);
                std::memcpy(out.data() + r0 * d, o.f32(), n * d * 4);
            }
            r0 += n;
        }
        return out;
    }
    void check(const Ffns& f, const std::vector<int64_t>& counts, float limit, bool misaligned = false) {
        const int64_t d = f.h1[0].cols;
        int64_t rows = 0;
        for (int64_t n : counts) rows += n;
        const std::vector<float> x = randn(rows * d);
        Tensor ref = host(x, Shape{rows, d});
        cpu_->grouped_experts(ref, counts, f.h1, f.h3, f.h2, limit);
        const std::vector<float> want = values(ref), same = same_numerics(f, x, counts, limit);
        const std::vector<float> got = run_wgmma(f, x, counts, limit, misaligned);
        std::string pattern;
        for (int64_t n : counts) pattern += std::to_string(n) + " ";
        const std::string what = "D " + std::to_string(d) + ", I " + std::to_string(f.h1[0].rows) + ", limit " +
                                 std::to_string(limit) + (misaligned ? ", misaligned x" : "") + ", runs [ " + pattern +
                                 "]";
        int64_t r0 = 0;
        for (size_t e = 0; e < counts.size(); ++e) {
            const auto run = [&](const std::vector<float>& v) {
                return std::vector<float>(v.begin() + r0 * d, v.begin() + (r0 + counts[e]) * d);
            };
            if (counts[e] > 0) {
                EXPECT_LE(rel_error(run(got), run(want)), kBf16Bound) << what << ": expert " << e;
                EXPECT_LE(rel_error(run(got), run(same)), kSameNumericsBound)
                    << what << ": expert " << e << " against the same numerics";
            }
            r0 += counts[e];
        }
    }
};

// D = 512, I = 256 (4 k stages of the gate/up product, 2 of the down one; 2 feature tiles each): uneven runs with
// empty ones, 1-row runs, tails of every wgmma width (16: 1, 2, 3, 7, 12; 32: 17, 20; 64: 33, 40, 44 (300 = 2 x 128
// + 44); 128: 65, 127, 2 + 128), exact tiles (16, 32, 64, 128, 256), and one run of 700 rows (5 x 128 + 60);
// both SwiGLU modes.
TEST_F(CudaExpertsWgmma, SmallWidthMatchesCpu) {
    const Ffns f = make_ffns(4, 12, 512, 256);
    const std::vector<std::vector<int64_t>> cases = {{0, 300, 1, 0, 7, 12, 40, 3, 0, 130, 2, 20},
                                                     {17, 33, 65, 127, 16, 32, 64, 128, 0, 0, 1, 256},
                                                     {0, 0, 0, 0, 0, 700, 0, 0, 0, 0, 0, 0},
                                                     {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
    for (float limit : {0.0f, 10.0f})
        for (const std::vector<int64_t>& counts : cases) check(f, counts, limit);
}

// Scales 2^-127 and 2^-126 in about one group in 8 (the FP4 decoder's slow path), and an x that is not 16-byte
// aligned (the down epilogue's scalar stores).
TEST_F(CudaExpertsWgmma, SlowScalesAndMisalignedX) {
    const Ffns f = make_ffns(4, 4, 512, 256, true);
    check(f, {45, 0, 130, 9}, 10.0f);
    const Ffns g = make_ffns(4, 4, 512, 256);
    check(g, {45, 0, 130, 9}, 10.0f, true);
}

// Prefill's B by bulk tensor copies (the default) and by the producer threads' cp.async (DEEPINFER_CUDA_EXPERTS_TMA=0)
// put the same values in every row a tile's valid columns read: bitwise the same outputs, for runs ending in tiles of
// every width and a last tile reaching past R, at both widths.
TEST_F(CudaExpertsWgmma, BulkTensorCopiesMatchTheCopyLoop) {
    for (const int64_t d : {512, 4096}) {
        const Ffns f = make_ffns(4, 6, d, d / 2);
        const std::vector<int64_t> counts = {300, 1, 0, 17, 130, 45};
        int64_t rows = 0;
        for (int64_t n : counts) rows += n;
        const std::vector<float> x = randn(rows * d);
        const std::vector<float> tma = run_wgmma(f, x, counts, 10.0f);
        std::vector<float> loop;
        {
            const testing_support::ScopedEnv off("DEEPINFER_CUDA_EXPERTS_TMA", "0");
            loop = run_wgmma(f, x, counts, 10.0f);
        }
        ASSERT_EQ(tma.size(), loop.size());
        EXPECT_EQ(0, std::memcmp(tma.data(), loop.data(), tma.size() * 4)) << "D " << d;
    }
}

// Prefill on 4 consumer warpgroups of one A slice each (DEEPINFER_CUDA_EXPERTS_PREFILL_WGS=4) sums every accumulator
// over the same k steps in the same order as on 2: bitwise the same outputs, with B by bulk tensor copies and by the
// copy loop, for runs ending in tiles of every width, at both widths, with and without SwiGLU's clamp.
TEST_F(CudaExpertsWgmma, FourConsumerWarpgroupsMatchTwo) {
    for (const int64_t d : {512, 4096}) {
        const Ffns f = make_ffns(4, 6, d, d / 2, d == 512);
        const std::vector<int64_t> counts = {300, 1, 0, 17, 130, 45};
        int64_t rows = 0;
        for (int64_t n : counts) rows += n;
        const std::vector<float> x = randn(rows * d);
        for (const char* tma : {"1", "0"}) {
            const testing_support::ScopedEnv copies("DEEPINFER_CUDA_EXPERTS_TMA", tma);
            for (const float limit : {10.0f, 0.0f}) {
                std::vector<float> two, four;
                {
                    const testing_support::ScopedEnv wgs("DEEPINFER_CUDA_EXPERTS_PREFILL_WGS", "2");
                    two = run_wgmma(f, x, counts, limit);
                }
                {
                    const testing_support::ScopedEnv wgs("DEEPINFER_CUDA_EXPERTS_PREFILL_WGS", "4");
                    four = run_wgmma(f, x, counts, limit);
                }
                ASSERT_EQ(two.size(), four.size());
                EXPECT_EQ(0, std::memcmp(two.data(), four.data(), two.size() * 4))
                    << "D " << d << ", TMA " << tma << ", limit " << limit;
            }
        }
    }
}

// The model width, D = 4096 and I = 2048 (32 and 16 k stages, 16 feature tiles each), a few experts.
TEST_F(CudaExpertsWgmma, ModelWidthMatchesCpu) {
    const Ffns f = make_ffns(4, 3, 4096, 2048);
    check(f, {200, 0, 1}, 10.0f);
    check(f, {0, 129, 64}, 0.0f);
}

// grouped_experts_rows: the backend's wgmma path reads each slot's token row and writes its output row by address
// (no gather and scatter passes). Bitwise what the in-place kernels give on the gathered rows, and the CPU's
// default (gather, grouped_experts, scatter) within kBf16Bound; several slots read one token row, and the output
// rows are a shuffle of the slots.
TEST_F(CudaExpertsWgmma, RowsByAddressMatchInPlace) {
    const int64_t d = 512, tokens = 70;
    const Ffns f = make_ffns(4, 5, d, 256);
    const std::vector<int64_t> counts = {40, 0, 130, 1, 9};
    const std::vector<float> x = randn(tokens * d);
    testing_support::SlotRows slots(rng_, counts, x, tokens, d);
    const int64_t rows = slots.rows;
    const std::vector<int64_t>&token_of = slots.token_of, &out_at = slots.out_at;
    const std::vector<float> in_place = run_wgmma(f, slots.gathered, counts, 10.0f);
    slots.place(*gpu_, x);
    gpu_->grouped_experts_rows(slots.out_ptrs, slots.in_ptrs, d, counts, f.d1, f.d3, f.d2, 10.0f);
    std::vector<float> got(rows * d);
    gpu_->download(got.data(), slots.out);
    gpu_->synchronize();

    Tensor out_h = Tensor::f32(Shape{rows, d});
    std::vector<float*> in_h(rows), out_hp(rows);
    for (int64_t i = 0; i < rows; ++i)
        in_h[i] = const_cast<float*>(x.data()) + token_of[i] * d, out_hp[i] = out_h.f32() + out_at[i] * d;
    cpu_->grouped_experts_rows(TensorView(out_hp.data(), DType::kI64, Shape{rows}),
                               TensorView(in_h.data(), DType::kI64, Shape{rows}), d, counts, f.h1, f.h3, f.h2, 10.0f);
    const std::vector<float> cpu = values(out_h);
    const int64_t mismatched = slots.mismatched(got, in_place);
    EXPECT_EQ(mismatched, 0) << "slots whose output differs from the in-place kernels'";
    EXPECT_LE(rel_error(got, cpu), kBf16Bound) << "against the CPU's default grouped_experts_rows";
}

// No rows: nothing runs (x is not touched).
TEST_F(CudaExpertsWgmma, NoRowsIsANoOp) {
    const Ffns f = make_ffns(4, 3, 512, 256);
    cuda::run_grouped_experts_wgmma_sync(nullptr, {0, 0, 0, 0}, f.d1, f.d3, f.d2, 10.0f);
}

// The kernels take FP4 experts with 32-wide groups, D a multiple of 256 and I of 128; nothing else.
TEST_F(CudaExpertsWgmma, AppliesOnlyToFp4Widths) {
    const Ffns fp4 = make_ffns(4, 2, 512, 256);
    EXPECT_TRUE(cuda::grouped_experts_wgmma_applies(fp4.d1, fp4.d3, fp4.d2));
    const Ffns fp8 = make_ffns(6, 2, 512, 256);  // FP8 with 128x128 E8M0 blocks
    EXPECT_FALSE(cuda::grouped_experts_wgmma_applies(fp8.d1, fp8.d3, fp8.d2));
    std::vector<LinearWeight> mixed = fp4.d2;
    mixed[1] = fp8.d2[1];
    EXPECT_FALSE(cuda::grouped_experts_wgmma_applies(fp4.d1, fp4.d3, mixed)) << "one FP8 expert among FP4 ones";
    const Ffns narrow_i = make_ffns(4, 1, 512, 192);
    EXPECT_FALSE(cuda::grouped_experts_wgmma_applies(narrow_i.d1, narrow_i.d3, narrow_i.d2)) << "I = 192";
    const Ffns narrow_d = make_ffns(4, 1, 384, 256);
    EXPECT_FALSE(cuda::grouped_experts_wgmma_applies(narrow_d.d1, narrow_d.d3, narrow_d.d2)) << "D = 384";
}

// Prefill's shape: 16,384 tokens x top-6 over 256 experts (384 rows each) at D = 4096, I = 2048. Times the fused
// kernels and the backend's grouped_experts (dequantize + cuBLAS on side streams) on the same weights, and holds
// the two (the same numerics up to the fp32 summation order) to kSameNumericsBound.
TEST_F(CudaExpertsWgmma, PrefillThroughput) {
    std::vector<Tensor> keep;
    const PrefillExperts pe = prefill_experts(1.0f, &keep);
    const int64_t e = pe.kExperts, d = pe.kD, inter = pe.kInter, per = pe.kPer, rows = pe.kRows;
    const std::vector<LinearWeight>&w1 = pe.ex.w1, &w3 = pe.ex.w3, &w2 = pe.ex.w2;
    ASSERT_TRUE(cuda::grouped_experts_wgmma_applies(w1, w3, w2));
    const std::vector<float>& x = pe.x;
    const std::vector<int64_t>& counts = pe.counts;
    std::vector<int64_t> starts{0};
    for (int64_t n : counts) starts.push_back(starts.back() + n);
    Tensor xd = gpu_->alloc(DType::kF32, Shape{rows, d});
    const double flop = pe.kFlop;
    const auto seconds = [](auto t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };

    const auto time_kernels = [&] {  // the best of 3 timed calls after a warm-up
        double best = 1e30;
        for (int it = 0; it < 4; ++it) {
            gpu_->upload(xd, x.data());
            gpu_->synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            cuda::run_grouped_experts_wgmma_sync(xd.f32(), starts, w1, w3, w2, 10.0f);
            if (it > 0) best = std::min(best, seconds(t0));
        }
        return best;
    };
    std::vector<float> got(rows * d), want(rows * d);
    double best_backend = 1e30;
    const double best_wgmma = time_kernels();
    gpu_->download(got.data(), xd);
    double best_loop = 0;  // B by the producer threads' cp.async
    {
        const testing_support::ScopedEnv off("DEEPINFER_CUDA_EXPERTS_TMA", "0");
        best_loop = time_kernels();
    }
    std::printf("grouped experts with B by cp.async (DEEPINFER_CUDA_EXPERTS_TMA=0): %.2f ms (%.0f TFLOP/s)\n",
                best_loop * 1e3, flop / best_loop / 1e12);
    for (const char* wgs : {"4", "2"}) {  // the consumer warpgroups, interleaved with the default's figure above
        const testing_support::ScopedEnv on("DEEPINFER_CUDA_EXPERTS_PREFILL_WGS", wgs);
        const double best = time_kernels();
        std::printf(
            "grouped experts on %s consumer warpgroups (DEEPINFER_CUDA_EXPERTS_PREFILL_WGS): %.2f ms (%.0f "
            "TFLOP/s)\n",
            wgs, best * 1e3, flop / best / 1e12);
    }
    {  // the same slots through routed_experts, planned on the device (prefill's tiles: bitwise the result above)
        std::vector<int32_t> ids(rows);
        for (int64_t r = 0; r < rows; ++r) ids[r] = static_cast<int32_t>(r / per);
        Tensor ids_d = gpu_->alloc(DType::kI32, Shape{rows}), out = gpu_->alloc(DType::kF32, Shape{rows, d});
        gpu_->upload(ids_d, ids.data());
        gpu_->upload(xd, x.data());
        double best = 1e30;
        for (int it = 0; it < 4; ++it) {
            gpu_->synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            gpu_->routed_experts(out, xd, ids_d, w1, w3, w2, 1, 10.0f);
            gpu_->synchronize();
            if (it > 0) best = std::min(best, seconds(t0));
        }
        std::printf("routed_experts, the plan built on the device: %.2f ms (%.0f TFLOP/s)\n", best * 1e3,
                    flop / best / 1e12);
        std::vector<float> routed(rows * d);
        gpu_->download(routed.data(), out);
        EXPECT_EQ(std::memcmp(routed.data(), got.data(), routed.size() * 4), 0) << "routed_experts against the plan";
    }
    for (int it = 0; it < 3; ++it) {
        gpu_->upload(xd, x.data());
        gpu_->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        gpu_->grouped_experts(xd, counts, w1, w3, w2, 10.0f);
        gpu_->synchronize();
        if (it > 0) best_backend = std::min(best_backend, seconds(t0));
    }
    gpu_->download(want.data(), xd);
    std::printf(
        "grouped experts, %lld rows (256 x %lld), D %lld, I %lld: wgmma %.2f ms (%.0f TFLOP/s), backend %.2f ms "
        "(%.0f TFLOP/s)\n",
        static_cast<long long>(rows), static_cast<long long>(per), static_cast<long long>(d),
        static_cast<long long>(inter), best_wgmma * 1e3, flop / best_wgmma / 1e12, best_backend * 1e3,
        flop / best_backend / 1e12);
    for (int64_t r = 0; r < e; r += 17) {
        const std::vector<float> a(got.begin() + r * per * d, got.begin() + (r + 1) * per * d);
        const std::vector<float> b(want.begin() + r * per * d, want.begin() + (r + 1) * per * d);
        EXPECT_LE(rel_error(a, b), kSameNumericsBound) << "expert " << r;
    }
    EXPECT_LE(rel_error(got, want), kSameNumericsBound) << "all experts";
}

}  // namespace
}  // namespace deepinfer
