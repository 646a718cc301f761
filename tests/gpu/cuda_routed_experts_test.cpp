// Backend::routed_experts on CUDA: decode's routed experts on the fused wgmma kernels with their plan built on the
// device (experts_wgmma.cu, "Decode"), against
//  - the CPU backend's routed_experts (fp32: expert_linear x 3 + swiglu) within kBf16Bound (3e-2), on every slot at
//    the small width and on a strided subset of up to 48 slots at the model width (each slot's result depends only
//    on its own row and expert, so the CPU runs the subset alone, a row per input);
//  - the CUDA default sequence (Backend::routed_experts in the tc mode: expert_linear on the mma.sync kernel, swiglu,
//    expert_linear) within kSameNumericsBound (4e-3). Both round x to bf16 once (nearest even), hold the FP4 weights
//    exactly in bf16, accumulate in fp32, take SwiGLU in fp32 by the same expression and round h to bf16 for the down
//    product: only the fp32 summation order differs (mma.sync's four K-quarter chains against wgmma's one chain over
//    permuted k, ~1e-6 relative), and the bf16 roundings of h that it tips, each moving an output by one bf16 ulp of
//    one of its 2048 h terms (cuda_experts_wgmma_test measured up to 1.1e-3 on the H200 for that, unclamped). A wrong
//    row, expert, k permutation or tile moves outputs by O(1);
//  - the prefill wgmma path (grouped_experts_rows with the host's plan, the slots sorted stably by expert as
//    moe_forward sorts them): bitwise equal while every expert has at most 32 slots (both plans then make the same
//    tiles, rows in the same order, the same wgmma widths), else within kSameNumericsBound (wider prefill tiles);
//    bitwise equal at any run length above kRoutedDecodeMaxSlots slots, where routed_experts plans prefill's tiles
//    on the device (and routed_experts_take_prefill says so).
// Also: every slot on one expert, ids outside [0, E) (NaN rows in exactly their slots, the other rows bitwise as
// without them), two runs bitwise equal, DEEPINFER_CUDA_DECODE_EXPERTS=linear and lists of more experts than the
// plan takes (the default sequence, bitwise), and the profile naming the path taken; the decode kernels' variants
// (DEEPINFER_CUDA_EXPERTS_DECODE_WGS x _BATCH, and B by cp.async instead of bulk tensor copies:
// DEEPINFER_CUDA_EXPERTS_TMA=0) bitwise equal, FP4 scales on the decoder's slow path included. The
// other tests run the defaults (4 consumer warpgroups, batch 4). Calls of up to kRoutedFewTokensAuto tokens (by
// default; kRoutedFewTokensMax with DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=1) take experts_few_tokens.cu's kernels where they
// apply (the same two bounds; FewTokensMatchCpuAndLinear, and 1 and 4 tokens at the model width). The backend's
// default products on the FP8 tensor cores (experts_fp8_decode.cu, DEEPINFER_CUDA_FP8_DECODE_EXPERTS) are checked
// against these by Fp8DecodeMatchesTheBf16Rings; the fixture keeps every other test on the bf16 rings. Without a
// compute capability 9.0 GPU the backend takes the default sequence and the wgmma-only checks are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/experts_wgmma.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "deepinfer/error.h"
#include "support/npy_compare.h"
#include "support/scoped_env.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::kBf16Bound;
using testing_support::rel_error;

constexpr double kSameNumericsBound = 4e-3;
constexpr int kMaxDecodeTile = 32;  // DecodeRing::kMaxN: runs up to this many slots are one decode tile

