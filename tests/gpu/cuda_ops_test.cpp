// Every CUDA op against the CPU op (the oracle), on fresh random inputs each run (never zeros), with the
// output poisoned with NaN before the CUDA op so unwritten elements fail. Both backends compute in fp32, so
// the bound is fp32 summation-order noise: max |cuda - cpu| / max |cpu| <= 1e-5 (NaN never passes).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/weight.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;
using testing_support::kBound;

// The hyper-connection tests' inputs on both backends: streams [rows, n, d] (the device copy `offset` floats into
// its allocation: 1 leaves it 4-byte aligned only), the mix's weights fn [(2 + n) n, n d] and the head's [n, n d].
struct HcInputs {
    int n = 0;
    int64_t rows = 0, d = 0;
    Tensor streams, fn, base, scale, hfn, hbase, hscale;         // host
    Tensor sd_alloc, fnd, based, scaled, hfnd, hbased, hscaled;  // device
    TensorView sd;                                               // the device streams, in sd_alloc

    HcParams mix(bool dev) const {
        return dev ? HcParams{fnd.f32(), based.f32(), scaled.f32(), n, 20, 1e-6f, 1e-6f}
                   : HcParams{fn.f32(), base.f32(), scale.f32(), n, 20, 1e-6f, 1e-6f};
    }
    HcParams head(bool dev) const {
        return dev ? HcParams{hfnd.f32(), hbased.f32(), hscaled.f32(), n, 0, 1e-6f, 1e-6f}
                   : HcParams{hfn.f32(), hbase.f32(), hscale.f32(), n, 0, 1e-6f, 1e-6f};
    }
};

// What the mix dot products feed: hc_mix's pre, post and comb, hc_pre's collapsed streams, hc_head's output.
struct HcOutputs {
    std::vector<float> pre, post, comb, collapsed, head;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_hc_near(const HcOutputs& a, const HcOutputs& ref, double bound) {
    EXPECT_LE(rel_error(a.pre, ref.pre), bound) << "pre";
    EXPECT_LE(rel_error(a.post, ref.post), bound) << "post";
    EXPECT_LE(rel_error(a.comb, ref.comb), bound) << "comb";
    EXPECT_LE(rel_error(a.collapsed, ref.collapsed), bound) << "collapsed";
    EXPECT_LE(rel_error(a.head, ref.head), bound) << "head";
}

// This file checks the exact fp32 paths: products of more than 8 rows on the tiled kernel
// (cuda_gemm_tc_test.cpp covers the tensor-core one at the bf16 bound); and, in CudaOpsDefaultMode, the default
// mode's hyper-connection dots on the tensor cores at fp32-level accuracy.
class CudaOps : public testing_support::CudaCompare {
public:
    CudaOps() : CudaCompare("tiled") {}

protected:
    explicit CudaOps(const char* gemm) : CudaCompare(gemm) {}
    void check_linear(int format, int64_t t, int64_t n, int64_t k);
    HcInputs hc_inputs(int n, int64_t rows, int64_t d, float fn_std, int64_t offset = 0);
    HcOutputs hc_on_cpu(const HcInputs& in);
    HcOutputs hc_on_gpu(const HcInputs& in);
    void check_hc_ignores_row_count();
    void check_hc_post_pre_norm(int64_t rows, int64_t d, int64_t offset, const char* env, const char* value,
                                const char* profile_name, bool fused);
};

// fn ~ N(0, fn_std^2), base ~ N(0, 0.25), streams ~ N(0, 1).
HcInputs CudaOps::hc_inputs(int n, int64_t rows, int64_t d, float fn_std, int64_t offset) {
    HcInputs in;
    in.n = n;
    in.rows = rows;
    in.d = d;
    const int64_t mix = (2 + n) * n, width = n * d;
    in.streams = host(randn(rows * width), Shape{rows, n, d});
    in.fn = host(randn(mix * width, fn_std), Shape{mix, width});
    in.base = host(randn(mix, 0.5f), Shape{mix});
    in.scale = host({0.7f, 1.3f, 0.9f}, Shape{3});
    in.hfn = host(randn(n * width, fn_std), Shape{n, width});
    in.hbase = host(randn(n, 0.5f), Shape{n});
    in.hscale = host({1.1f}, Shape{1});
    in.sd_alloc = gpu_->alloc(DType::kF32, Shape{rows * width + offset});
    in.sd = TensorView(in.sd_alloc.f32() + offset, DType::kF32, Shape{rows, n, d});
    gpu_->upload(in.sd, in.streams.f32());
    in.fnd = device(in.fn);
    in.based = device(in.base);
    in.scaled = device(in.scale);
    in.hfnd = device(in.hfn);
    in.hbased = device(in.hbase);
    in.hscaled = device(in.hscale);
    return in;
}

HcOutputs CudaOps::hc_on_cpu(const HcInputs& in) {
    const int n = in.n;
    const int64_t rows = in.rows, d = in.d;
    Tensor pre = Tensor::f32(Shape{rows, n}), post = Tensor::f32(Shape{rows, n}), comb = Tensor::f32(Shape{rows, n, n});
    cpu_->hc_mix(pre, post, comb, in.streams, in.mix(false));
    Tensor collapsed = Tensor::f32(Shape{rows, d});
    Tensor post2 = Tensor::f32(post.shape()), comb2 = Tensor::f32(comb.shape());
    cpu_->hc_pre(collapsed, post2, comb2, in.streams, in.mix(false));
    Tensor head = Tensor::f32(Shape{rows, d});
    cpu_->hc_head(head, in.streams, in.head(false));
    return {values(pre), values(post), values(comb), values(collapsed), values(head)};
}

HcOutputs CudaOps::hc_on_gpu(const HcInputs& in) {
    const int n = in.n;
    const int64_t rows = in.rows, d = in.d;
    Tensor pre = poisoned(Shape{rows, n}), post = poisoned(Shape{rows, n}), comb = poisoned(Shape{rows, n, n});
    gpu_->hc_mix(pre, post, comb, in.sd, in.mix(true));
    Tensor collapsed = poisoned(Shape{rows, d}), post2 = poisoned(post.shape()), comb2 = poisoned(comb.shape());
    gpu_->hc_pre(collapsed, post2, comb2, in.sd, in.mix(true));
    Tensor head = poisoned(Shape{rows, d});
    gpu_->hc_head(head, in.sd, in.head(true));
    return {fetch(pre), fetch(post), fetch(comb), fetch(collapsed), fetch(head)};
}

// A [t, k] x [n, k]^T product of a fresh weight in `format` (see make_weight) on both backends.
void CudaOps::check_linear(int format, int64_t t, int64_t n, int64_t k) {
    HostWeight hw = make_weight(rng_, format, n, k);
    const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
    Tensor x = host(randn(t * k), Shape{t, k});
    Tensor ref = Tensor::f32(Shape{t, n});
    cpu_->linear(ref, x, hw.w);
    Tensor out = poisoned(Shape{t, n}), xd = device(x);
    gpu_->linear(out, xd, dw);
    EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << "format " << format << " rows " << t << " k " << k;
}

// The GEMV (1..8 rows) for every weight kind and row count. k = 256 leaves lanes without chunks (8 FP4 chunks per
// row, fewer than a warp covers), n = 77 and 300 end in partial tiles, k = 416 ends in a partial step of 8
// chunks, k = 4096 with n = 40 splits K over a cluster of blocks, n = 70000 makes each block loop over tiles
// (k = 64: 2 FP4 chunks per row, one scale block of 128 for FP8).
TEST_F(CudaOps, GemvEveryKindAndRowCount) {
    struct Shape2 {
        int64_t n, k;
    };
    for (int format = 0; format < 7; ++format) {
        for (int64_t t = 1; t <= 8; ++t) {
            for (Shape2 s : {Shape2{77, 256}, Shape2{300, 416}, Shape2{40, 4096}, Shape2{70000, 64}}) {
                check_linear(format, t, s.n, s.k);
            }
        }
    }
}

// Large K at 8 rows: the activations of one block must fit in shared memory, so K is split over a cluster even
// with many tiles, and each block still loops over several tiles.
TEST_F(CudaOps, GemvLargeK) {
    for (int format : {1, 4, 6}) {
        check_linear(format, 8, 4300, 12288);
        check_linear(format, 1, 300, 16384);
    }
}

// Rows 1..8 take the weight-streaming GEMV (k = 96 and 256 split into whole 16-byte chunks), 9 and 70 the
// tiled kernel; k = 4096 makes each GEMV lane loop several times, k = 100 leaves FP8 on the tiled kernel.
TEST_F(CudaOps, LinearEveryFormatAndShape) {
    for (int format = 0; format < 5; ++format) {
        for (int64_t t : {1, 5, 8, 9, 70}) {
            check_linear(format, t, 77, format == 3 ? 256 : 96);
        }
    }
}

TEST_F(CudaOps, LinearWideRowsAndUnalignedWidths) {
    for (int format : {1, 2, 4}) {
        for (int64_t t : {1, 3}) {
            for (int64_t k : {int64_t{4096}, int64_t{100}}) {
                if (format == 4 && k == 100) continue;  // FP4 needs whole groups of 32
                check_linear(format, t, 300, k);
            }
        }
    }
}

// In batch-invariant mode a row's product is bitwise the same whether it runs alone or among 20 rows.
TEST_F(CudaOps, LinearBatchInvariantModeIgnoresRowCount) {
    const int64_t n = 64, k = 256;
    HostWeight hw = make_weight(rng_, 4, n, k);
    const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
    Tensor x = host(randn(20 * k), Shape{20, k}), xd = device(x);
    gpu_->set_batch_invariant(true);
    Tensor all = poisoned(Shape{20, n}), one = poisoned(Shape{1, n});
    gpu_->linear(all, xd, dw);
    gpu_->linear(one, xd.view().slice_rows(0, 1), dw);
    gpu_->set_batch_invariant(false);
    const std::vector<float> a = fetch(all), b = fetch(one);
    EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + n), b);
}

