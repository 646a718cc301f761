// The CUDA MoE ops against the CPU ops: routing (moe_route) and the routed experts' products (expert_linear).
// Expert ids must match exactly. The CUDA exp/log1p are not glibc's (a few ulps apart), so the routing weights
// are held to the fp32 bound; the logits and biases lie on coarse grids, so two experts either tie exactly (on
// both backends alike, broken toward the lower id) or differ far beyond those ulps and never swap.
//
// expert_linear has two streaming kernels, and each expert test runs on both: fp32 FMAs (DEEPINFER_CUDA_GEMM=tiled,
// fixture CudaMoe: within 1e-5 of the CPU) and the tensor cores (the bf16 modes, fixture CudaMoeTc: within the
// GPU bound 3e-2 of the CPU, and for weights exact in bf16 within 1e-4 of the CPU op on the same bf16-rounded
// activations, as cuda_gemm_tc_test.cpp holds the tensor-core GEMM). Layouts neither streams take the plain fp32
// kernel in both modes (1e-5).
//
// grouped_experts (prefill's experts over rows sorted by expert, concurrently on side streams) runs in the tiled
// mode (fixture CudaMoe, 1e-5) and the default one (fixture CudaMoeDefault: cuBLAS, the tensor-core GEMM and the
// GEMVs by row count, 3e-2), and must equal bitwise the experts run one after the other on the backend's stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "backend/cuda/experts_wgmma.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;
using testing_support::kBf16Bound;
using testing_support::kBound;
using testing_support::kSameInputsBound;


class CudaMoe : public testing_support::CudaCompare {
public:
    explicit CudaMoe(const char* gemm = "tiled") : CudaCompare(gemm), tc_(std::string(gemm) != "tiled") {}

protected:
    // Values on a grid of `step` (exact in fp32; equal values are common when the grid is coarse).
    std::vector<float> grid(int64_t n, float std, float step) {
        std::vector<float> v = randn(n, std);
        for (float& x : v) x = std::round(x / step) * step;
        return v;
    }
    Tensor i32_host(const std::vector<int32_t>& v) {
        Tensor t(DType::kI32, Shape{static_cast<int64_t>(v.size())});
        std::memcpy(t.as<int32_t>(), v.data(), v.size() * 4);
        return t;
    }
    std::vector<int32_t> fetch_i32(const Tensor& t) {
        std::vector<int32_t> v(t.numel());
        gpu_->download(v.data(), t);
        return v;
    }
    // K distinct expert ids per token, as a router picks them.
    std::vector<int32_t> distinct_ids(int64_t tokens, int64_t e, int64_t k) {
        std::vector<int32_t> ids, all(e);
        std::iota(all.begin(), all.end(), 0);
        for (int64_t t = 0; t < tokens; ++t) {
            std::shuffle(all.begin(), all.end(), rng_);
            ids.insert(ids.end(), all.begin(), all.begin() + k);
        }
        return ids;
    }

    // E fresh experts [n, kin] in `format` (see make_weight), on the host and on the device; `scales` (FP4)
    // replaces their E8M0 scale bytes, cycling through the list.
    struct Experts {
        int format = 0;
        std::vector<HostWeight> hw;
        std::vector<LinearWeight> host, dev;
    };
    Experts make_experts(int format, int64_t e, int64_t n, int64_t kin, const std::vector<uint8_t>& scales = {}) {
        Experts x;
        x.format = format;
        for (int64_t i = 0; i < e; ++i) x.hw.push_back(make_weight(rng_, format, n, kin));
        for (HostWeight& h : x.hw) {
            for (size_t j = 0; !scales.empty() && j < h.scale.size(); ++j) h.scale[j] = scales[(j + rng_()) % scales.size()];
            x.host.push_back(h.w);
            x.dev.push_back(to_backend(*gpu_, h.w, &storage_));
        }
        return x;
    }
    // The kernel that takes a layout: a streaming one when K is whole 16-byte chunks (every layout made here
    // meets the other conditions), the tensor-core one among them in the bf16 modes.
    bool on_tensor_cores(int format, int64_t kin) const {
        const int per_chunk = format == 0 ? 4 : format == 1 || format == 5 ? 8 : format == 4 ? 32 : 16;
        return tc_ && kin % per_chunk == 0;
    }
    // Weights that bf16 holds exactly: BF16, FP8 with E8M0 scales, FP4.
    static bool exact_in_bf16(int format) { return format == 1 || format == 2 || format == 4 || format == 6; }