class CudaRoutedExperts : public testing_support::CudaCompare {
public:
    CudaRoutedExperts() : CudaCompare("tc") {}

protected:
    // The bf16 decode rings, which every test but Fp8DecodeMatchesTheBf16Rings checks (that one switches the FP8
    // products on itself).
    const testing_support::ScopedEnv bf16_rings_{"DEEPINFER_CUDA_FP8_DECODE_EXPERTS", "0"};
    // E experts' w1, w3 [inter, d] and w2 [d, inter], FP4 with E8M0 scales per 32, on the host and on the device.
    // The model width's 3.3 GB are drawn 8 bytes at a time (make_weight draws one byte a call).
    using Ffns = testing_support::ExpertFfns;
    // slow_scales: about one group scale in 8 becomes 0, 1, 127 or 128 (2^-127, 2^-126, 1, 2): the ends of the fast
    // range and the slow path of the FP4 decoders (expert_linear's: below 2^-125; the wgmma kernels': 2 and above).
    static constexpr uint8_t kEdgeScales[4] = {0, 1, 127, 128};
    HostWeight fp4_weight(int64_t n, int64_t k, bool slow_scales = false) {
        HostWeight h;
        h.data.resize(n * k / 2);
        h.scale.resize(n * k / 32);
        for (size_t j = 0; j < h.data.size(); j += 8) {
            const uint64_t b = bits_();
            std::memcpy(h.data.data() + j, &b, std::min<size_t>(8, h.data.size() - j));
        }
        for (size_t j = 0; j < h.scale.size(); j += 8) {
            uint64_t b = bits_();
            for (size_t i = j; i < j + 8 && i < h.scale.size(); ++i, b >>= 8)
                h.scale[i] = slow_scales && b % 64 < 8 ? kEdgeScales[b % 4] : static_cast<uint8_t>(122 + b % 8);
        }
        h.w.rows = n;
        h.w.cols = k;
        h.w.name = "routed";
        h.w.format = WeightFormat::kFp4Group;
        h.w.block_cols = 32;
        h.w.data = TensorView(h.data.data(), DType::kFP4E2M1, Shape{n, k});
        h.w.scale = TensorView(h.scale.data(), DType::kE8M0, Shape{n, k / 32});
        return h;
    }
    Ffns make_ffns(int64_t e, int64_t d, int64_t inter, bool slow_scales = false) {
        bits_.seed(rng_());
        Ffns f;
        f.hw.reserve(3 * e);
        for (int64_t i = 0; i < e; ++i) {
            f.hw.push_back(fp4_weight(inter, d, slow_scales));
            f.hw.push_back(fp4_weight(inter, d, slow_scales));
            f.hw.push_back(fp4_weight(d, inter, slow_scales));
        }
        f.place(*gpu_, &storage_);
        gpu_->synchronize();
        return f;
    }
    bool wgmma(const Ffns& f) const {
        return f.d1.size() <= static_cast<size_t>(cuda::kRoutedWgmmaMaxExperts) &&
               cuda::grouped_experts_wgmma_applies(f.d1, f.d3, f.d2);
    }
    // Whether routed_experts of `tokens` tokens takes experts_few_tokens.cu's kernels (up to kRoutedFewTokensAuto
    // tokens by default, kRoutedFewTokensMax with DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=1, none with 0; x 16-byte aligned
    // unless misaligned).
    bool few_tokens(const Ffns& f, int64_t tokens, bool misaligned = false) const {
        const char* v = std::getenv("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS");
        const std::string mode = v && *v ? v : "auto";
        const int64_t most = mode == "0" ? 0 : mode == "1" ? cuda::kRoutedFewTokensMax : cuda::kRoutedFewTokensAuto;
        return wgmma(f) && tokens <= most && !misaligned && cuda::routed_experts_few_tokens_applies(f.d(), f.inter());
    }
    Tensor i32_device(const std::vector<int32_t>& v) {
        Tensor t = gpu_->alloc(DType::kI32, Shape{static_cast<int64_t>(v.size())});
        gpu_->upload(t, v.data());
        return t;
    }
    std::vector<int32_t> routed_ids(int64_t tokens, int64_t e, int64_t k, int32_t hot = -1) {
        return testing_support::routed_ids(rng_, tokens, e, k, hot);
    }
    std::vector<int32_t> random_ids(int64_t rows, int64_t e) {
        std::vector<int32_t> ids(rows);
        for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % e);
        return ids;
    }

    // routed_experts on the device (`be`: gpu_ or another CUDA backend) over x [ids / rows_per_input, d] (host) into a
    // NaN-poisoned output; base: the default sequence instead of the backend's op; misaligned: x and out start 4
    // bytes past a 16-byte boundary.
    std::vector<float> run(Backend& be, const Ffns& f, const std::vector<float>& xh, const Tensor& ids_d,
                           int rows_per_input, float limit, bool base = false, bool misaligned = false,
                           int act_block = 0, std::vector<float>* x_after = nullptr) {
        const int64_t rows = ids_d.numel(), inputs = rows / rows_per_input;
        Tensor xm = gpu_->alloc(DType::kF32, Shape{inputs * f.d() + 4});
        Tensor om = gpu_->alloc(DType::kF32, Shape{rows * f.d() + 4});
        const int o = misaligned ? 1 : 0;
        const TensorView x(xm.f32() + o, DType::kF32, Shape{inputs, f.d()});
        const TensorView out(om.f32() + o, DType::kF32, Shape{rows, f.d()});
        const std::vector<float> nan(rows * f.d(), std::nanf(""));
        gpu_->upload(out, nan.data());
        gpu_->upload(x, xh.data());
        gpu_->synchronize();  // `be` may be another backend, on its own stream
        if (base)
            be.Backend::routed_experts(out, x, ids_d, f.d1, f.d3, f.d2, rows_per_input, limit, act_block);
        else
            be.routed_experts(out, x, ids_d, f.d1, f.d3, f.d2, rows_per_input, limit, act_block);
        be.synchronize();
        std::vector<float> got(rows * f.d());
        gpu_->download(got.data(), out);
        if (x_after) {
            x_after->resize(inputs * f.d());
            gpu_->download(x_after->data(), x);
        }
        return got;
    }
    // The prefill path on the same slots: sorted stably by expert (as moe_forward sorts them), each reading its token
    // row and writing its output row by address (grouped_experts_rows with the host's plan).
    std::vector<float> run_prefill_path(const Ffns& f, const Tensor& xd, const std::vector<int32_t>& ids,
                                        int rows_per_input, float limit) {
        const int64_t rows = static_cast<int64_t>(ids.size()), e = static_cast<int64_t>(f.d1.size());
        std::vector<int64_t> counts(e), next(e);
        for (int32_t id : ids) ++counts[id];
        for (int64_t i = 1; i < e; ++i) next[i] = next[i - 1] + counts[i - 1];
        Tensor out = poisoned(Shape{rows, f.d()});
        std::vector<const float*> in_rows(rows);
        std::vector<float*> out_rows(rows);
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t at = next[ids[i]]++;
            in_rows[at] = xd.f32() + (i / rows_per_input) * f.d();
            out_rows[at] = out.f32() + i * f.d();
        }
        Tensor in_d = gpu_->alloc(DType::kI64, Shape{rows}), out_d = gpu_->alloc(DType::kI64, Shape{rows});
        gpu_->upload(in_d, in_rows.data());
        gpu_->upload(out_d, out_rows.data());
        gpu_->grouped_experts_rows(out_d, in_d, f.d(), counts, f.d1, f.d3, f.d2, limit);
        return fetch(out);
    }
    // The CPU's routed_experts on the slots `pick` alone (a row per input), [pick.size(), d].
    std::vector<float> cpu_slots(const Ffns& f, const std::vector<float>& x, const std::vector<int32_t>& ids,
                                 int rows_per_input, const std::vector<int64_t>& pick, float limit) {
        const int64_t n = static_cast<int64_t>(pick.size());
        std::vector<float> xs(n * f.d());
        std::vector<int32_t> sub(n);
        for (int64_t i = 0; i < n; ++i) {
            std::copy_n(x.begin() + (pick[i] / rows_per_input) * f.d(), f.d(), xs.begin() + i * f.d());
            sub[i] = ids[pick[i]];
        }
        Tensor ids_h(DType::kI32, Shape{n});
        std::memcpy(ids_h.as<int32_t>(), sub.data(), n * 4);
        Tensor out = Tensor::f32(Shape{n, f.d()});
        cpu_->routed_experts(out, host(xs, Shape{n, f.d()}), ids_h, f.h1, f.h3, f.h2, 1, limit);
        return values(out);
    }
    // Rows of [rows, d] that differ bitwise (the expected count is 0: a count says more than two huge vectors).
    static int64_t rows_differing(const std::vector<float>& a, const std::vector<float>& b, int64_t d) {
        if (a.size() != b.size()) return -1;
        int64_t n = 0;
        for (size_t r = 0; r * d < a.size(); ++r) n += std::memcmp(a.data() + r * d, b.data() + r * d, d * 4) != 0;
        return n;
    }
    // [rows, d] outputs of two sums that quantize h to e4m3 as fake_quantize does and differ in fp32 summation order
    // only: a row is within kSameNumericsBound of the other unless the order's noise tipped a code of its h (or a
    // block scale) across a rounding boundary, which changes each value it touches by at most one e4m3 step (2^-3 of
    // it, hence kFp8StepBound, as the row's relative error for random weights); such rows are few (H200, model
    // width: 0-2 a call of 48 or 192 rows, a third of the calls had one), so more than kFp8TippedRows is an error.
    static constexpr double kFp8StepBound = 0.125;
    static int64_t kFp8TippedRows(int64_t rows) { return 2 + rows / 16; }
    static void expect_rows_within_fp8_tips(const std::vector<float>& got, const std::vector<float>& base, int64_t d,
                                            const std::string& what) {
        ASSERT_EQ(got.size(), base.size()) << what;
        const int64_t rows = static_cast<int64_t>(got.size()) / d;
        int64_t tipped = 0;
        for (int64_t r = 0; r < rows; ++r) {
            const double e = rel_error(got.data() + r * d, base.data() + r * d, d);
            if (!(e <= kSameNumericsBound)) ++tipped;
            EXPECT_LE(e, kFp8StepBound) << what << ", row " << r;
        }
        EXPECT_LE(tipped, kFp8TippedRows(rows)) << what << ": rows beyond " << kSameNumericsBound << " of " << rows;
    }
    static std::vector<float> rows_of(const std::vector<float>& v, const std::vector<int64_t>& pick, int64_t d) {
        std::vector<float> out;
        for (int64_t r : pick) out.insert(out.end(), v.begin() + r * d, v.begin() + (r + 1) * d);
        return out;
    }

    // DEEPINFER_CUDA_EXPERTS_DECODE_WGS and _BATCH set (null: unset, the defaults) for its lifetime, then unset.
    struct DecodeVariant {
        DecodeVariant(const char* wgs, const char* batch) {
            set("DEEPINFER_CUDA_EXPERTS_DECODE_WGS", wgs);
            set("DEEPINFER_CUDA_EXPERTS_DECODE_BATCH", batch);
        }
        ~DecodeVariant() {
            unsetenv("DEEPINFER_CUDA_EXPERTS_DECODE_WGS");
            unsetenv("DEEPINFER_CUDA_EXPERTS_DECODE_BATCH");
        }
        static void set(const char* name, const char* value) {
            if (value)
                setenv(name, value, 1);
            else
                unsetenv(name);
        }
    };
    // Every (consumer warpgroups, batch) setting of the decode kernels against the defaults, bitwise, on the slots
    // `ids` (6 per token, SwiGLU clamped).
    void expect_decode_variants_agree(const Ffns& f, const std::vector<int32_t>& ids, const std::string& what) {
        const int64_t tokens = static_cast<int64_t>(ids.size()) / 6;
        const std::vector<float> x = randn(tokens * f.d());
        const Tensor ids_d = i32_device(ids);
        std::vector<float> by_default;
        {
            const DecodeVariant defaults(nullptr, nullptr);
            by_default = run(*gpu_, f, x, ids_d, 6, 10.0f);
        }
        // Every output written (the run poisons them with NaN, which would compare equal bitwise).
        EXPECT_EQ(std::count_if(by_default.begin(), by_default.end(), [](float v) { return std::isnan(v); }), 0)
            << what << ", " << tokens << " tokens: the defaults";
        for (const char* wgs : {"2", "4"}) {
            for (const char* batch : {"1", "2", "4"}) {
                const DecodeVariant variant(wgs, batch);
                EXPECT_EQ(rows_differing(run(*gpu_, f, x, ids_d, 6, 10.0f), by_default, f.d()), 0)
                    << what << ", " << tokens << " tokens: " << wgs << " consumer warpgroups, batch " << batch;
            }
        }
        // The default ring's B by the producer threads' cp.async instead of bulk tensor copies: rows past a run are
        // zeros there and the next run's rows here, which only columns never stored read.
        const testing_support::ScopedEnv copies("DEEPINFER_CUDA_EXPERTS_TMA", "0");
        EXPECT_EQ(rows_differing(run(*gpu_, f, x, ids_d, 6, 10.0f), by_default, f.d()), 0)
            << what << ", " << tokens << " tokens: B by cp.async (DEEPINFER_CUDA_EXPERTS_TMA=0)";
    }

    // Every check above for one routing; cpu_max: the most slots the CPU recomputes (a strided subset beyond).
    void check(const Ffns& f, const std::vector<int32_t>& ids, int rows_per_input, float limit, int64_t cpu_max,
               bool misaligned = false) {
        const int64_t rows = static_cast<int64_t>(ids.size()), inputs = rows / rows_per_input;
        const std::vector<float> x = randn(inputs * f.d());
        const Tensor xd = device(host(x, Shape{inputs, f.d()})), ids_d = i32_device(ids);
        std::vector<int64_t> counts(f.d1.size());
        for (int32_t id : ids) ++counts[id];
        const int64_t widest = *std::max_element(counts.begin(), counts.end());
        const std::string what = "D " + std::to_string(f.d()) + ", I " + std::to_string(f.inter()) + ", " +
                                 std::to_string(f.d1.size()) + " experts, " + std::to_string(rows) + " slots (" +
                                 std::to_string(rows_per_input) + " per input, widest run " + std::to_string(widest) +
                                 "), limit " + std::to_string(limit) + (misaligned ? ", misaligned" : "");

        const std::vector<float> got = run(*gpu_, f, x, ids_d, rows_per_input, limit, false, misaligned);
        std::vector<int64_t> pick;
        const int64_t step = std::max<int64_t>(1, rows / cpu_max);
        for (int64_t r = rows % step / 2; r < rows && static_cast<int64_t>(pick.size()) < cpu_max; r += step)
            pick.push_back(r);
        EXPECT_LE(rel_error(rows_of(got, pick, f.d()), cpu_slots(f, x, ids, rows_per_input, pick, limit)), kBf16Bound)
            << what << ": against the CPU (" << pick.size() << " slots)";
        const std::vector<float> linear = run(*gpu_, f, x, ids_d, rows_per_input, limit, true);
        EXPECT_LE(rel_error(got, linear), kSameNumericsBound) << what << ": against expert_linear x 3";
        if (few_tokens(f, inputs, misaligned)) {  // experts_few_tokens.cu: not the prefill path's sums
            EXPECT_EQ(rows_differing(run(*gpu_, f, x, ids_d, rows_per_input, limit, false, misaligned), got, f.d()), 0)
                << what << ": a second run";
            return;
        }
        if (!wgmma(f) || inputs < cuda::kRoutedWgmmaMinTokens) return;  // expert_linear's own kernels
        EXPECT_EQ(rows_differing(run(*gpu_, f, x, ids_d, rows_per_input, limit, false, misaligned), got, f.d()), 0)
            << what << ": a second run";
        const std::vector<float> prefill = run_prefill_path(f, xd, ids, rows_per_input, limit);
        if (widest <= kMaxDecodeTile || rows > cuda::kRoutedDecodeMaxSlots)
            EXPECT_EQ(rows_differing(got, prefill, f.d()), 0) << what << ": against the prefill path";
        else
            EXPECT_LE(rel_error(got, prefill), kSameNumericsBound) << what << ": against the prefill path";
    }

    std::mt19937_64 bits_;
};