// rms_norm_rope (the query heads' and the KV latent's norm then RoPE): against the CPU's rms_norm + rope, and bitwise
// the GPU's own two ops. Shapes: one token of 64 heads x 512 (rope 64), three tokens of one 512 head, a 96-wide head
// with rope over all of it; 20 tokens x 64 heads (1280 rows) take the two ops outside batch-invariant mode and the
// fused kernel in it; rope 6 (not whole float4s) the two ops.
TEST_F(CudaOps, RmsNormRopeFused) {
    struct Case {
        int64_t t, heads, d;
        int rope;
        bool weighted, invariant;
    };
    for (const Case k :
         {Case{1, 64, 512, 64, false, false}, Case{3, 1, 512, 64, true, false}, Case{2, 4, 96, 96, true, false},
          Case{20, 64, 512, 64, false, false}, Case{20, 64, 512, 64, true, true}, Case{5, 2, 64, 6, true, false}}) {
        SCOPED_TRACE(testing::Message() << k.t << " x " << k.heads << " x " << k.d << ", rope " << k.rope);
        Tensor x = host(randn(k.t * k.heads * k.d, 3.0f), Shape{k.t, k.heads, k.d});
        Tensor w = host(randn(k.d), Shape{k.d}), wd = device(w);
        std::vector<int32_t> pos(k.t);
        for (int64_t i = 0; i < k.t; ++i) pos[i] = static_cast<int32_t>(rng_() % 5000);
        std::vector<float> inv(k.rope / 2);
        for (int i = 0; i < k.rope / 2; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(2 * i) / k.rope);
        Tensor pos_d = gpu_->alloc(DType::kI32, Shape{k.t}), inv_d = gpu_->alloc(DType::kF32, Shape{k.rope / 2});
        gpu_->upload(pos_d, pos.data());
        gpu_->upload(inv_d, inv.data());
        const float* wh = k.weighted ? w.f32() : nullptr;
        const float* wdp = k.weighted ? wd.f32() : nullptr;
        Tensor ref = host(values(x), x.shape());
        cpu_->rms_norm(ref, ref, wh, 1e-6f);
        cpu_->rope(ref, pos.data(), inv.data(), k.rope, 1.25f, false);
        gpu_->set_batch_invariant(k.invariant);
        Tensor fused = device(x), two = device(x);
        gpu_->rms_norm_rope(fused, wdp, 1e-6f, pos_d.as<int32_t>(), inv_d.f32(), k.rope, 1.25f);
        gpu_->rms_norm(two, two, wdp, 1e-6f);
        gpu_->rope(two, pos_d.as<int32_t>(), inv_d.f32(), k.rope, 1.25f, false);
        gpu_->set_batch_invariant(false);
        const std::vector<float> got = fetch(fused);
        EXPECT_LE(rel_error(got, values(ref)), kBound);
        EXPECT_EQ(got, fetch(two));
    }
}