    // K distinct ids per token of E, each token's slots ascending (as the router leaves them); with hot >= 0,
    // every token routes to expert `hot` (one expert with as many rows as tokens).
    std::vector<int32_t> routed_ids(int64_t tokens, int64_t e, int64_t k, int32_t hot = -1) {
        return testing_support::routed_ids(rng_, tokens, e, k, hot);
    }

    void check_route(int64_t rows, int64_t e, int k, ScoringFunc scoring, bool hash, float temp);
    // misaligned: the device input starts 4 bytes past a 16-byte boundary (the kernels' scalar staging).
    // x_scale multiplies the random inputs (a power of two: with extreme weight scales, finite products).
    void check_experts(const Experts& w, const std::vector<int32_t>& ids, int rows_per_input,
                       bool misaligned = false, float x_scale = 1.0f);

    // The expert tests, run by both fixtures.
    void expert_linear_matches_cpu();
    void model_shapes_and_odd_layouts();
    void decode_batches();
    void slices_and_staging();
    void extreme_fp4_scales();
    void rows_are_independent_and_bad_ids_are_nan();

    // An expert's three weights, for each of E experts: w1 and w3 [inter, d], w2 [d, inter].
    struct ExpertFfns {
        Experts w1, w3, w2;
    };
    ExpertFfns make_ffns(int format, int64_t e, int64_t d, int64_t inter) {
        return {make_experts(format, e, inter, d), make_experts(format, e, inter, d),
                make_experts(format, e, d, inter)};
    }
    // grouped_experts on the device over a fresh copy of x (the op works in place); `sequential`: the default op,
    // the experts one after the other on the backend's stream.
    std::vector<float> device_grouped(const ExpertFfns& f, const Tensor& x, const std::vector<int64_t>& counts,
                                      bool sequential) {
        Tensor xd = device(x);
        if (sequential) gpu_->Backend::grouped_experts(xd, counts, f.w1.dev, f.w3.dev, f.w2.dev, kSwigluLimit);
        else gpu_->grouped_experts(xd, counts, f.w1.dev, f.w3.dev, f.w2.dev, kSwigluLimit);
        return fetch(xd);
    }
    void check_grouped_experts(const ExpertFfns& f, const std::vector<int64_t>& counts);
    void grouped_experts_match_cpu();

    static constexpr float kSwigluLimit = 10.0f;  // clamps many of the random gates and ups

    bool tc_;  // expert_linear runs on the tensor cores where its layout streams
    bool batch_invariant_ = false;
};

class CudaMoeTc : public CudaMoe {
public:
    CudaMoeTc() : CudaMoe("tc") {}
};

class CudaMoeDefault : public CudaMoe {
public:
    CudaMoeDefault() : CudaMoe("auto") {}
};

void CudaMoe::check_route(int64_t rows, int64_t e, int k, ScoringFunc scoring, bool hash, float temp) {
    const bool ties = rng_() % 2 == 0;  // a coarse grid and no bias: many exact ties
    Tensor logits = host(grid(rows * e, 1.5f, ties ? 0.25f : 1.0f / 64), Shape{rows, e});
    Tensor bias = host(ties ? std::vector<float>(e, 0.0f) : grid(e, 0.5f, 0.25f), Shape{e});
    const int64_t vocab = 50;
    Tensor tid2eid = i32_host(distinct_ids(vocab, e, k));
    std::vector<int32_t> token_ids(rows);
    for (int32_t& t : token_ids) t = static_cast<int32_t>(rng_() % vocab);
    Tensor tokens = i32_host(token_ids);

    MoeRouting r;
    r.scoring = scoring;
    r.gate_temp = temp;
    r.k = k;
    r.routed_scaling = 2.5f;
    Tensor logits_d = device(logits), bias_d = device(bias), tid2eid_d = device(tid2eid), tokens_d = device(tokens);
    if (hash) r.tid2eid = tid2eid.as<int32_t>(), r.tokens = tokens.as<int32_t>(), r.vocab = vocab;
    else r.bias = bias.f32();
    Tensor experts(DType::kI32, Shape{rows, k}), weights(DType::kF32, Shape{rows, k});
    cpu_->moe_route(experts, weights, logits, r);

    if (hash) r.tid2eid = tid2eid_d.as<int32_t>(), r.tokens = tokens_d.as<int32_t>();
    else r.bias = bias_d.f32();
    Tensor experts_d = gpu_->alloc(DType::kI32, Shape{rows, k}), weights_d = poisoned(Shape{rows, k});
    gpu_->moe_route(experts_d, weights_d, logits_d, r);
    const std::vector<int32_t> ref(experts.as<int32_t>(), experts.as<int32_t>() + rows * k);
    EXPECT_EQ(fetch_i32(experts_d), ref) << "rows " << rows << " experts " << e << " k " << k << " scoring "
                                         << static_cast<int>(scoring) << " hash " << hash << " ties " << ties;
    EXPECT_LE(rel_error(fetch(weights_d), values(weights)), kBound)
        << "rows " << rows << " experts " << e << " k " << k << " scoring " << static_cast<int>(scoring);
}