// FP8 activations (act_block 128): the fused kernels read a quantized copy of x and quantize h between their products
// (quantize_h). Against the CUDA default sequence with the same act_block (the same quantizations, fake_quantize's:
// only the fp32 summation order differs, ~1e-7 relative) row by row: within kSameNumericsBound except the rows where
// that noise tipped an e4m3 code of h (or a block's power-of-two scale) across a rounding boundary, at most
// kFp8TippedRows(rows) of them and each within kFp8StepBound; against the CPU's within kBf16Bound; x is left as it is.
// Decode's slot counts at D = 512, I = 256 and at the model width, both SwiGLU modes. (Compared as one vector instead,
// the tipped rows failed 18 of 150 seeds at the model width on the H200: a tipped code moves its row by ~1e-2, ~1e-3
// of a 48-row output, against ~5e-7 without one; 0-2 rows a call were tipped.)
TEST_F(CudaRoutedExperts, Fp8ActivationsMatchTheDefaultSequence) {
    for (const auto& [d, inter, e] : {std::tuple<int64_t, int64_t, int64_t>{512, 256, 16}, {4096, 2048, 8}}) {
        const Ffns f = make_ffns(e, d, inter);
        for (int64_t tokens : {2, 8, 32}) {
            for (float limit : {0.0f, 10.0f}) {
                const std::vector<int32_t> ids = routed_ids(tokens, e, 6);
                const std::vector<float> x = randn(tokens * d);
                const Tensor ids_d = i32_device(ids);
                std::vector<float> x_after;
                const std::vector<float> got = run(*gpu_, f, x, ids_d, 6, limit, false, false, 128, &x_after);
                const std::vector<float> base = run(*gpu_, f, x, ids_d, 6, limit, true, false, 128);
                const std::string what = "D " + std::to_string(d) + ", " + std::to_string(tokens) + " tokens, limit " +
                                         std::to_string(limit);
                expect_rows_within_fp8_tips(got, base, d, what + ": against the default sequence");
                EXPECT_EQ(std::memcmp(x_after.data(), x.data(), x.size() * 4), 0) << what << ": x changed";
                std::vector<int64_t> pick;
                for (int64_t r = 0; r < static_cast<int64_t>(ids.size()) && pick.size() < 24; r += 3) pick.push_back(r);
                const int64_t n = static_cast<int64_t>(pick.size());
                std::vector<float> xs(n * d);
                Tensor ids_h(DType::kI32, Shape{n});
                for (int64_t i = 0; i < n; ++i) {
                    std::copy_n(x.begin() + (pick[i] / 6) * d, d, xs.begin() + i * d);
                    ids_h.as<int32_t>()[i] = ids[pick[i]];
                }
                Tensor out = Tensor::f32(Shape{n, d});
                cpu_->routed_experts(out, host(xs, Shape{n, d}), ids_h, f.h1, f.h3, f.h2, 1, limit, 128);
                EXPECT_LE(rel_error(rows_of(got, pick, d), values(out)), kBf16Bound) << what << ": against the CPU";
            }
        }
    }
}