// In batch-invariant mode a row's RMSNorm is bitwise the same alone or among 2048 rows of 512 (the query heads of 32
// tokens: outside this mode those take a warp a row, alone a block a row).
TEST_F(CudaOps, RmsNormBatchInvariantModeIgnoresRowCount) {
    const int64_t rows = 2048, cols = 512;
    Tensor x = host(randn(rows * cols), Shape{rows, cols}), xd = device(x);
    Tensor w = device(host(randn(cols, 0.5f), Shape{cols}));
    gpu_->set_batch_invariant(true);
    Tensor all = poisoned(Shape{rows, cols});
    gpu_->rms_norm(all, xd, w.f32(), 1e-6f);
    const std::vector<float> a = fetch(all);
    for (int64_t r = 0; r < rows; r += 97) {  // 22 rows alone: each summation order would show in some of them
        Tensor one = poisoned(Shape{1, cols});
        gpu_->rms_norm(one, xd.view().slice_rows(r, r + 1), w.f32(), 1e-6f);
        EXPECT_EQ(std::vector<float>(a.begin() + r * cols, a.begin() + (r + 1) * cols), fetch(one)) << "row " << r;
    }
    gpu_->set_batch_invariant(false);
}

// t = 3 takes the GEMV (activation rows strided by groups * k), t = 9 the tiled kernel.
TEST_F(CudaOps, GroupedLinearAndEmbedding) {
    const int64_t groups = 4, r = 24, k = 64;
    HostWeight hw = make_weight(rng_, 2, groups * r, k);
    const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
    for (int64_t t : {3, 9}) {
        Tensor x = host(randn(t * groups * k), Shape{t, groups * k});
        Tensor ref = Tensor::f32(Shape{t, groups * r});
        cpu_->grouped_linear(ref, x, hw.w, static_cast<int>(groups));
        Tensor out = poisoned(Shape{t, groups * r}), xd = device(x);
        gpu_->grouped_linear(out, xd, dw, static_cast<int>(groups));
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << "rows " << t;
    }

    HostWeight table = make_weight(rng_, 1, 50, 48);
    const LinearWeight dtable = to_backend(*gpu_, table.w, &storage_);
    std::vector<int32_t> ids = {3, 49, 0, 17, 17};
    Tensor ids_d = gpu_->alloc(DType::kI32, Shape{5});
    gpu_->upload(ids_d, ids.data());
    Tensor e_ref = Tensor::f32(Shape{5, 48});
    cpu_->embedding(e_ref, table.w, ids.data());
    Tensor e_out = poisoned(Shape{5, 48});
    gpu_->embedding(e_out, dtable, ids_d.as<int32_t>());
    EXPECT_EQ(fetch(e_out), values(e_ref));
}

TEST_F(CudaOps, RmsNormRopeSwigluGatedPool) {
    const int64_t rows = 13, heads = 3, d = 64;
    Tensor x = host(randn(rows * heads * d, 3.0f), Shape{rows, heads, d});
    Tensor w = host(randn(d), Shape{d});
    Tensor wd = device(w), xd = device(x);
    for (bool weighted : {true, false}) {
        Tensor ref = Tensor::f32(x.shape());
        cpu_->rms_norm(ref, x, weighted ? w.f32() : nullptr, 1e-6f);
        Tensor out = poisoned(x.shape());
        gpu_->rms_norm(out, xd, weighted ? wd.f32() : nullptr, 1e-6f);
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBound);
    }
    // The model's widths (a row in registers, in place as the model calls it), one past them (the loop kernel)
    // and an odd one.
    for (int64_t cols : {int64_t{4096}, int64_t{1024}, int64_t{4100}, int64_t{37}}) {
        Tensor xr = host(randn(3 * cols, 2.0f), Shape{3, cols}), wr = host(randn(cols), Shape{cols});
        Tensor ref = Tensor::f32(xr.shape()), io = device(xr), wrd = device(wr);
        cpu_->rms_norm(ref, xr, wr.f32(), 1e-6f);
        gpu_->rms_norm(io, io, wrd.f32(), 1e-6f);
        EXPECT_LE(rel_error(fetch(io), values(ref)), kBound) << "cols " << cols;
    }
    // Many rows of up to 1024 floats take a warp per row (prefill's query heads, latents): every width class of
    // it (1, 2, 4 and 8 float4s a lane, partial ones), a row count that leaves the last block part empty.
    for (int64_t cols : {int64_t{512}, int64_t{1024}, int64_t{128}, int64_t{200}, int64_t{68}, int64_t{900}}) {
        const int64_t many = 1029;
        Tensor xr = host(randn(many * cols, 2.0f), Shape{many, cols}), wr = host(randn(cols), Shape{cols});
        for (bool weighted : {true, false}) {
            Tensor ref = Tensor::f32(xr.shape()), out = poisoned(xr.shape()), xd2 = device(xr), wrd = device(wr);
            cpu_->rms_norm(ref, xr, weighted ? wr.f32() : nullptr, 1e-6f);
            gpu_->rms_norm(out, xd2, weighted ? wrd.f32() : nullptr, 1e-6f);
            EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << many << " rows of " << cols;
        }
    }

    std::vector<int32_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(rng_() % 5000);
    std::vector<float> inv(8);
    for (int i = 0; i < 8; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(2 * i) / 16.0f);
    Tensor pos_d = gpu_->alloc(DType::kI32, Shape{rows}), inv_d = gpu_->alloc(DType::kF32, Shape{8});
    gpu_->upload(pos_d, pos.data());
    gpu_->upload(inv_d, inv.data());
    for (bool inverse : {false, true}) {
        Tensor ref = host(values(x), x.shape()), out = device(x);
        cpu_->rope(ref, pos.data(), inv.data(), 16, 1.25f, inverse);
        gpu_->rope(out, pos_d.as<int32_t>(), inv_d.f32(), 16, 1.25f, inverse);
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << "inverse " << inverse;
    }

    const int64_t n = 1000;
    Tensor g = host(randn(n, 4.0f), Shape{n}), u = host(randn(n, 4.0f), Shape{n});
    Tensor gd = device(g), ud = device(u);
    for (float limit : {0.0f, 1.5f}) {
        Tensor ref = Tensor::f32(Shape{n}), out = poisoned(Shape{n});
        cpu_->swiglu(ref, g, u, limit);
        gpu_->swiglu(out, gd, ud, limit);
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << "limit " << limit;
    }
    {  // NaN and infinite inputs under the clamp: NaN stays NaN (as torch.clamp leaves it), infinities clamp
        std::vector<float> gv = values(g), uv = values(u);
        gv[3] = NAN, uv[5] = NAN, gv[7] = INFINITY, uv[9] = -INFINITY, gv[11] = -INFINITY;
        Tensor gn = host(gv, Shape{n}), un = host(uv, Shape{n});
        Tensor ref = Tensor::f32(Shape{n}), out = poisoned(Shape{n});
        cpu_->swiglu(ref, gn, un, 1.5f);
        gpu_->swiglu(out, device(gn), device(un), 1.5f);
        const std::vector<float> got = fetch(out), want = values(ref);
        for (int64_t i = 0; i < n; ++i) {
            EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i]))
                << "element " << i << ": " << got[i] << " vs " << want[i];
            if (!std::isnan(want[i])) {
                EXPECT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "element " << i;
            }
        }
        EXPECT_TRUE(std::isnan(got[3]) && std::isnan(got[5]));
    }

    const int64_t entries = 7, slots = 8, c = 40;
    std::vector<float> gate = randn(entries * slots * c);
    for (int64_t e = 0; e < entries; ++e)  // the first window's previous-series slots are empty
        for (int64_t s = 0; s < 4 && e == 0; ++s)
            for (int64_t ch = 0; ch < c; ++ch) gate[(e * slots + s) * c + ch] = -INFINITY;
    Tensor kv = host(randn(entries * slots * c), Shape{entries, slots, c}), gt = host(gate, Shape{entries, slots, c});
    Tensor ref = Tensor::f32(Shape{entries, c}), out = poisoned(Shape{entries, c});
    cpu_->gated_pool(ref, kv, gt);
    Tensor kvd = device(kv), gtd = device(gt);
    gpu_->gated_pool(out, kvd, gtd);
    EXPECT_LE(rel_error(fetch(out), values(ref)), kBound);
}