// Every row count up to 64, E = 8 and 256, k = 2 and 6, each scoring function, hash and score routing, with and
// without a gate temperature.
TEST_F(CudaMoe, RouteMatchesCpu) {
    for (int64_t e : {8, 256}) {
        for (int k : {2, 6}) {
            for (ScoringFunc scoring : {ScoringFunc::kSqrtSoftplus, ScoringFunc::kSoftmax, ScoringFunc::kSigmoid}) {
                for (bool hash : {false, true}) {
                    for (int64_t rows = 1; rows <= 64; ++rows)
                        check_route(rows, e, k, scoring, hash, rows % 3 == 0 ? 0.5f : 1.0f);
                }
            }
        }
    }
}

// Rows routed by `ids` on both backends.
void CudaMoe::check_experts(const Experts& w, const std::vector<int32_t>& ids, int rows_per_input, bool misaligned,
                            float x_scale) {
    const int64_t rows = static_cast<int64_t>(ids.size()), inputs = rows / rows_per_input;
    const int64_t n = w.host[0].rows, kin = w.host[0].cols;
    std::vector<float> xv = randn(inputs * kin, x_scale);
    Tensor x = host(xv, Shape{inputs, kin}), ids_h = i32_host(ids);
    Tensor ref = Tensor::f32(Shape{rows, n});
    cpu_->expert_linear(ref, x, ids_h, w.host, rows_per_input);
    Tensor out = poisoned(Shape{rows, n}), ids_d = device(ids_h);
    Tensor xd = gpu_->alloc(DType::kF32, Shape{inputs * kin + 1});
    const TensorView xv_d(xd.f32() + (misaligned ? 1 : 0), DType::kF32, Shape{inputs, kin});
    gpu_->upload(xv_d, x.f32());
    gpu_->expert_linear(out, xv_d, ids_d, w.dev, rows_per_input);
    const std::vector<float> got = fetch(out);
    const bool tc = on_tensor_cores(w.format, kin);
    const std::string what = "format " + std::to_string(w.format) + ", experts " + std::to_string(w.host.size()) +
                             ", rows " + std::to_string(rows) + ", per input " + std::to_string(rows_per_input) +
                             " [" + std::to_string(n) + ", " + std::to_string(kin) + "]" +
                             (misaligned ? " misaligned input" : "") + (tc ? " (tensor cores)" : "");
    EXPECT_LE(rel_error(got, values(ref)), tc ? kBf16Bound : kBound) << what;
    if (tc && exact_in_bf16(w.format)) {
        for (float& v : xv) v = round_to_bf16(v);
        Tensor ref16 = Tensor::f32(Shape{rows, n});
        cpu_->expert_linear(ref16, host(xv, Shape{inputs, kin}), ids_h, w.host, rows_per_input);
        EXPECT_LE(rel_error(got, values(ref16)), kSameInputsBound) << what << ", bf16-rounded inputs";
    }
}