// D = 512, I = 256 (2 feature tiles of the down product, 2 of gate/up): decode's slot counts over 16 and 256 experts
// with their slots as moe_route leaves them (6 per token; 341 tokens = 2046 slots, the most moe_forward sends),
// a row per input (1 and 2048 slots), 2 per input, every slot on few experts (runs of many decode tiles), both SwiGLU
// modes, misaligned x and out. Every slot against the CPU.
TEST_F(CudaRoutedExperts, SmallWidthMatchesCpuAndLinear) {
    for (int64_t e : {16, 256}) {
        const Ffns f = make_ffns(e, 512, 256);
        for (float limit : {10.0f, 0.0f}) {
            check(f, random_ids(1, e), 1, limit, 4096);
            for (int64_t tokens : {1, 8, 32, 128, 341}) check(f, routed_ids(tokens, e, 6), 6, limit, 4096);
            check(f, random_ids(2048, e), 1, limit, 4096);
        }
        check(f, random_ids(300, 3), 2, 10.0f, 4096, true);
        check(f, routed_ids(100, e, 6, 5), 6, 10.0f, 4096, true);
    }
}

// The model width, D = 4096 and I = 2048 with 256 experts (V4-Flash's routed experts): 1, 6, 48, 192, 768 and 2046
// slots as moe_route leaves them, 2048 slots of a row per input, 2046 slots with one expert in every token's six
// (341 slots: 11 decode tiles), and 2048 slots all on one expert (64 decode tiles of one weight tile each); 1 and 4
// tokens again on the few-token kernels (DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=1).
TEST_F(CudaRoutedExperts, ModelWidthMatchesCpuAndLinear) {
    const int64_t e = 256;
    const Ffns f = make_ffns(e, 4096, 2048);
    check(f, random_ids(1, e), 1, 10.0f, 48);
    for (int64_t tokens : {1, 8, 32, 128, 341}) check(f, routed_ids(tokens, e, 6), 6, 10.0f, 48);
    check(f, random_ids(2048, e), 1, 10.0f, 48);
    check(f, routed_ids(32, e, 6), 6, 0.0f, 48);
    check(f, routed_ids(341, e, 6, 17), 6, 10.0f, 48);
    check(f, std::vector<int32_t>(2048, 200), 1, 10.0f, 48);
    const testing_support::ScopedEnv few("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", "1");  // experts_few_tokens.cu's kernels
    for (int64_t tokens : {int64_t{1}, cuda::kRoutedFewTokensMax}) check(f, routed_ids(tokens, e, 6), 6, 10.0f, 48);
}