// V4.1's steps (blocks of 16 and 32) and the V4 model's FP8 activations (blocks of 128, DEEPINFER_FP8_ACTIVATIONS).
TEST_F(CudaOps, FakeQuantizeIsBitwiseTheCpuRecipe) {
    for (auto [kind, block] : {std::pair{QuantSim::kFp8Ue8m0, 32},
                               {QuantSim::kFp4E4m3, 16},
                               {QuantSim::kFp4Ue8m0, 32},
                               {QuantSim::kFp8Ue8m0, 128}}) {
        // Blocks of every scale from 2^-40 to 2^40, some of them only zeros, and negative zeros.
        std::vector<float> v = randn(64 * 384, 2.0f);
        for (size_t i = 0; i < v.size(); ++i) {
            const int64_t b = static_cast<int64_t>(i) / block;
            v[i] = b % 13 == 5 ? (i % 2 ? 0.0f : -0.0f) : std::ldexp(v[i], static_cast<int>(b * 7 % 81) - 40);
        }
        Tensor x = host(v, Shape{64, 384});
        Tensor ref = host(values(x), x.shape()), out = device(x);
        cpu_->fake_quantize(ref, kind, block);
        gpu_->fake_quantize(out, kind, block);
        const std::vector<float> got = fetch(out), want = values(ref);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << "kind " << static_cast<int>(kind) << ", block " << block;
    }
}

TEST_F(CudaOps, CopyIsBitwise) {
    const std::vector<float> v = randn(1000 * 33);
    Tensor dst = poisoned(Shape{1000, 33}), src = device(host(v, Shape{1000, 33}));
    gpu_->copy(dst, src);
    const std::vector<float> got = fetch(dst);
    EXPECT_EQ(std::memcmp(got.data(), v.data(), v.size() * 4), 0);
    Tensor shorter = poisoned(Shape{1000, 32});
    EXPECT_THROW(gpu_->copy(shorter, src), Error);
}

// The MoE's combine of the routed outputs and the shared expert: the model's width (four columns a thread), a width
// that is not whole float4s (the scalar kernel), and more rows than a grid's y dimension holds (65,535).
TEST_F(CudaOps, MoeCombine) {
    struct Shape3 {
        int64_t t, k, d;
    };
    for (const Shape3 s : {Shape3{5, 6, 4096}, Shape3{7, 6, 50}, Shape3{70000, 2, 4}}) {
        const Tensor routed = host(randn(s.t * s.k * s.d), Shape{s.t * s.k, s.d});
        const Tensor weights = host(randn(s.t * s.k), Shape{s.t, s.k});
        const Tensor shared = host(randn(s.t * s.d), Shape{s.t, s.d});
        Tensor ref = Tensor::f32(Shape{s.t, s.d});
        cpu_->moe_combine(ref, routed, weights, shared);
        Tensor out = poisoned(Shape{s.t, s.d});
        const Tensor routed_d = device(routed), weights_d = device(weights), shared_d = device(shared);
        gpu_->moe_combine(out, routed_d, weights_d, shared_d);
        const std::vector<float> got = fetch(out);
        EXPECT_LE(rel_error(got, values(ref)), 1e-6) << s.t << " x " << s.k << " x " << s.d;
        // The same inputs a float off 16-byte alignment take the one-column kernel: bitwise the same sums.
        Tensor buffer = gpu_->alloc(DType::kF32, Shape{routed.numel() + 1});
        const TensorView routed_off(static_cast<float*>(buffer.view().data()) + 1, DType::kF32, routed.shape());
        gpu_->upload(routed_off, routed.f32());
        Tensor out_off = poisoned(Shape{s.t, s.d});
        gpu_->moe_combine(out_off, routed_off, weights_d, shared_d);
        EXPECT_EQ(fetch(out_off), got) << s.t << " x " << s.k << " x " << s.d << ", misaligned";
    }
}