// Every weight format, rows 1..64 (one-row items), E = 8 (many rows per expert) and 256, the first products'
// mapping (k slots per input row, k = 2 and 6) and the down product's (a row per input). n = 72 ends in a partial
// tile; kin = 256 is 2 FP8 scale blocks of 128 and 8 FP4 groups (2 k blocks of the tensor-core kernel: two of its
// four K warps idle).
void CudaMoe::expert_linear_matches_cpu() {
    for (int format = 0; format < 7; ++format) {
        for (int64_t e : {8, 256}) {
            const Experts w = make_experts(format, e, 72, 256);
            for (int k : {2, 6}) {
                for (int64_t rows = 1; rows <= 64; ++rows) {
                    if (rows % k == 0) check_experts(w, distinct_ids(rows / k, e, k), k);
                    std::vector<int32_t> any(rows);
                    for (int32_t& id : any) id = static_cast<int32_t>(rng_() % e);
                    if (k == 2) check_experts(w, any, 1);
                }
            }
        }
    }
}
TEST_F(CudaMoe, ExpertLinearMatchesCpu) { expert_linear_matches_cpu(); }
TEST_F(CudaMoeTc, ExpertLinearMatchesCpu) { expert_linear_matches_cpu(); }

// A V4-Flash expert (width 2048, hidden 4096) in the release formats at decode's row counts, one expert shared by
// every row, and layouts the streaming kernels do not take (K not a whole number of 16-byte chunks).
void CudaMoe::model_shapes_and_odd_layouts() {
    for (int format : {4, 6}) {
        const Experts w1 = make_experts(format, 8, 2048, 4096), w2 = make_experts(format, 8, 4096, 2048);
        check_experts(w1, distinct_ids(1, 8, 6), 6);
        check_experts(w1, distinct_ids(8, 8, 6), 6);
        check_experts(w2, distinct_ids(1, 8, 6), 1);
        check_experts(w2, distinct_ids(8, 8, 6), 1);
    }
    check_experts(make_experts(4, 4, 200, 512), std::vector<int32_t>(64, 3), 1);
    check_experts(make_experts(2, 4, 50, 100), {0, 3, 3, 1, 2, 0}, 2);  // FP8 with K = 100
    check_experts(make_experts(0, 4, 33, 50), {2, 2, 1}, 1);            // F32 with K = 50
}
TEST_F(CudaMoe, ExpertLinearModelShapesAndOddLayouts) { model_shapes_and_odd_layouts(); }
TEST_F(CudaMoeTc, ExpertLinearModelShapesAndOddLayouts) { model_shapes_and_odd_layouts(); }

// Decode batches of T = 1, 8, 32 and 128 tokens with k = 6 of 256 experts: one-row items up to 64 rows, then the
// rows grouped by expert on the device (fp32: 2 and 4 rows per item; tensor cores: up to 8 rows per item at
// K = 4096, 16 at K = 2048); one hot expert that every token picks (T rows: many items of one expert); the down
// product's mapping (a row per input); K = 4096 / 2048 (4 and 2 slices of 32 chunks per FP4 weight row, FP8 8 and
// 4; 32 and 16 k blocks of the tensor-core kernel). n = 136 ends in a partial tile.
void CudaMoe::decode_batches() {
    for (int format : {4, 6}) {
        const Experts w1 = make_experts(format, 256, 136, 4096), w2 = make_experts(format, 256, 136, 2048);
        for (int64_t tokens : {1, 8, 32, 128}) {
            check_experts(w1, routed_ids(tokens, 256, 6), 6);
            check_experts(w1, routed_ids(tokens, 256, 6, 17), 6);
            check_experts(w2, routed_ids(tokens, 256, 6, 255), 1);
        }
        check_experts(w2, std::vector<int32_t>(300, 9), 1);  // every row on one expert: 75 items of 4 (19 of 16)
    }
}
TEST_F(CudaMoe, ExpertLinearDecodeBatchesMatchCpu) { decode_batches(); }
TEST_F(CudaMoeTc, ExpertLinearDecodeBatchesMatchCpu) { decode_batches(); }