// Ids outside [0, E) (negative, E, far past it) give NaN rows in exactly their slots, as expert_linear does; the
// other slots are bitwise what they are without the bad ones (their experts' runs hold the same slots in the same
// order; calls of up to kRoutedFewTokensMax tokens, each slot its own item: what they are with a good id in each bad
// one's place). Few and many slots, some sharing a token row with good ones, and every slot bad; prefill-sized calls
// (3,000 slots, ~2,850 good: prefill's tiles with and without the bad ones). With DEEPINFER_CUDA_FEW_TOKEN_EXPERTS at 0
// and 1.
TEST_F(CudaRoutedExperts, BadIdsGiveNaNRowsOnlyInTheirSlots) {
    for (const char* few_switch : {"0", "1"}) {
        const testing_support::ScopedEnv switch_few("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", few_switch);
        const int64_t e = 8;
        const Ffns f = make_ffns(e, 512, 256);
        const std::vector<int32_t> few = {1, 8, -1, 1, 3, INT_MIN, 7, 1000};
        const auto some_bad = [&](size_t n) {
            std::vector<int32_t> ids(n);
            for (size_t i = 0; i < n; ++i)
                ids[i] = i % 37 == 5 ? -3 : i % 41 == 7 ? 8 : static_cast<int32_t>(rng_() % e);
            return ids;
        };
        const std::vector<int32_t> many = some_bad(600), prefill_sized = some_bad(3000);
        for (const std::vector<int32_t>& ids : {few, many, prefill_sized, std::vector<int32_t>(12, -1)}) {
            for (int per_input : {1, 2}) {
                const int64_t rows = static_cast<int64_t>(ids.size()), d = f.d();
                const std::vector<float> x = randn(rows / per_input * d);
                const std::vector<float> got = run(*gpu_, f, x, i32_device(ids), per_input, 10.0f);
                std::vector<int32_t> good;
                std::vector<float> xg;
                std::vector<int64_t> good_at;
                for (int64_t r = 0; r < rows; ++r) {
                    const bool bad = ids[r] < 0 || ids[r] >= e;
                    int64_t nans = 0;
                    for (int64_t i = 0; i < d; ++i) nans += std::isnan(got[r * d + i]);
                    EXPECT_EQ(nans, bad ? d : 0)
                        << rows << " slots, " << per_input << " per input: slot " << r << ", id " << ids[r];
                    if (bad) continue;
                    good.push_back(ids[r]);
                    good_at.push_back(r);
                    xg.insert(xg.end(), x.begin() + (r / per_input) * d, x.begin() + (r / per_input + 1) * d);
                }
                if (good.empty()) continue;
                if (few_tokens(f, rows / per_input)) {  // each slot its own item: the bad ones given a good id instead
                    std::vector<int32_t> fixed = ids;
                    for (int32_t& id : fixed) id = id < 0 || id >= e ? 0 : id;
                    const std::vector<float> ref = run(*gpu_, f, x, i32_device(fixed), per_input, 10.0f);
                    EXPECT_EQ(rows_differing(rows_of(got, good_at, d), rows_of(ref, good_at, d), d), 0)
                        << rows << " slots (few tokens): the good ones against a call without bad ids";
                    continue;
                }
                // The good ones alone on the call's own path (so few of them would take the few-token kernels).
                const testing_support::ScopedEnv same_path("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", "0");
                const std::vector<float> alone = run(*gpu_, f, xg, i32_device(good), 1, 10.0f);
                EXPECT_EQ(rows_differing(rows_of(got, good_at, d), alone, d), 0)
                    << rows << " slots: the good ones against themselves alone";
            }
        }
    }
}

// Prefill-sized calls (more than kRoutedDecodeMaxSlots slots) take prefill's kernels and tiles with the plan built on
// the device: bitwise grouped_experts_rows on the host's plan (check()), within the bounds of the CPU and
// expert_linear. D 512, I 256: 16 experts with 600 tokens x 6 (runs of ~225: two 128-row tiles and a narrower one), one
// expert in every token's six (a run of 600), 2,049 slots of a row per input (the smallest such call), misaligned x and
// out, both SwiGLU modes; the model width with 256 experts and 2,048 tokens x 6 (runs of ~48: 64-wide tiles). The
// backend offers the path (routed_experts_take_prefill) only above the decode sizes and without FP8 activations.
TEST_F(CudaRoutedExperts, PrefillSizedCallsArePlannedOnTheDevice) {
    const Ffns f = make_ffns(16, 512, 256);
    if (!wgmma(f)) GTEST_SKIP() << "the wgmma experts do not apply here";
    EXPECT_TRUE(gpu_->routed_experts_take_prefill(cuda::kRoutedDecodeMaxSlots + 1, f.d1, f.d3, f.d2, 0));
    EXPECT_FALSE(gpu_->routed_experts_take_prefill(cuda::kRoutedDecodeMaxSlots, f.d1, f.d3, f.d2, 0));
    EXPECT_FALSE(gpu_->routed_experts_take_prefill(cuda::kRoutedDecodeMaxSlots + 1, f.d1, f.d3, f.d2, 128));
    for (float limit : {10.0f, 0.0f}) check(f, routed_ids(600, 16, 6), 6, limit, 4096);
    check(f, routed_ids(600, 16, 6, 5), 6, 10.0f, 4096, true);
    check(f, random_ids(cuda::kRoutedDecodeMaxSlots + 1, 16), 1, 10.0f, 4096);
    const Ffns g = make_ffns(256, 4096, 2048);
    check(g, routed_ids(2048, 256, 6), 6, 10.0f, 48);
}