// Every hyper-connection op against the CPU, in this fixture's exact mode (the default mode's tensor-core dots:
// CudaOpsDefaultMode below). The mix dot products split the width into chunks of 512 and take one kernel for up
// to 64 rows and a tiled one above (8 rows of fn per block below 512 rows, 24 from there): d = 96 and 33 fit one
// partial chunk; n = 3 makes widths that are not whole float4s and a generic n; 5000 rows cross the 4096-row
// scratch slabs. The model's shape (n = 4, d = 4096: width 16384) at 1, 3, 8 and 300 rows takes fn ~ N(0, 1 /
// width), so the logits are O(1): with larger ones (std 0.05: logits ~6) the CPU oracle's own serial-sum error
// over 16384 terms (~sqrt(width) * 2^-24 relative) reaches ~7e-6 of the 1e-5 bound.
TEST_F(CudaOps, HyperConnections) {
    struct Case {
        int n;
        int64_t rows, d;
    };
    // (3, 9, 64): the vectorised collapse/post with a runtime n.
    for (Case k : {Case{4, 11, 96}, Case{3, 5, 33}, Case{3, 70, 33}, Case{3, 9, 64}, Case{4, 5000, 8}, Case{4, 1, 4096},
                   Case{4, 3, 4096}, Case{4, 8, 4096}, Case{4, 40, 4096}, Case{4, 64, 4096}, Case{4, 65, 4096},
                   Case{4, 300, 4096}}) {
        const int n = k.n;
        const int64_t rows = k.rows, d = k.d, mix = (2 + n) * n;
        const float fn_std = d == 4096 ? 1.0f / std::sqrt(float(n * d)) : 0.05f;
        SCOPED_TRACE(testing::Message() << "n " << n << " rows " << rows << " d " << d);
        Tensor streams = host(randn(rows * n * d), Shape{rows, n, d});
        Tensor fn = host(randn(mix * n * d, fn_std), Shape{mix, n * d}), base = host(randn(mix, 0.5f), Shape{mix});
        Tensor scale = host({0.7f, 1.3f, 0.9f}, Shape{3});
        Tensor fnd = device(fn), based = device(base), scaled = device(scale), sd = device(streams);
        const HcParams hp{fn.f32(), base.f32(), scale.f32(), n, 20, 1e-6f, 1e-6f};
        const HcParams dp{fnd.f32(), based.f32(), scaled.f32(), n, 20, 1e-6f, 1e-6f};

        Tensor pre = Tensor::f32(Shape{rows, n}), post = Tensor::f32(Shape{rows, n});
        Tensor comb = Tensor::f32(Shape{rows, n, n});
        cpu_->hc_mix(pre, post, comb, streams, hp);
        Tensor pre_d = poisoned(pre.shape()), post_d = poisoned(post.shape()), comb_d = poisoned(comb.shape());
        gpu_->hc_mix(pre_d, post_d, comb_d, sd, dp);
        EXPECT_LE(rel_error(fetch(pre_d), values(pre)), kBound);
        EXPECT_LE(rel_error(fetch(post_d), values(post)), kBound);
        EXPECT_LE(rel_error(fetch(comb_d), values(comb)), kBound);

        Tensor collapsed = Tensor::f32(Shape{rows, d}), collapsed_d = poisoned(Shape{rows, d});
        cpu_->hc_pre(collapsed, post, comb, streams, hp);
        gpu_->hc_pre(collapsed_d, post_d, comb_d, sd, dp);
        EXPECT_LE(rel_error(fetch(collapsed_d), values(collapsed)), kBound);

        // hc_pre_norm (weighted, and unweighted at d = 96): against the CPU's hc_pre + rms_norm; and bitwise the
        // GPU's own hc_pre + rms_norm where the fused kernel applies (d % 4 == 0) and rms_norm takes a block per
        // row (fewer than 1024 rows, or d > 1024).
        Tensor nw = host(randn(d, 0.5f), Shape{d}), nwd = device(nw);
        const float* nw_h = d == 96 ? nullptr : nw.f32();
        const float* nw_d = d == 96 ? nullptr : nwd.f32();
        // Its post and comb are bitwise hc_mix's (for a few tokens at n = 4 the finish shares the collapse's launch).
        Tensor normed = Tensor::f32(Shape{rows, d}), normed_d = poisoned(Shape{rows, d});
        Tensor post_n = poisoned(post.shape()), comb_n = poisoned(comb.shape());
        cpu_->hc_pre_norm(normed, post, comb, streams, hp, nw_h, 1e-6f);
        gpu_->hc_pre_norm(normed_d, post_n, comb_n, sd, dp, nw_d, 1e-6f);
        EXPECT_LE(rel_error(fetch(normed_d), values(normed)), kBound) << "hc_pre_norm";
        EXPECT_EQ(fetch(post_n), fetch(post_d)) << "hc_pre_norm post";
        EXPECT_EQ(fetch(comb_n), fetch(comb_d)) << "hc_pre_norm comb";
        Tensor two_ops = poisoned(Shape{rows, d});
        gpu_->rms_norm(two_ops, collapsed_d, nw_d, 1e-6f);
        if (d % 4 == 0 && (rows < 1024 || d > 1024)) {
            EXPECT_EQ(fetch(normed_d), fetch(two_ops)) << "hc_pre_norm";
        }

        Tensor y = host(randn(rows * d), Shape{rows, d}), yd = device(y);
        Tensor expanded = Tensor::f32(streams.shape()), expanded_d = poisoned(streams.shape());
        cpu_->hc_post(expanded, y, post, comb, streams);
        gpu_->hc_post(expanded_d, yd, post_d, comb_d, sd);
        EXPECT_LE(rel_error(fetch(expanded_d), values(expanded)), kBound);

        Tensor hfn = host(randn(n * n * d, fn_std), Shape{n, n * d}), hbase = host(randn(n, 0.5f), Shape{n});
        Tensor hscale = host({1.1f}, Shape{1});
        Tensor hfnd = device(hfn), hbased = device(hbase), hscaled = device(hscale);
        Tensor head = Tensor::f32(Shape{rows, d}), head_d = poisoned(Shape{rows, d});
        cpu_->hc_head(head, streams, HcParams{hfn.f32(), hbase.f32(), hscale.f32(), n, 0, 1e-6f, 1e-6f});
        gpu_->hc_head(head_d, sd, HcParams{hfnd.f32(), hbased.f32(), hscaled.f32(), n, 0, 1e-6f, 1e-6f});
        EXPECT_LE(rel_error(fetch(head_d), values(head)), kBound);
    }
}