// Layouts around the streaming kernels' slicing and staging: K not whole slices (FP4 K = 1536: 48 chunks, the
// second slice half empty), 3 and 5 slices (warps left idle), more slices than warps (BF16 K = 4096: 16, F32
// K = 8192: 64 with 2 rows per item at most), K not whole k blocks of the tensor-core kernel (FP4 K = 160, BF16
// K = 72, F32 K = 52: the last k block partial; F32 K = 52 also ends in a partial group of 8 staged activations),
// an input that is not 16-byte aligned, more experts than the on-device sort takes (one-row items at any row
// count), and K past the fp32 kernel's shared-memory budget (the plain kernel; on the tensor cores one staged row).
void CudaMoe::slices_and_staging() {
    check_experts(make_experts(4, 16, 72, 1536), routed_ids(40, 16, 4), 4);
    check_experts(make_experts(4, 16, 40, 3072), routed_ids(50, 16, 6), 6);
    check_experts(make_experts(6, 16, 40, 5 * 512), routed_ids(30, 16, 6, 3), 6);
    const Experts bf16 = make_experts(1, 12, 24, 4096);
    check_experts(bf16, routed_ids(8, 12, 6), 6);
    check_experts(bf16, routed_ids(60, 12, 6), 6);
    check_experts(make_experts(0, 8, 20, 8192), routed_ids(100, 8, 4, 5), 4);
    check_experts(make_experts(4, 8, 40, 160), routed_ids(30, 8, 3), 3);
    check_experts(make_experts(1, 8, 40, 72), routed_ids(30, 8, 3, 2), 3);
    check_experts(make_experts(0, 8, 24, 52), routed_ids(25, 8, 3), 3);
    check_experts(make_experts(0, 8, 24, 52), routed_ids(10, 8, 3), 3);
    const Experts f16 = make_experts(5, 32, 40, 512);
    check_experts(f16, routed_ids(4, 32, 6), 6, true);
    check_experts(f16, routed_ids(100, 32, 6), 6, true);
    const Experts many = make_experts(0, 2100, 8, 64);
    std::vector<int32_t> ids(400);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % 2100);
    check_experts(many, ids, 1);
    check_experts(make_experts(0, 3, 5, 25600), {2, 0, 2, 1}, 2);
}
TEST_F(CudaMoe, ExpertLinearSlicesAndStaging) { slices_and_staging(); }
TEST_F(CudaMoeTc, ExpertLinearSlicesAndStaging) { slices_and_staging(); }

// FP4 scales near the ends of the E8M0 range: 249..252, whose bf16 constants the tensor-core kernel's fast
// decode cannot form (S = e - 127 above 121), beside 240 and 248 (the fast decode's top) in the same warps, and
// 2..10 (its bottom); the inputs scaled so that the products stay finite and normal (e = 0 and 1 would make
// subnormal weights; 253 and 254 overflow fp32 with the code 6). An all-255 (NaN) expert gives NaN rows.
void CudaMoe::extreme_fp4_scales() {
    const Experts high = make_experts(4, 8, 72, 512, {249, 250, 252, 240, 248});
    check_experts(high, routed_ids(6, 8, 3), 3, false, std::ldexp(1.0f, -110));
    check_experts(high, routed_ids(40, 8, 3), 3, false, std::ldexp(1.0f, -110));
    const Experts low = make_experts(4, 8, 72, 512, {2, 3, 10});
    check_experts(low, routed_ids(6, 8, 3), 3, false, std::ldexp(1.0f, 100));
    check_experts(low, routed_ids(40, 8, 3), 3, false, std::ldexp(1.0f, 100));

    const Experts nan = make_experts(4, 2, 40, 256, {255});
    const std::vector<int32_t> ids = {0, 1, 1, 0};
    Tensor out = poisoned(Shape{4, 40});
    gpu_->expert_linear(out, device(host(randn(4 * 256), Shape{4, 256})), device(i32_host(ids)), nan.dev, 1);
    for (float v : fetch(out)) EXPECT_TRUE(std::isnan(v));
}
TEST_F(CudaMoe, ExpertLinearExtremeFp4Scales) { extreme_fp4_scales(); }
TEST_F(CudaMoeTc, ExpertLinearExtremeFp4Scales) { extreme_fp4_scales(); }