// DEEPINFER_CUDA_DECODE_EXPERTS=linear runs the default sequence (bitwise Backend::routed_experts), as do expert lists
// longer than the plan kernel takes; the profile names the path each backend took; a bad value is refused.
TEST_F(CudaRoutedExperts, SwitchAndFallback) {
    const Ffns f = make_ffns(16, 512, 256);
    const std::vector<int32_t> ids = routed_ids(20, 16, 6);
    const std::vector<float> x = randn(20 * f.d());
    const Tensor ids_d = i32_device(ids);
    const std::vector<float> base = run(*gpu_, f, x, ids_d, 6, 10.0f, true);

    setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
    setenv("DEEPINFER_CUDA_DECODE_EXPERTS", "linear", 1);
    const std::unique_ptr<Backend> linear = create_backend("cuda", 2);
    setenv("DEEPINFER_CUDA_DECODE_EXPERTS", "wgmma", 1);
    const std::unique_ptr<Backend> fused = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_DECODE_EXPERTS");
    unsetenv("DEEPINFER_CUDA_PROFILE");
    linear->take_profile();
    EXPECT_EQ(rows_differing(run(*linear, f, x, ids_d, 6, 10.0f), base, f.d()), 0)
        << "DEEPINFER_CUDA_DECODE_EXPERTS=linear";
    const std::string linear_profile = linear->take_profile();
    EXPECT_NE(linear_profile.find("expert_linear"), std::string::npos) << linear_profile;
    EXPECT_EQ(linear_profile.find("routed_experts wgmma"), std::string::npos) << linear_profile;
    fused->take_profile();
    const std::vector<float> got = run(*fused, f, x, ids_d, 6, 10.0f);
    const std::string fused_profile = fused->take_profile();
    EXPECT_LE(rel_error(got, base), kSameNumericsBound);
    EXPECT_EQ(fused_profile.find("routed_experts wgmma") != std::string::npos, wgmma(f)) << fused_profile;

    // Few tokens: the fused backend takes the few-token kernels where they apply (D 512 and I 256 do) for up to
    // kRoutedFewTokensAuto tokens by default (or with DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=auto), up to kRoutedFewTokensMax
    // with 1; with 0, expert_linear at one token (bitwise the default sequence) and the wgmma kernels from
    // kRoutedWgmmaMinTokens. A bad value is refused.
    for (const char* mode : {"", "auto", "0", "1"}) {
        const testing_support::ScopedEnv set("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", mode);
        for (int64_t tokens = 1; tokens <= cuda::kRoutedFewTokensMax; ++tokens) {
            const std::vector<int32_t> few_ids = routed_ids(tokens, 16, 6);
            const std::vector<float> xt = randn(tokens * f.d());
            const Tensor few_d = i32_device(few_ids);
            const std::vector<float> few_base = run(*gpu_, f, xt, few_d, 6, 10.0f, true);
            const std::string what =
                std::string("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS='") + mode + "', " + std::to_string(tokens) + " tokens";
            fused->take_profile();
            const std::vector<float> got_few = run(*fused, f, xt, few_d, 6, 10.0f);
            const std::string profile = fused->take_profile();
            const bool few = few_tokens(f, tokens);
            EXPECT_EQ(few, wgmma(f) && tokens <= (std::string(mode) == "0"   ? 0
                                                  : std::string(mode) == "1" ? cuda::kRoutedFewTokensMax
                                                                             : cuda::kRoutedFewTokensAuto))
                << what;
            EXPECT_EQ(profile.find("routed_experts few tokens") != std::string::npos, few) << what << "\n" << profile;
            if (few || tokens >= cuda::kRoutedWgmmaMinTokens) {
                EXPECT_LE(rel_error(got_few, few_base), kSameNumericsBound) << what;
            } else {
                EXPECT_EQ(rows_differing(got_few, few_base, f.d()), 0) << what << ": expert_linear";
                EXPECT_EQ(profile.find("routed_experts wgmma"), std::string::npos) << what << "\n" << profile;
            }
        }
    }
    const std::vector<int32_t> one = routed_ids(1, 16, 6);
    const std::vector<float> x1 = randn(f.d());
    const Tensor one_d = i32_device(one);
    {
        const testing_support::ScopedEnv bad("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", "yes");
        EXPECT_THROW(run(*fused, f, x1, one_d, 6, 10.0f), Error) << "DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=yes";
    }

    setenv("DEEPINFER_CUDA_DECODE_EXPERTS", "fused", 1);
    EXPECT_THROW(create_backend("cuda", 2), Error);
    unsetenv("DEEPINFER_CUDA_DECODE_EXPERTS");

    // More experts than kRoutedWgmmaMaxExperts, at the kernels' smallest widths (D 256, I 128).
    const int64_t many = cuda::kRoutedWgmmaMaxExperts + 76;
    const Ffns g = make_ffns(many, 256, 128);
    const std::vector<int32_t> wide = random_ids(90, many);
    const std::vector<float> xw = randn(90 * g.d());
    const Tensor wide_d = i32_device(wide);
    EXPECT_EQ(rows_differing(run(*gpu_, g, xw, wide_d, 1, 10.0f), run(*gpu_, g, xw, wide_d, 1, 10.0f, true), g.d()), 0)
        << many << " experts: the default sequence";
}