// A row's mix coefficients and head output are bitwise the same alone or inside a larger call: the sums'
// order depends only on the width. 520 rows take the tiled kernel with 24 fn rows per block; the slices take
// the few-row kernel (1, 3, 8 rows) and the tiled one with 8 fn rows per block (300 rows).
void CudaOps::check_hc_ignores_row_count() {
    const int n = 4, mix = (2 + n) * n;
    const int64_t rows = 520, d = 4096, width = n * d;
    const float fn_std = 1.0f / std::sqrt(float(width));
    Tensor streams = host(randn(rows * width), Shape{rows, n, d}), sd = device(streams);
    Tensor fnd = device(host(randn(mix * width, fn_std), Shape{mix, width}));
    Tensor based = device(host(randn(mix, 0.5f), Shape{mix})), scaled = device(host({0.7f, 1.3f, 0.9f}, Shape{3}));
    Tensor hfnd = device(host(randn(n * width, fn_std), Shape{n, width}));
    Tensor hbased = device(host(randn(n, 0.5f), Shape{n})), hscaled = device(host({1.1f}, Shape{1}));
    const HcParams dp{fnd.f32(), based.f32(), scaled.f32(), n, 20, 1e-6f, 1e-6f};
    const HcParams hp{hfnd.f32(), hbased.f32(), hscaled.f32(), n, 0, 1e-6f, 1e-6f};

    Tensor pre = poisoned(Shape{rows, n}), post = poisoned(Shape{rows, n}), comb = poisoned(Shape{rows, n, n});
    Tensor head = poisoned(Shape{rows, d});
    gpu_->hc_mix(pre, post, comb, sd, dp);
    gpu_->hc_head(head, sd, hp);
    const std::vector<float> pre_all = fetch(pre), post_all = fetch(post), comb_all = fetch(comb);
    const std::vector<float> head_all = fetch(head);
    auto rows_of = [](const std::vector<float>& v, int64_t per_row, int64_t b, int64_t e) {
        return std::vector<float>(v.begin() + b * per_row, v.begin() + e * per_row);
    };
    const std::pair<int64_t, int64_t> slices[] = {{0, 1}, {517, 520}, {64, 72}, {100, 400}};
    for (auto [b, e] : slices) {
        SCOPED_TRACE(testing::Message() << "rows " << b << ".." << e);
        const int64_t t = e - b;
        Tensor pre_s = poisoned(Shape{t, n}), post_s = poisoned(Shape{t, n}), comb_s = poisoned(Shape{t, n, n});
        Tensor head_s = poisoned(Shape{t, d});
        gpu_->hc_mix(pre_s, post_s, comb_s, sd.view().slice_rows(b, e), dp);
        gpu_->hc_head(head_s, sd.view().slice_rows(b, e), hp);
        EXPECT_EQ(fetch(pre_s), rows_of(pre_all, n, b, e));
        EXPECT_EQ(fetch(post_s), rows_of(post_all, n, b, e));
        EXPECT_EQ(fetch(comb_s), rows_of(comb_all, n * n, b, e));
        EXPECT_EQ(fetch(head_s), rows_of(head_all, d, b, e));
    }
}

TEST_F(CudaOps, HyperConnectionsIgnoreRowCount) { check_hc_ignores_row_count(); }

// The default mode: hyper-connection mixes of more than 64 rows take the 3xTF32 tensor-core dots (hc_dots_tc.cu)
// where their layout applies (width % 4 == 0, 16-byte aligned streams and fn, at most 24 fn rows); batch-invariant
// mode keeps the SIMT kernels.
class CudaOpsDefaultMode : public CudaOps {
public:
    CudaOpsDefaultMode() : CudaOps("auto") {}

protected:
    // Batch-invariant mode's outputs: the SIMT kernels'.
    HcOutputs hc_simt(const HcInputs& in) {
        gpu_->set_batch_invariant(true);
        HcOutputs out = hc_on_gpu(in);
        gpu_->set_batch_invariant(false);
        return out;
    }
};

// Bounds of the tensor-core dots. 3xTF32 holds each factor to 2^-22 and drops a term under 2^-22 |ab|, errors of
// random sign. A host emulation of the kernel (tf32 rounding; the accumulator truncated, not rounded, after every
// 4 products; the per-stage sums) at the model's shape, fn ~ N(0, 1 / width) (logits O(1)), puts its
// coefficients ~3.5e-7 (600 rows) to ~6.6e-7 (4100) from the fp32 SIMT kernels' and ~3.5e-6 to ~4.4e-6 from the
// CPU's (the CPU's own serial-sum error): the fp32 bound kBound against the CPU and kTcVsSimtBound against the
// SIMT kernels. Plain TF32 (no lo terms) lands ~3.3e-4 from both, one accumulator for a whole split (no per-stage
// sums) ~2.5e-5 to ~5.6e-5: each fails both.
constexpr double kTcVsSimtBound = 2e-6;

// The model's shape (n = 4, d = 4096) at 600 rows (a partial last token tile) and 4100; then width 108 (a partial
// 32-wide stage; 15 fn rows: two n8 tiles; n = 3), 100 at 65 rows (one above the few-row kernel; 8 fn rows),
// 4004 at 129 rows (a 4-wide stage tail, a one-row last tile) and 32 at 17000 rows (two 16384-row slabs). Each
// against the CPU, against the SIMT kernels, and not bitwise equal to the latter (the tensor-core dots ran).
TEST_F(CudaOpsDefaultMode, HyperConnectionsOnTensorCores) {
    struct Case {
        int n;
        int64_t rows, d;
    };
    for (Case k : {Case{4, 600, 4096}, Case{4, 4100, 4096}, Case{3, 700, 36}, Case{2, 65, 50}, Case{4, 129, 1001},
                   Case{4, 17000, 8}}) {
        SCOPED_TRACE(testing::Message() << "n " << k.n << " rows " << k.rows << " d " << k.d);
        const HcInputs in = hc_inputs(k.n, k.rows, k.d, 1.0f / std::sqrt(float(k.n * k.d)));
        const HcOutputs tc = hc_on_gpu(in), simt = hc_simt(in);
        expect_hc_near(tc, hc_on_cpu(in), kBound);
        expect_hc_near(tc, simt, kTcVsSimtBound);
        EXPECT_FALSE(same_bits(tc.pre, simt.pre) && same_bits(tc.post, simt.post) && same_bits(tc.comb, simt.comb))
            << "the mix took the SIMT kernels";
    }
}

// Where the tensor-core dots do not apply, the default mode gives batch-invariant mode's (SIMT) results bit for bit:
// width 99 (not whole float4s), streams 4 bytes past 16-byte alignment, n = 5 (35 fn rows; the head's 5 rows
// still take the tensor cores), 64 rows (the few-row kernel).
TEST_F(CudaOpsDefaultMode, HyperConnectionsFallBackToSimt) {
    struct Case {
        int n;
        int64_t rows, d, offset;
    };
    for (Case k : {Case{3, 300, 33, 0}, Case{4, 300, 512, 1}, Case{5, 100, 64, 0}, Case{4, 64, 4096, 0}}) {
        SCOPED_TRACE(testing::Message() << "n " << k.n << " rows " << k.rows << " d " << k.d << " offset " << k.offset);
        const HcInputs in = hc_inputs(k.n, k.rows, k.d, 1.0f / std::sqrt(float(k.n * k.d)), k.offset);
        const HcOutputs out = hc_on_gpu(in), simt = hc_simt(in);
        expect_hc_near(out, hc_on_cpu(in), kBound);
        EXPECT_TRUE(same_bits(out.pre, simt.pre) && same_bits(out.post, simt.post) && same_bits(out.comb, simt.comb) &&
                    same_bits(out.collapsed, simt.collapsed))
            << "the mix took the tensor cores";
        if (k.n != 5) {
            EXPECT_TRUE(same_bits(out.head, simt.head)) << "the head took the tensor cores";
        }
    }
}