// A row's product does not depend on the other rows, nor on batch-invariant mode (both kernels serve it); an
// expert id outside the list gives a NaN row.
void CudaMoe::rows_are_independent_and_bad_ids_are_nan() {
    const int64_t n = 96, kin = 512;
    const Experts w = make_experts(4, 8, n, kin);
    std::vector<int32_t> ids = {5, 1, 5, 5, 7, 5, 5, 0, 5, 5, 2, 5};
    const int64_t rows = static_cast<int64_t>(ids.size());
    Tensor x = host(randn(rows * kin), Shape{rows, kin}), xd = device(x);
    Tensor ids_d = device(i32_host(ids)), all = poisoned(Shape{rows, n});
    gpu_->expert_linear(all, xd, ids_d, w.dev, 1);
    const std::vector<float> a = fetch(all);
    for (int64_t r = 0; r < rows; ++r) {
        Tensor one = poisoned(Shape{1, n}), id1 = device(i32_host({ids[r]}));
        gpu_->expert_linear(one, xd.view().slice_rows(r, r + 1), id1, w.dev, 1);
        EXPECT_EQ(fetch(one), std::vector<float>(a.begin() + r * n, a.begin() + (r + 1) * n)) << "row " << r;
    }

    // Inside a decode batch of 128 tokens (768 rows, grouped by expert: fp32 4 rows per item, tensor cores 8 at
    // K = 4096 and 16 at K = 2048; tiles of up to 256 features) against the token's 6 slots alone (one row per
    // item, tiles of 32) and single slots alone: bitwise equal. The down product's mapping (a row per input) too.
    for (const bool down : {false, true}) {
        const int64_t tokens = 128, k = 6, kin2 = down ? 2048 : 4096, n2 = 160;
        const int per_input = down ? 1 : static_cast<int>(k);
        const Experts w2 = make_experts(4, 256, n2, kin2);
        const std::vector<int32_t> big = routed_ids(tokens, 256, k, 42);
        const int64_t inputs = down ? tokens * k : tokens;
        Tensor xb = device(host(randn(inputs * kin2), Shape{inputs, kin2})), out = poisoned(Shape{tokens * k, n2});
        gpu_->expert_linear(out, xb, device(i32_host(big)), w2.dev, per_input);
        const std::vector<float> o = fetch(out);
        gpu_->set_batch_invariant(true);
        Tensor inv = poisoned(Shape{tokens * k, n2});
        gpu_->expert_linear(inv, xb, device(i32_host(big)), w2.dev, per_input);
        gpu_->set_batch_invariant(false);
        EXPECT_EQ(fetch(inv), o) << "batch-invariant mode, down " << down;
        for (int64_t t = 0; t < tokens; t += 13) {
            const std::vector<int32_t> mine(big.begin() + t * k, big.begin() + (t + 1) * k);
            const TensorView xt = down ? xb.view().slice_rows(t * k, (t + 1) * k) : xb.view().slice_rows(t, t + 1);
            Tensor alone = poisoned(Shape{k, n2});
            gpu_->expert_linear(alone, xt, device(i32_host(mine)), w2.dev, per_input);
            EXPECT_EQ(fetch(alone), std::vector<float>(o.begin() + t * k * n2, o.begin() + (t + 1) * k * n2))
                << "token " << t << " down " << down;
            Tensor one = poisoned(Shape{1, n2});
            const TensorView x1 = down ? xb.view().slice_rows(t * k + 2, t * k + 3) : xb.view().slice_rows(t, t + 1);
            gpu_->expert_linear(one, x1, device(i32_host({mine[2]})), w2.dev, 1);
            EXPECT_EQ(fetch(one), std::vector<float>(o.begin() + (t * k + 2) * n2, o.begin() + (t * k + 3) * n2))
                << "token " << t << " slot 2, down " << down;
        }
    }

    // Bad ids among few rows (one-row items) and among many (grouped: they form their own bucket).
    Tensor bad_ids = device(i32_host({1, 8, -1, 1})), bad = poisoned(Shape{4, n});
    gpu_->expert_linear(bad, xd.view().slice_rows(0, 4), bad_ids, w.dev, 1);
    const std::vector<float> b = fetch(bad);
    for (int64_t r = 0; r < 4; ++r)
        for (int64_t i = 0; i < n; ++i)
            EXPECT_EQ(std::isnan(b[r * n + i]), r == 1 || r == 2) << "row " << r << " feature " << i;

    const int64_t many = 300;
    std::vector<int32_t> mixed(many);
    for (int64_t r = 0; r < many; ++r) mixed[r] = r % 37 == 5 ? -3 : r % 41 == 7 ? 8 : static_cast<int32_t>(rng_() % 8);
    Tensor xm = device(host(randn(many * kin), Shape{many, kin})), om = poisoned(Shape{many, n});
    gpu_->expert_linear(om, xm, device(i32_host(mixed)), w.dev, 1);
    const std::vector<float> m = fetch(om);
    for (int64_t r = 0; r < many; ++r) {
        const bool want_nan = mixed[r] < 0 || mixed[r] >= 8;
        int64_t nans = 0;
        for (int64_t i = 0; i < n; ++i) nans += std::isnan(m[r * n + i]);
        EXPECT_EQ(nans, want_nan ? n : 0) << "row " << r << " id " << mixed[r];
    }
}
TEST_F(CudaMoe, ExpertLinearRowsAreIndependentAndBadIdsAreNaN) { rows_are_independent_and_bad_ids_are_nan(); }
TEST_F(CudaMoeTc, ExpertLinearRowsAreIndependentAndBadIdsAreNaN) { rows_are_independent_and_bad_ids_are_nan(); }