// Up to kRoutedFewTokensMax tokens (experts_few_tokens.cu, each slot its own work item): check()'s bounds against the
// CPU and expert_linear for the K splits the kernels take (D 1024 / I 384: one 128-k block a warp on 8 and 3 warps;
// D 4096 / I 2048 in ModelWidthMatchesCpuAndLinear: 4 and 2 blocks a warp on 8) with FP4 scales on the decoder's
// slow path, both SwiGLU modes, a row per input and six, 1-4 tokens; two runs, and the persistent blocks against a
// block an item (DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT=0), bitwise equal; ids outside [0, E)
// give NaN rows in exactly their slots while every other slot is bitwise what it is with a good id in the bad one's
// place (a slot's result depends on its own row and expert only); a D the kernels do not take (2304: above 1024, not
// 8 warps of 2 or 4 blocks of 128) falls back, bitwise the default sequence at one token.
TEST_F(CudaRoutedExperts, FewTokensMatchCpuAndLinear) {
    const testing_support::ScopedEnv on("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", "1");
    const Ffns f = make_ffns(16, 1024, 384, true);
    if (!wgmma(f)) GTEST_SKIP() << "the wgmma experts' table does not apply here";
    ASSERT_TRUE(cuda::routed_experts_few_tokens_applies(f.d(), f.inter()));
    for (float limit : {10.0f, 0.0f}) {
        for (int64_t tokens = 1; tokens <= cuda::kRoutedFewTokensMax; ++tokens)
            check(f, routed_ids(tokens, 16, 6), 6, limit, 4096);
        check(f, random_ids(1, 16), 1, limit, 4096);
        check(f, random_ids(cuda::kRoutedFewTokensMax, 16), 1, limit, 4096);
    }
    const std::vector<float> x = randn(f.d());
    const std::vector<int32_t> ids = routed_ids(1, 16, 6);
    const Tensor ids_d = i32_device(ids);
    const std::vector<float> got = run(*gpu_, f, x, ids_d, 6, 10.0f);
    EXPECT_EQ(rows_differing(run(*gpu_, f, x, ids_d, 6, 10.0f), got, f.d()), 0) << "a second run";
    {
        const std::vector<float> x4 = randn(cuda::kRoutedFewTokensMax * f.d());
        const Tensor ids4 = i32_device(routed_ids(cuda::kRoutedFewTokensMax, 16, 6));
        const std::vector<float> persistent = run(*gpu_, f, x4, ids4, 6, 10.0f);
        const testing_support::ScopedEnv one_each("DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT", "0");
        EXPECT_EQ(rows_differing(run(*gpu_, f, x4, ids4, 6, 10.0f), persistent, f.d()), 0)
            << "a block an item (DEEPINFER_CUDA_FEW_TOKENS_PERSISTENT=0) against the persistent blocks";
    }

    std::vector<int32_t> bad = ids;
    bad[1] = -1, bad[4] = 16;
    const std::vector<float> with_bad = run(*gpu_, f, x, i32_device(bad), 6, 10.0f);
    for (int64_t r = 0; r < 6; ++r) {
        const bool is_bad = r == 1 || r == 4;
        int64_t nans = 0;
        for (int64_t i = 0; i < f.d(); ++i) nans += std::isnan(with_bad[r * f.d() + i]);
        EXPECT_EQ(nans, is_bad ? f.d() : 0) << "slot " << r << ", id " << bad[r];
        if (!is_bad) {
            EXPECT_EQ(std::memcmp(with_bad.data() + r * f.d(), got.data() + r * f.d(), f.d() * 4), 0) << "slot " << r;
        }
    }

    const Ffns g = make_ffns(4, 2304, 256);
    EXPECT_FALSE(cuda::routed_experts_few_tokens_applies(g.d(), g.inter()));
    const std::vector<float> xg = randn(g.d());
    const Tensor ids_g = i32_device(routed_ids(1, 4, 2));
    EXPECT_EQ(rows_differing(run(*gpu_, g, xg, ids_g, 2, 10.0f), run(*gpu_, g, xg, ids_g, 2, 10.0f, true), g.d()), 0)
        << "D 2304: the default sequence";
}

// The decode kernels' variants, DEEPINFER_CUDA_EXPERTS_DECODE_WGS (2 or 4 consumer warpgroups, the default 4) x
// DEEPINFER_CUDA_EXPERTS_DECODE_BATCH (1, 2 or 4 (the default) wgmma groups a batch), give bitwise the defaults'
// outputs: every accumulator sums its k steps in the same order, only which warp holds which weight rows (gate/up on 4
// warpgroups: W1 and W3 rows interleaved in a slice) and when it issues them change. At the model width with decode
// tiles of 16 (32 tokens over 256 experts) and 32 tokens (64 tokens, one expert in each token's six); other values are
// refused.
TEST_F(CudaRoutedExperts, DecodeVariantsAgreeBitwise) {
    const Ffns f = make_ffns(256, 4096, 2048);
    if (!wgmma(f)) GTEST_SKIP() << "the wgmma experts do not apply here";
    expect_decode_variants_agree(f, routed_ids(32, 256, 6), "model width");
    expect_decode_variants_agree(f, routed_ids(64, 256, 6, 17), "model width");
    const std::vector<int32_t> ids = routed_ids(8, 256, 6);
    for (const auto& [wgs, batch] :
         {std::pair<const char*, const char*>{"3", nullptr}, {"", nullptr}, {"8", "2"}, {nullptr, "3"}, {"4", "8"}}) {
        const DecodeVariant variant(wgs, batch);
        EXPECT_THROW(run(*gpu_, f, randn(8 * f.d()), i32_device(ids), 6, 10.0f), Error)
            << "DEEPINFER_CUDA_EXPERTS_DECODE_WGS '" << (wgs ? wgs : "(unset)") << "', _BATCH '"
            << (batch ? batch : "(unset)") << "'";
    }
}