// hc_post_pre_norm (the expand of one sublayer and the collapse of the next) on a backend of its own, against hc_post
// then hc_pre_norm on gpu_: bitwise the same out, post, comb and normed rows, and `profile_name` in its profile where
// `fused`; env (name, value; value null: none) set around the call.
void CudaOps::check_hc_post_pre_norm(int64_t rows, int64_t d, int64_t offset, const char* env, const char* value,
                                     const char* profile_name, bool fused) {
    SCOPED_TRACE(testing::Message() << "rows " << rows << " d " << d << " offset " << offset);
    const int n = 4;
    const HcInputs in = hc_inputs(n, rows, d, 1.0f / std::sqrt(float(n * d)), offset);
    const Tensor y = device(host(randn(rows * d), Shape{rows, d})), w = device(host(randn(d), Shape{d}));
    const std::vector<float> post0 = randn(rows * n), comb0 = randn(rows * n * n, 0.5f);
    Tensor out_a = poisoned(Shape{rows, n, d}), normed_a = poisoned(Shape{rows, d});
    Tensor post_a = device(host(post0, Shape{rows, n})), comb_a = device(host(comb0, Shape{rows, n, n}));
    gpu_->hc_post(out_a, y, post_a, comb_a, in.sd);
    gpu_->hc_pre_norm(normed_a, post_a, comb_a, out_a, in.mix(true), w.f32(), 1e-6f);
    gpu_->synchronize();
    setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
    if (value) setenv(env, value, 1);
    const std::unique_ptr<Backend> be = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_PROFILE");
    Tensor out_b = poisoned(Shape{rows, n, d}), normed_b = poisoned(Shape{rows, d});
    Tensor post_b = device(host(post0, Shape{rows, n})), comb_b = device(host(comb0, Shape{rows, n, n}));
    gpu_->synchronize();
    be->take_profile();
    be->hc_post_pre_norm(out_b, y, post_b, comb_b, in.sd, normed_b, in.mix(true), w.f32(), 1e-6f);
    be->synchronize();
    unsetenv(env);
    const std::string profile = be->take_profile();
    EXPECT_EQ(profile.find(profile_name) != std::string::npos, fused) << profile;
    EXPECT_TRUE(same_bits(fetch(out_b), fetch(out_a))) << "out";
    EXPECT_TRUE(same_bits(fetch(post_b), fetch(post_a))) << "post";
    EXPECT_TRUE(same_bits(fetch(comb_b), fetch(comb_a))) << "comb";
    EXPECT_TRUE(same_bits(fetch(normed_b), fetch(normed_a))) << "normed";
}

// With DEEPINFER_CUDA_HC_POST_MIX=1, where the tensor-core dots apply (n = 4, more than 64 rows, d % 32 == 0, 16-byte
// aligned) the mix's dots make the expand as they load it (the profile names hc_post_mix): the model's shape at 600
// and 4,100 rows, 65 rows, d 32 at 17,000 rows (two slabs); the others take the two ops (or, at 64 rows, the
// few-token path below): 64 rows, d 48, streams 4 bytes past alignment, and the switch unset.
TEST_F(CudaOpsDefaultMode, HcPostPreNormIsTheTwoOpsBitwise) {
    struct Case {
        int64_t rows, d, offset;
        bool fused;
        const char* env;
    };
    for (Case k : {Case{600, 4096, 0, true, "1"}, Case{4100, 4096, 0, true, "1"}, Case{65, 64, 0, true, "1"},
                   Case{17000, 32, 0, true, "1"}, Case{64, 4096, 0, false, "1"}, Case{300, 48, 0, true, "1"},
                   Case{300, 36, 0, true, "1"}, Case{300, 50, 0, false, "1"}, Case{300, 512, 1, false, "1"},
                   Case{600, 4096, 0, false, nullptr}})
        check_hc_post_pre_norm(k.rows, k.d, k.offset, "DEEPINFER_CUDA_HC_POST_MIX", k.env, "hc_post_mix", k.fused);
}

// For a few tokens (decode) the few-token dots make the expand as they stage it (profile name hc_post_pre_norm) where
// d is a multiple of 512, the inputs 16-byte aligned and at most 64 rows: 1, 2, 5, 17 and 64 rows at the model's d,
// 3 rows at d 512; d 48, streams 4 bytes past alignment and DEEPINFER_CUDA_HC_POST_DOTS=0 take the two ops.
TEST_F(CudaOpsDefaultMode, HcPostPreNormFewTokensIsTheTwoOpsBitwise) {
    struct Case {
        int64_t rows, d, offset;
        bool fused;
        const char* off;  // DEEPINFER_CUDA_HC_POST_DOTS
    };
    for (Case k : {Case{1, 4096, 0, true, nullptr}, Case{2, 4096, 0, true, nullptr}, Case{5, 4096, 0, true, nullptr},
                   Case{17, 4096, 0, true, nullptr}, Case{64, 4096, 0, true, nullptr}, Case{3, 512, 0, true, nullptr},
                   Case{3, 48, 0, false, nullptr}, Case{3, 512, 1, false, nullptr}, Case{2, 4096, 0, false, "0"}})
        check_hc_post_pre_norm(k.rows, k.d, k.offset, "DEEPINFER_CUDA_HC_POST_DOTS", k.off, "hc_post_pre_norm",
                               k.fused);
}