// Runs of `counts` rows on both backends, each expert's run held to the mode's bound, and the concurrent device op
// bitwise equal to the sequential one.
void CudaMoe::check_grouped_experts(const ExpertFfns& f, const std::vector<int64_t>& counts) {
    const int64_t d = f.w1.host[0].cols;
    int64_t rows = 0;
    for (int64_t n : counts) rows += n;
    const Tensor x = host(randn(rows * d), Shape{rows, d});
    Tensor ref = host(values(x), Shape{rows, d});
    cpu_->grouped_experts(ref, counts, f.w1.host, f.w3.host, f.w2.host, kSwigluLimit);
    const std::vector<float> got = device_grouped(f, x, counts, false), want = values(ref);
    const std::string what = "format " + std::to_string(f.w1.format) + ", " + std::to_string(counts.size()) + " experts";
    // Each product alone is held to the tolerance table elsewhere; a chain of three (the middle one over SwiGLU's
    // clamp) amplifies their rounding by the chain's conditioning. The FP4 experts (the release format of routed
    // experts) keep the table's bounds. The FP8 test weights with 128x128 E8M0 scales (blocks spanning 2^-7 .. 1)
    // are ill-conditioned: on the H200 their chains measured up to 1.6e-5 in fp32 and 0.03-0.11 in bf16, so they
    // get 5x; their concurrent run must still equal the sequential one bitwise (below).
    const double bound = (tc_ ? kBf16Bound : kBound) * (f.w1.format == 6 ? 5 : 1);
    int64_t r0 = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
        const auto run = [&](const std::vector<float>& v) {
            return std::vector<float>(v.begin() + r0 * d, v.begin() + (r0 + counts[e]) * d);
        };
        if (counts[e] > 0) {
            EXPECT_LE(rel_error(run(got), run(want)), bound)
                << what << ", expert " << e << " (" << counts[e] << " rows)";
        }
        r0 += counts[e];
    }
    // The FP4 experts in the auto and tc modes take the fused wgmma kernels on a compute capability 9.0 GPU (their
    // own sums, held to the bound above); otherwise the experts run on concurrent lanes, bitwise as in sequence.
    const std::vector<float> sequential = device_grouped(f, x, counts, true);
    if (tc_ && !batch_invariant_ && cuda::grouped_experts_wgmma_applies(f.w1.dev, f.w3.dev, f.w2.dev))
        EXPECT_LE(rel_error(got, sequential), kBf16Bound) << what << ": wgmma against sequential";
    else
        EXPECT_EQ(got, sequential) << what << ": concurrent against sequential";
}

// FP4 and FP8 experts (D = 512, I = 256) with uneven runs: one expert holding most rows, experts without rows, and
// runs of every kernel's row counts (the GEMVs' 1..16, the tensor-core GEMM's, cuBLAS's from 128 in the default
// mode), more experts than side streams; then two touched experts (fewer than the streams), and one. In the
// default mode also batch-invariant mode (the tensor-core GEMM without split-K for every run).
void CudaMoe::grouped_experts_match_cpu() {
    const std::vector<std::vector<int64_t>> cases = {{0, 300, 1, 0, 7, 12, 40, 3, 0, 130, 2, 20},
                                                     {0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 150, 0},
                                                     {0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0}};
    for (int format : {4, 6}) {
        const ExpertFfns f = make_ffns(format, 12, 512, 256);
        for (const std::vector<int64_t>& counts : cases) check_grouped_experts(f, counts);
        if (!tc_) continue;
        gpu_->set_batch_invariant(true);
        batch_invariant_ = true;
        check_grouped_experts(f, cases[0]);
        gpu_->set_batch_invariant(false);
        batch_invariant_ = false;
    }
}
TEST_F(CudaMoe, GroupedExpertsMatchCpu) { grouped_experts_match_cpu(); }
TEST_F(CudaMoeDefault, GroupedExpertsMatchCpu) { grouped_experts_match_cpu(); }

}  // namespace
}  // namespace deepinfer