// FP4 group scales at the ends of the decoder's fast range and on its slow path (about one group in 8 at 2^-127,
// 2^-126, 1 or 2; a warp holding a slow one decodes its whole stage the slow way, and which rows share a warp
// differs between the variants): the variants agree bitwise as above, and the defaults pass every check of `check` (the
// CPU, expert_linear, the prefill path). D 1024, I 384 (8 and 3 stages a tile: the down product's odd count ends on a
// lone closing stage, which no other test reaches), 16 experts: 32 tokens make runs of about 12 slots (tiles of 16,
// some of 32), 64 with one expert in every token's six a run of 64 (two tiles of 32).
TEST_F(CudaRoutedExperts, DecodeVariantsAgreeBitwiseWithSlowScales) {
    const Ffns f = make_ffns(16, 1024, 384, true);
    if (!wgmma(f)) GTEST_SKIP() << "the wgmma experts do not apply here";
    for (const std::vector<int32_t>& ids : {routed_ids(32, 16, 6), routed_ids(64, 16, 6, 5)}) {
        expect_decode_variants_agree(f, ids, "slow scales");
        check(f, ids, 6, 10.0f, 4096);
    }
}

// DEEPINFER_CUDA_FP8_DECODE_EXPERTS=1: decode's routed experts on the FP8 tensor cores with the activations split
// exactly into two e4m3 rows (experts_fp8_decode.cu). Against the bf16 decode rings on the same call within
// kSameNumericsBound (the same bf16 inputs and exact weights; the FP8 products' in-block sums and the h roundings
// their noise tips differ), against the CPU within kBf16Bound, every slot written, two runs bitwise equal, the profile
// naming the path; ids outside [0, E) give NaN rows in exactly their slots. D 1024 / I 512 (16 experts) and the model
// width (256), 2-64 tokens of six slots (runs past a 16-slot tile with one expert in every token's six), both SwiGLU
// modes. Experts it does not take keep the bf16 rings bitwise: scales spanning more than e4m3 holds exactly (slow
// scales), and an I that is not a multiple of 512. A bad switch value is refused. (The fixture holds the switch at 0,
// the bf16 rings, for the other tests; the backend's default is 1.)
TEST_F(CudaRoutedExperts, Fp8DecodeMatchesTheBf16Rings) {
    const testing_support::ScopedEnv no_few("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS", "0");
    setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
    const std::unique_ptr<Backend> profiled = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_PROFILE");
    const auto both = [&](const Ffns& f, const std::vector<int32_t>& ids, float limit, bool expect_fp8,
                          const std::string& what) {
        const int64_t tokens = static_cast<int64_t>(ids.size()) / 6;
        const std::vector<float> x = randn(tokens * f.d());
        const Tensor ids_d = i32_device(ids);
        const std::vector<float> bf16 = run(*profiled, f, x, ids_d, 6, limit);
        const testing_support::ScopedEnv on("DEEPINFER_CUDA_FP8_DECODE_EXPERTS", "1");
        profiled->take_profile();
        const std::vector<float> got = run(*profiled, f, x, ids_d, 6, limit);
        const std::string profile = profiled->take_profile();
        EXPECT_EQ(profile.find("routed_experts fp8 decode") != std::string::npos, expect_fp8) << what << "\n"
                                                                                              << profile;
        if (!expect_fp8) {
            EXPECT_EQ(rows_differing(got, bf16, f.d()), 0) << what << ": the bf16 rings";
            return;
        }
        EXPECT_EQ(std::count_if(got.begin(), got.end(), [](float v) { return std::isnan(v); }), 0) << what;
        EXPECT_LE(rel_error(got, bf16), kSameNumericsBound) << what << ": against the bf16 rings";
        EXPECT_EQ(rows_differing(run(*profiled, f, x, ids_d, 6, limit), got, f.d()), 0) << what << ": a second run";
        std::vector<int64_t> pick;
        for (int64_t r = 0; r < static_cast<int64_t>(ids.size()); r += std::max<int64_t>(1, ids.size() / 24))
            pick.push_back(r);
        EXPECT_LE(rel_error(rows_of(got, pick, f.d()), cpu_slots(f, x, ids, 6, pick, limit)), kBf16Bound)
            << what << ": against the CPU";
    };
    {
        const Ffns f = make_ffns(16, 1024, 512);
        if (!wgmma(f)) GTEST_SKIP() << "the wgmma experts do not apply here";
        for (int64_t tokens : {2, 8, 32})
            for (float limit : {0.0f, 10.0f})
                both(f, routed_ids(tokens, 16, 6), limit, true, "D 1024, " + std::to_string(tokens) + " tokens");
        both(f, routed_ids(40, 16, 6, 5), 10.0f, true, "D 1024, 40 tokens, expert 5 in each");
        // Bad ids: NaN rows in exactly their slots.
        std::vector<int32_t> ids = routed_ids(8, 16, 6);
        ids[3] = -1, ids[17] = 16, ids[40] = INT_MIN;
        const testing_support::ScopedEnv on("DEEPINFER_CUDA_FP8_DECODE_EXPERTS", "1");
        const std::vector<float> got = run(*gpu_, f, randn(8 * f.d()), i32_device(ids), 6, 10.0f);
        for (int64_t r = 0; r < static_cast<int64_t>(ids.size()); ++r) {
            int64_t nans = 0;
            for (int64_t i = 0; i < f.d(); ++i) nans += std::isnan(got[r * f.d() + i]);
            EXPECT_EQ(nans, ids[r] < 0 || ids[r] >= 16 ? f.d() : 0) << "slot " << r << ", id " << ids[r];
        }
        const testing_support::ScopedEnv bad("DEEPINFER_CUDA_FP8_DECODE_EXPERTS", "yes");
        EXPECT_THROW(run(*gpu_, f, randn(8 * f.d()), i32_device(routed_ids(8, 16, 6)), 6, 10.0f), Error);
    }
    both(make_ffns(16, 1024, 512, true), routed_ids(8, 16, 6), 10.0f, false, "slow scales");
    both(make_ffns(16, 512, 256), routed_ids(8, 16, 6), 10.0f, false, "I 256");
    const Ffns g = make_ffns(256, 4096, 2048);
    for (int64_t tokens : {4, 8, 32})
        both(g, routed_ids(tokens, 256, 6), 10.0f, true, "model width, " + std::to_string(tokens) + " tokens");
    both(g, routed_ids(64, 256, 6, 17), 10.0f, true, "model width, 64 tokens, expert 17 in each");
}

}  // namespace
}  // namespace deepinfer