// Times a sublayer boundary's expand + collapse at a prefill's shape (16,384 tokens, d 4096): hc_post then
// hc_pre_norm, against hc_post_pre_norm with DEEPINFER_CUDA_HC_POST_MIX=1 (the mix's dots making the expand), under
// each L2 prefetch size of the dots' loads (DEEPINFER_CUDA_HC_L2_PREFETCH). Prints the best of 3 calls; checks that the
// fused call still matches bitwise.
TEST_F(CudaOpsDefaultMode, HcPostPreNormThroughput) {
    const int n = 4;
    const int64_t rows = 16384, d = 4096;
    const HcInputs in = hc_inputs(n, rows, d, 1.0f / std::sqrt(float(n * d)));
    const Tensor y = device(host(randn(rows * d), Shape{rows, d})), w = device(host(randn(d), Shape{d}));
    const std::vector<float> post0 = randn(rows * n), comb0 = randn(rows * n * n, 0.5f);
    Tensor out = poisoned(Shape{rows, n, d}), normed = poisoned(Shape{rows, d});
    Tensor post = device(host(post0, Shape{rows, n})), comb = device(host(comb0, Shape{rows, n, n}));
    const auto time = [&](Backend& be, bool fused) {
        double best = 1e30;
        for (int it = 0; it < 4; ++it) {
            be.upload(post, post0.data());
            be.upload(comb, comb0.data());
            be.synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            if (fused) {
                be.hc_post_pre_norm(out, y, post, comb, in.sd, normed, in.mix(true), w.f32(), 1e-6f);
            } else {
                be.hc_post(out, y, post, comb, in.sd);
                be.hc_pre_norm(normed, post, comb, out, in.mix(true), w.f32(), 1e-6f);
            }
            be.synchronize();
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (it > 0) best = std::min(best, s);
        }
        return best;
    };
    const double two = time(*gpu_, false);
    const std::vector<float> want_out = fetch(out), want_normed = fetch(normed);
    setenv("DEEPINFER_CUDA_HC_POST_MIX", "1", 1);
    const std::unique_ptr<Backend> be = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_HC_POST_MIX");
    const double one = time(*be, true);
    std::printf("hc boundary, %lld tokens, d %lld: hc_post + hc_pre_norm %.3f ms, hc_post_pre_norm fused %.3f ms\n",
                static_cast<long long>(rows), static_cast<long long>(d), two * 1e3, one * 1e3);
    EXPECT_TRUE(same_bits(fetch(out), want_out)) << "out";
    EXPECT_TRUE(same_bits(fetch(normed), want_normed)) << "normed";
}

// Batch-invariant mode keeps the SIMT kernels, whose results do not depend on the row count (520 rows would
// take the tensor cores otherwise).
TEST_F(CudaOpsDefaultMode, HyperConnectionsBatchInvariantModeIgnoresRowCount) {
    gpu_->set_batch_invariant(true);
    check_hc_ignores_row_count();
    gpu_->set_batch_invariant(false);
}

TEST_F(CudaOps, SparseAttentionAndIndexerScores) {
    for (int64_t d : {64, 512}) {
        const int64_t rows = 6, heads = 5, nkeys = 300;
        Tensor q = host(randn(rows * heads * d), Shape{rows, heads, d});
        Tensor keys = host(randn(nkeys * d, 0.2f), Shape{nkeys, d});
        Tensor sinks = host(randn(heads), Shape{heads});
        std::vector<int32_t> offsets = {0}, indices;
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t count = r == 2 ? 0 : 1 + static_cast<int64_t>(rng_() % 200);  // row 2: only the sink
            for (int64_t i = 0; i < count; ++i) indices.push_back(static_cast<int32_t>(rng_() % nkeys));
            offsets.push_back(static_cast<int32_t>(indices.size()));
        }
        Tensor ref = Tensor::f32(q.shape());
        cpu_->sparse_attention(ref, q, keys, offsets.data(), indices.data(), sinks.f32(), 1.0f / std::sqrt(float(d)));
        Tensor qd = device(q), kd = device(keys), sd = device(sinks), out = poisoned(q.shape());
        Tensor off_d = gpu_->alloc(DType::kI32, Shape{static_cast<int64_t>(offsets.size())});
        Tensor idx_d = gpu_->alloc(DType::kI32, Shape{static_cast<int64_t>(std::max<size_t>(indices.size(), 1))});
        gpu_->upload(off_d, offsets.data());
        if (!indices.empty()) gpu_->upload(TensorView(idx_d.view().data(), DType::kI32, Shape{int64_t(indices.size())}), indices.data());
        gpu_->sparse_attention(out, qd, kd, off_d.as<int32_t>(), idx_d.as<int32_t>(), sd.f32(),
                               1.0f / std::sqrt(float(d)));
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBound) << "head_dim " << d;
    }
    const int64_t rows = 9, heads = 8, c = 64, entries = 150;
    Tensor q = host(randn(rows * heads * c), Shape{rows, heads, c}), k = host(randn(entries * c), Shape{entries, c});
    Tensor w = host(randn(rows * heads), Shape{rows, heads});
    Tensor ref = Tensor::f32(Shape{rows, entries}), out = poisoned(Shape{rows, entries});
    cpu_->indexer_scores(ref, q, k, w, 0.125f);
    Tensor qd = device(q), kd = device(k), wd = device(w);
    gpu_->indexer_scores(out, qd, kd, wd, 0.125f);
    EXPECT_LE(rel_error(fetch(out), values(ref)), kBound);
}

// Count of a profile row's calls (0 when the row is missing).
long profile_calls(const std::string& report, const std::string& op) {
    const size_t at = report.find(op + " ");
    if (at == std::string::npos) return 0;
    double ms = 0;
    long calls = 0;
    std::sscanf(report.c_str() + at + op.size(), "%lf %ld", &ms, &calls);
    return calls;
}

// DEEPINFER_CUDA_PROFILE: allocations issued between ops get a host-only row, one call each; what an op allocates
// inside its scope counts in the op's own row, not in that one. Frees only return a block to the block cache (a
// host-side list push) and have no row.
TEST(CudaProfiler, AllocationsBetweenOpsHaveTheirOwnRows) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
    const std::unique_ptr<Backend> be = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_PROFILE");
    be->take_profile();
    {
        Tensor a = be->alloc(DType::kF32, Shape{1000}), b = be->alloc(DType::kF32, Shape{1000});
        Tensor c = be->alloc(DType::kF32, Shape{7});
        const std::vector<float> ones(1000, 1.0f);
        be->upload(a, ones.data());
        be->upload(b, ones.data());
        be->add(a, b);
        std::vector<float> got(1000);
        be->download(got.data(), a);
        EXPECT_EQ(got[999], 2.0f);
    }
    const std::string report = be->take_profile();
    EXPECT_EQ(profile_calls(report, "alloc (between ops)"), 3) << report;
    EXPECT_EQ(profile_calls(report, "free (between ops)"), 0) << report;
    EXPECT_EQ(profile_calls(report, "add"), 1) << report;
    EXPECT_EQ(profile_calls(report, "upload"), 2) << report;
}

}  // namespace
}  // namespace deepinfer
