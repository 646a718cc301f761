// The decode GEMV on Hopper wgmma for FP8 weights (backend/cuda/gemv_wgmma.cu) at 2..128 rows (a launch per 64 rows
// above 64), outputs poisoned with
// NaN, against
//  - the CPU backend within kBf16Bound (3e-2), the tolerance table's bound for products from bf16 activations;
//  - the CPU product of the same bf16-rounded activations within kSameInputsBound (1e-4) for E8M0 scales (the weights
//    are then exact in bf16 and only the fp32 summation order differs: a wrong k permutation, swizzle, scale, tile,
//    split or fragment moves outputs by 1e-2 or more);
//  - the mma.sync GEMV (launch_gemv_tc_jobs, the same numerics for every scale kind: bf16(fp8 * scale) weights, also
//    for f32 scales that are not powers of two) within kSameInputsBound, up to 32 rows (where it applies);
//  - itself: a second run bitwise equal (split-K partials summed in a fixed order).
// Shapes: V4-Flash's wq_a, wkv, wq_b, wo_b and wo_a (8 groups with strided x and outputs), odd ones (features not a
// multiple of 64, K of one and three 128-blocks), several products of different inputs, weight row offsets and
// output columns in one launch. Also the backend's switch (DEEPINFER_CUDA_DECODE_GEMV, the profile naming the kernel
// that ran, batch-invariant and tiled modes never taking it) and gemv_wgmma_applies. Without a compute capability 9.0
// device the wgmma checks are skipped (and applies() must say no).
// The FP8 mma GEMV (gemv_fp8_mma.cu, 1..4 rows: activations split into two exact e4m3 terms, e4m3 x e4m3 on mma.sync)
// the same way, but against the CPU on bf16 inputs and the bf16 wgmma GEMV within kFp8MmaBound: the FP8 tensor cores
// sum a 128-k block's products with fewer bits than fp32 (a wrong split, scale, k order or fragment moves outputs by
// 1e-2 or more). Its shapes have at least 77 outputs: the bound is a norm over them (one output whose terms cancel
// can be off by more).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemv_wgmma.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "deepinfer/error.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using cuda::DecodeGemv;
using cuda::GemvProduct;
using testing_support::HostWeight;
using testing_support::kBf16Bound;
using testing_support::kSameInputsBound;
using testing_support::rel_error;

// The FP8 mma GEMV against products of the same bf16 activations summed in fp32 (see the header comment).
constexpr double kFp8MmaBound = 5e-4;

// Block scales of the FP8 weights: E8M0 2^-7 .. 2^0; E8M0 with about one block in four at 2^8 .. 2^10 (the decode's
// conversion path, still exact); f32 (1 + u) 2^-8 with a random mantissa (bf16(fp8 * scale) rounds).
enum class Scales { kE8m0, kE8m0Large, kF32 };

// One product of a launch: rows w_row0 .. + n_out of weight `weight`, over columns x_col .. x_col + K of input `input`,
// into columns out_col .. of the launch's output.
struct Product {
    int weight;
    int64_t w_row0, n_out;
    int input;
    int64_t x_col, out_col;
};

class CudaGemvWgmma : public testing_support::CudaCompare {
public:
    CudaGemvWgmma() : CudaCompare("auto") {}

protected:
    // FP8 e4m3 [n, k] with 128 x 128 block scales; random codes but the NaN ones, drawn 8 bytes at a time.
    HostWeight fp8_weight(int64_t n, int64_t k, Scales scales) {
        bits_.seed(rng_());
        HostWeight h;
        h.data.resize(n * k);
        for (size_t j = 0; j < h.data.size(); j += 8) {
            uint64_t b = bits_();
            for (size_t i = j; i < j + 8 && i < h.data.size(); ++i, b >>= 8) {
                const uint8_t c = static_cast<uint8_t>(b);
                h.data[i] = (c & 0x7f) == 0x7f ? c ^ 1 : c;
            }
        }
        const int64_t sr = (n + 127) / 128, sc = (k + 127) / 128;
        h.w.rows = n;
        h.w.cols = k;
        h.w.name = "fp8";
        h.w.format = WeightFormat::kFp8Block;
        h.w.block_rows = h.w.block_cols = 128;
        h.w.data = TensorView(h.data.data(), DType::kF8E4M3, Shape{n, k});
        if (scales == Scales::kF32) {
            h.scale.resize(sr * sc * 4);
            std::uniform_real_distribution<float> u(1.0f, 2.0f);
            for (int64_t i = 0; i < sr * sc; ++i) {
                const float s = std::ldexp(u(bits_), -8);
                std::memcpy(h.scale.data() + 4 * i, &s, 4);
            }
            h.w.scale = TensorView(h.scale.data(), DType::kF32, Shape{sr, sc});
        } else {
            h.scale.resize(sr * sc);
            for (uint8_t& s : h.scale) {
                const uint64_t b = bits_();
                s = static_cast<uint8_t>(scales == Scales::kE8m0Large && b % 4 == 0 ? 135 + (b >> 8) % 3 : 120 + b % 8);
            }
            h.w.scale = TensorView(h.scale.data(), DType::kE8M0, Shape{sr, sc});
        }
        return h;
    }
    bool wgmma_device() const { return cuda::gemv_wgmma_device(); }
    // Rows row0 .. row0 + n of a host FP8 weight (row0 a multiple of its 128-row scale blocks) as a weight of its own.
    static LinearWeight weight_rows(const LinearWeight& w, int64_t row0, int64_t n) {
        LinearWeight s = w;
        const int64_t sc = w.scale.dim(1), es = w.scale.dtype() == DType::kF32 ? 4 : 1;
        s.rows = n;
        s.data = TensorView(static_cast<uint8_t*>(w.data.data()) + row0 * w.cols, w.data.dtype(), Shape{n, w.cols});
        s.scale = TensorView(static_cast<uint8_t*>(w.scale.data()) + row0 / 128 * sc * es, w.scale.dtype(),
                             Shape{(n + 127) / 128, sc});
        return s;
    }

    // The products of one launch at `rows` rows (inputs [rows, lda], output [rows, ldc]) on the wgmma kernel (twice)
    // and the mma.sync one, against the CPU (products of the whole weights, their rows w_row0 .. picked; with
    // bf16-rounded activations too where the weights are exact in bf16).
    // `kernel` kFp8Mma: the FP8 mma GEMV twice, against the bf16 wgmma GEMV (from 2 rows) and the CPU. `x_of(n)`
    // makes an input of n values (random normal values by default).
    void check(const std::vector<HostWeight>& hw, const std::vector<LinearWeight>& dw,
               const std::vector<Product>& prods, int inputs, int64_t rows, int64_t lda, int64_t ldc,
               const std::string& what, DecodeGemv kernel = DecodeGemv::kWgmma,
               const std::function<std::vector<float>(int64_t)>& x_of = nullptr) {
        const int64_t k = hw[prods[0].weight].w.cols;
        const bool mma = kernel == DecodeGemv::kFp8Mma;
        std::vector<std::vector<float>> xs;
        std::vector<Tensor> xd;
        for (int i = 0; i < inputs; ++i) {
            xs.push_back(x_of ? x_of(rows * lda) : randn(rows * lda));
            xd.push_back(device(host(xs.back(), Shape{rows, lda})));
        }
        auto run = [&](DecodeGemv kernel) {
            Tensor out = poisoned(Shape{rows, ldc});
            std::vector<GemvProduct> gp;
            for (const Product& p : prods)
                gp.push_back(
                    {out.f32() + p.out_col, ldc, xd[p.input].f32() + p.x_col, lda, &dw[p.weight], p.w_row0, p.n_out});
            gpu_->synchronize();  // the uploads (on the backend's non-blocking stream) land first
            cuda::run_decode_gemv_sync(kernel, gp, rows);
            return fetch(out);
        };
        const std::vector<float> got = run(kernel), again = run(kernel);
        // The other kernel: the mma.sync GEMV (its rows: up to 32); for the FP8 mma one the bf16 wgmma one (from 2).
        const bool tc_applies = mma ? rows >= 2 : rows <= 32;
        const std::vector<float> tc =
            tc_applies ? run(mma ? DecodeGemv::kWgmma : DecodeGemv::kTc) : std::vector<float>(got.size());
        // The references at the products' columns; every other output column must stay NaN.
        std::vector<float> ref, ref16, g, t;
        std::vector<bool> written(ldc, false);
        bool exact = true;
        for (const Product& p : prods) {
            const HostWeight& w = hw[p.weight];
            exact = exact && w.w.scale.dtype() == DType::kE8M0;
            std::vector<float> x(rows * k), x16(rows * k);
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = 0; c < k; ++c) {
                    x[r * k + c] = xs[p.input][r * lda + p.x_col + c];
                    x16[r * k + c] = round_to_bf16(x[r * k + c]);
                }
            }
            // The CPU's product over the weight rows from the last scale block boundary at or before w_row0.
            const int64_t row0 = p.w_row0 / 128 * 128, nr = p.w_row0 + p.n_out - row0;
            const LinearWeight sub = weight_rows(w.w, row0, nr);
            Tensor full = Tensor::f32(Shape{rows, nr}), full16 = Tensor::f32(Shape{rows, nr});
            cpu_->linear(full, host(x, Shape{rows, k}), sub);
            cpu_->linear(full16, host(x16, Shape{rows, k}), sub);
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t n = 0; n < p.n_out; ++n) {
                    ref.push_back(full.f32()[r * nr + p.w_row0 - row0 + n]);
                    ref16.push_back(full16.f32()[r * nr + p.w_row0 - row0 + n]);
                    g.push_back(got[r * ldc + p.out_col + n]);
                    t.push_back(tc[r * ldc + p.out_col + n]);
                }
            }
            for (int64_t n = 0; n < p.n_out; ++n) written[p.out_col + n] = true;
        }
        const std::string at = what + ", " + std::to_string(rows) + " rows" + (mma ? ", fp8 mma" : "");
        const double same = mma ? kFp8MmaBound : kSameInputsBound;
        EXPECT_LE(rel_error(g, ref), kBf16Bound) << at << ": against the CPU";
        // The CPU's weights are fp8 * scale in f32, as the FP8 mma GEMV's; the bf16 kernels round them to bf16,
        // exactly only for E8M0 scales.
        if (exact || mma) {
            const double e = rel_error(g, ref16);
            if (mma) worst_fp8_mma_ = std::max(worst_fp8_mma_, e);
            EXPECT_LE(e, same) << at << ": against the CPU on bf16 inputs";
        }
        if (tc_applies) {
            EXPECT_LE(rel_error(g, t), mma && !exact ? kBf16Bound : same)
                << at << (mma ? ": against the bf16 wgmma GEMV" : ": against the mma.sync GEMV");
        }
        EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << at << ": a second run";
        int64_t stray = 0;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < ldc; ++c) stray += !written[c] && !std::isnan(got[r * ldc + c]);
        EXPECT_EQ(stray, 0) << at << ": outputs written outside the products' columns";
    }
    // V4-Flash's wo_a: 8 groups of 1024 x 4096, group g reading x columns 4096 g .. (lda 32768) and writing output
    // columns 1024 g .. (ldc 8192) from weight rows 1024 g .., the products of one launch.
    struct GroupedWeight {
        static constexpr int64_t kGroups = 8, kRows = 1024, kK = 4096;
        std::vector<HostWeight> hw;
        std::vector<LinearWeight> dw;
        std::vector<Product> prods;
    };
    GroupedWeight wo_a() {
        GroupedWeight w;
        w.hw.push_back(fp8_weight(w.kGroups * w.kRows, w.kK, Scales::kE8m0));
        w.dw.push_back(to_backend(*gpu_, w.hw[0].w, &storage_));
        for (int64_t g = 0; g < w.kGroups; ++g) w.prods.push_back({0, g * w.kRows, w.kRows, 0, g * w.kK, g * w.kRows});
        return w;
    }
    // A backend of its own with the profile on, in DEEPINFER_CUDA_GEMM mode `gemm` (the fixture's mode restored).
    std::unique_ptr<Backend> profiled_backend(const char* gemm) {
        setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
        setenv("DEEPINFER_CUDA_GEMM", gemm, 1);
        std::unique_ptr<Backend> b = create_backend("cuda", 2);
        unsetenv("DEEPINFER_CUDA_PROFILE");
        setenv("DEEPINFER_CUDA_GEMM", gemm_, 1);
        return b;
    }
    // One weight as one plain product, at each row count.
    void check_linear(const HostWeight& hw, const std::vector<int64_t>& row_counts, const std::string& what,
                      DecodeGemv kernel = DecodeGemv::kWgmma) {
        const std::vector<HostWeight> w(1, hw);
        const std::vector<LinearWeight> d(1, to_backend(*gpu_, hw.w, &storage_));
        for (int64_t rows : row_counts)
            check(w, d, {{0, 0, hw.w.rows, 0, 0, 0}}, 1, rows, hw.w.cols, hw.w.rows, what, kernel);
    }
    // The FP8 mma GEMV's largest error against the CPU on bf16 inputs in the test, for the record.
    void TearDown() override {
        if (worst_fp8_mma_ > 0) std::printf("[ fp8 mma: worst relative error on bf16 inputs %.3g ]\n", worst_fp8_mma_);
    }

    std::mt19937_64 bits_;
    double worst_fp8_mma_ = 0;
};

std::vector<int64_t> every_row_count() {
    std::vector<int64_t> r;
    for (int64_t t = 2; t <= 32; ++t) r.push_back(t);
    return r;
}
const std::vector<int64_t> kSampleRows = {2, 8, 9, 16, 17, 31, 32, 33, 64, 65, 128};

// V4-Flash's single projections with E8M0 scales (the release format): wq_a and wkv (128-row tiles, K split over
// clusters of 8), wq_b (K = 1024: persistent CTAs over 128 tiles of 256 rows, no split), wo_b (K = 8192 split 8 ways).
TEST_F(CudaGemvWgmma, ModelShapes) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    struct Shape2 {
        const char* name;
        int64_t n, k;
    };
    for (const Shape2 s : {Shape2{"wq_a", 1024, 4096}, Shape2{"wkv", 512, 4096}, Shape2{"wq_b", 32768, 1024},
                           Shape2{"wo_b", 4096, 8192}})
        check_linear(fp8_weight(s.n, s.k, Scales::kE8m0), kSampleRows, s.name);
}

// wo_a: 8 groups of 1024 x 4096, group g reading x columns 4096 g .. (lda 32768) and writing output columns 1024 g ..
// (ldc 8192) from weight rows 1024 g .., in one launch; then the backend's grouped_linear (the wgmma kernel by default)
// against the CPU's.
TEST_F(CudaGemvWgmma, GroupedWoA) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const GroupedWeight w = wo_a();
    const int64_t groups = w.kGroups, r = w.kRows, k = w.kK;
    const std::vector<HostWeight>& hw = w.hw;
    const std::vector<LinearWeight>& dw = w.dw;
    for (int64_t rows : {2, 9, 17, 32, 40, 100})
        check(hw, dw, w.prods, 1, rows, groups * k, groups * r, "wo_a grouped");
    for (int64_t rows : {5, 32}) {
        const std::vector<float> xv = randn(rows * groups * k);
        Tensor x = host(xv, Shape{rows, groups * k}), xd = device(x);
        Tensor out = poisoned(Shape{rows, groups * r}), ref = Tensor::f32(Shape{rows, groups * r});
        gpu_->grouped_linear(out, xd, dw[0], static_cast<int>(groups));
        cpu_->grouped_linear(ref, x, hw[0].w, static_cast<int>(groups));
        EXPECT_LE(rel_error(fetch(out), values(ref)), kBf16Bound) << "grouped_linear, " << rows << " rows";
    }
}

// Every row count 2..32 with each scale kind: E8M0, E8M0 with large scales (warps on the conversion path), f32 (the
// conversion path throughout, rounding); the two tile heights (wq_a-like: 128-row tiles, K split 8 ways; wq_b-like:
// 256-row tiles, one a CTA, no split. 2048 x 1024 would take 128-row tiles split 8 ways too).
TEST_F(CudaGemvWgmma, ScaleKindsEveryRowCount) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    for (Scales s : {Scales::kE8m0, Scales::kE8m0Large, Scales::kF32}) {
        const std::string kind = s == Scales::kE8m0 ? "e8m0" : s == Scales::kF32 ? "f32 scales" : "large e8m0";
        check_linear(fp8_weight(1024, 4096, s), every_row_count(), "1024 x 4096, " + kind);
        check_linear(fp8_weight(32768, 1024, s), kSampleRows, "32768 x 1024, " + kind);
    }
}

// Features not a multiple of 64 (77, 200, 1), K of one 128-block (one stage, no split) and of three (splits of
// unequal length), more tiles than SMs without a split (on 132 SMs: 40000 x 128 in 313 tiles of 128 rows, the k
// halves' buffer reused from tile to tile; 65536 x 1024 in 256 tiles of 256 rows), the last tile partial.
TEST_F(CudaGemvWgmma, OddShapes) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    struct Shape2 {
        int64_t n, k;
    };
    for (const Shape2 s : {Shape2{77, 4096}, Shape2{200, 384}, Shape2{300, 128}, Shape2{1, 256}, Shape2{40000, 128}}) {
        const std::string what = std::to_string(s.n) + " x " + std::to_string(s.k);
        check_linear(fp8_weight(s.n, s.k, Scales::kE8m0), every_row_count(), what);
        check_linear(fp8_weight(s.n, s.k, Scales::kF32), {3, 24}, what + ", f32 scales");
    }
    check_linear(fp8_weight(65536 + 100, 1024, Scales::kE8m0), {2, 17, 32, 50, 97}, "65636 x 1024");
}

// Weights of e4m3 subnormal codes and zeros only (exponent bits 0: +-m 2^-9), which the fast decode turns into bf16
// subnormals before its bf16x2 multiply: were they flushed to zero, every output would be 0 (relative error 1), while
// in random codes they are too few and too small for the bounds to notice.
TEST_F(CudaGemvWgmma, SubnormalCodes) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    HostWeight h = fp8_weight(512, 1024, Scales::kE8m0);
    for (uint8_t& b : h.data) b &= 0x87;  // sign and mantissa kept, exponent cleared
    check_linear(h, {2, 8, 32}, "subnormal codes");
}

// Several products in one launch: two inputs (x columns at an offset, lda > K), weight row offsets that are not
// multiples of 16 or 128 (a warp's rows straddle scale blocks), outputs at column offsets with gaps between them (which
// stay NaN); then 11 products (more than one launch holds).
TEST_F(CudaGemvWgmma, SeveralProductsInOneLaunch) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const int64_t k = 512;
    for (Scales s : {Scales::kE8m0, Scales::kF32}) {
        std::vector<HostWeight> hw;
        for (int64_t n : {700, 256, 1000}) hw.push_back(fp8_weight(n, k, s));
        std::vector<LinearWeight> dw;
        for (const HostWeight& h : hw) dw.push_back(to_backend(*gpu_, h.w, &storage_));
        const std::vector<Product> four = {
            {0, 40, 600, 0, 0, 0}, {1, 0, 256, 1, 100, 610}, {2, 200, 77, 0, 0, 900}, {2, 513, 300, 1, 37, 1000}};
        for (int64_t rows : kSampleRows) check(hw, dw, four, 2, rows, k + 100, 1310, "four products");
        std::vector<Product> many;
        for (int i = 0; i < 11; ++i) many.push_back({i % 3, 8 * i, 100 + 3 * i, i % 2, 8 * i, 200 * i});
        for (int64_t rows : {4, 32}) check(hw, dw, many, 2, rows, k + 100, 2200, "11 products");
    }
}

// DEEPINFER_CUDA_DECODE_GEMV: wgmma (the default) runs the wgmma GEMV for FP8 products of 2..128 rows (bitwise what
// run_decode_gemv_sync gives), tc the mma.sync one at 2..32 rows (likewise); the two agree; the profile names the
// kernel that ran; linears with FP8 and BF16 projections take both (above 32 rows the wgmma GEMV and the mma.sync
// GEMM); batch-invariant and tiled modes take neither; a bad value is refused.
TEST_F(CudaGemvWgmma, BackendSwitch) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const HostWeight hw = fp8_weight(1024, 4096, Scales::kE8m0);
    const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
    const int64_t rows = 8;
    const std::vector<float> xv = randn(rows * 4096);
    Tensor x = host(xv, Shape{rows, 4096}), xd = device(x);
    gpu_->synchronize();  // the other backends read x and the weights on their own streams
    auto direct = [&](DecodeGemv kernel) {
        Tensor out = poisoned(Shape{rows, 1024});
        gpu_->synchronize();
        cuda::run_decode_gemv_sync(kernel, {{out.f32(), 1024, xd.f32(), 4096, &dw, 0, 1024}}, rows);
        return fetch(out);
    };
    setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
    setenv("DEEPINFER_CUDA_DECODE_GEMV", "tc", 1);
    const std::unique_ptr<Backend> tc = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_DECODE_GEMV");
    const std::unique_ptr<Backend> wg = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_PROFILE");
    auto linear = [&](Backend& b) {
        Tensor out = b.alloc(DType::kF32, Shape{rows, 1024});
        b.take_profile();
        b.linear(out, xd, dw);
        std::vector<float> v(rows * 1024);
        b.download(v.data(), out);
        return v;
    };
    const std::vector<float> by_tc = linear(*tc), by_wg = linear(*wg);
    const std::string tc_profile = tc->take_profile(), wg_profile = wg->take_profile();
    EXPECT_EQ(by_tc, direct(DecodeGemv::kTc)) << "DEEPINFER_CUDA_DECODE_GEMV=tc";
    EXPECT_EQ(by_wg, direct(DecodeGemv::kWgmma)) << "the default";
    EXPECT_LE(rel_error(by_wg, by_tc), kSameInputsBound);
    EXPECT_NE(tc_profile.find("matmul gemv tensor cores 2-16 rows"), std::string::npos) << tc_profile;
    EXPECT_EQ(tc_profile.find("matmul gemv wgmma"), std::string::npos) << tc_profile;
    EXPECT_NE(wg_profile.find("matmul gemv wgmma 2-32 rows"), std::string::npos) << wg_profile;
    EXPECT_EQ(wg_profile.find("matmul gemv tensor cores"), std::string::npos) << wg_profile;

    // linears: FP8, FP8, BF16, FP8 of one input: the first two share a wgmma launch, BF16 takes the mma.sync GEMV.
    const HostWeight f2 = fp8_weight(512, 4096, Scales::kE8m0), f3 = fp8_weight(96, 4096, Scales::kF32);
    const HostWeight b16 = testing_support::make_weight(rng_, 1, 64, 4096);
    const std::vector<const HostWeight*> hws = {&hw, &f2, &b16, &f3};
    std::vector<LinearWeight> dws = {dw};
    for (size_t i = 1; i < hws.size(); ++i) dws.push_back(to_backend(*gpu_, hws[i]->w, &storage_));
    gpu_->synchronize();
    std::vector<Tensor> outs, refs;
    std::vector<Backend::Projection> gp, cp;
    for (size_t i = 0; i < hws.size(); ++i) {
        outs.push_back(wg->alloc(DType::kF32, Shape{rows, hws[i]->w.rows}));
        refs.push_back(Tensor::f32(Shape{rows, hws[i]->w.rows}));
    }
    for (size_t i = 0; i < hws.size(); ++i) {
        gp.push_back({outs[i], &dws[i]});
        cp.push_back({refs[i], &hws[i]->w});
    }
    wg->take_profile();
    wg->linears(xd, gp);
    cpu_->linears(x, cp);
    const std::string mixed = wg->take_profile();
    for (size_t i = 0; i < hws.size(); ++i) {
        std::vector<float> v(outs[i].numel());
        wg->download(v.data(), outs[i]);
        EXPECT_LE(rel_error(v, values(refs[i])), kBf16Bound) << "linears, projection " << i;
    }
    EXPECT_NE(mixed.find("matmul gemv wgmma 2-32 rows"), std::string::npos) << mixed;
    EXPECT_NE(mixed.find("matmul gemv tensor cores 2-16 rows"), std::string::npos) << mixed;

    // 33..128 rows: FP8 on the wgmma GEMV (a launch per 64 rows), the BF16 projection on the mma.sync GEMM; under
    // DEEPINFER_CUDA_DECODE_GEMV=tc and in batch-invariant mode no wgmma.
    {
        const int64_t many = 100;
        const std::vector<float> xm = randn(many * 4096);
        const Tensor xh = host(xm, Shape{many, 4096}), xmd = device(xh);
        gpu_->synchronize();
        auto project = [&](Backend& b, std::vector<std::vector<float>>* got) {
            std::vector<Tensor> outs_m;
            std::vector<Backend::Projection> gp_m;
            for (size_t i = 0; i < hws.size(); ++i) outs_m.push_back(b.alloc(DType::kF32, Shape{many, hws[i]->w.rows}));
            for (size_t i = 0; i < hws.size(); ++i) gp_m.push_back({outs_m[i], &dws[i]});
            b.take_profile();
            b.linears(xmd, gp_m);
            for (Tensor& o : outs_m) {
                std::vector<float> v(o.numel());
                b.download(v.data(), o);
                if (got) got->push_back(v);
            }
            return b.take_profile();
        };
        std::vector<std::vector<float>> got_m;
        const std::string wide = project(*wg, &got_m);
        for (size_t i = 0; i < hws.size(); ++i) {
            Tensor ref = Tensor::f32(Shape{many, hws[i]->w.rows});
            cpu_->linear(ref, xh, hws[i]->w);
            EXPECT_LE(rel_error(got_m[i], values(ref)), kBf16Bound)
                << "linears at " << many << " rows, projection " << i;
        }
        EXPECT_NE(wide.find("matmul gemv wgmma 33-128 rows"), std::string::npos) << wide;
        EXPECT_NE(wide.find("matmul tensor cores"), std::string::npos) << wide;
        const std::string wide_tc = project(*tc, nullptr);
        EXPECT_EQ(wide_tc.find("wgmma"), std::string::npos) << wide_tc;
        wg->set_batch_invariant(true);
        const std::string wide_invariant = project(*wg, nullptr);
        wg->set_batch_invariant(false);
        EXPECT_EQ(wide_invariant.find("wgmma"), std::string::npos) << wide_invariant;
    }

    // Batch-invariant mode keeps the tensor-core GEMM for every row count; tiled mode the fp32 GEMV.
    wg->set_batch_invariant(true);
    linear(*wg);
    const std::string invariant = wg->take_profile();
    wg->set_batch_invariant(false);
    EXPECT_EQ(invariant.find("matmul gemv"), std::string::npos) << invariant;
    const std::unique_ptr<Backend> tiled = profiled_backend("tiled");
    linear(*tiled);
    const std::string tiled_profile = tiled->take_profile();
    EXPECT_EQ(tiled_profile.find("wgmma"), std::string::npos) << tiled_profile;
    EXPECT_NE(tiled_profile.find("matmul gemv 2-8 rows"), std::string::npos) << tiled_profile;

    setenv("DEEPINFER_CUDA_DECODE_GEMV", "mma", 1);
    EXPECT_THROW(create_backend("cuda", 2), Error);
    unsetenv("DEEPINFER_CUDA_DECODE_GEMV");
}

// The FP8 mma GEMV at 1..4 rows: V4-Flash's projections, each scale kind, odd shapes (features not a multiple of 16,
// K of one and three 128-blocks, more CTAs than fit at once) and subnormal weight codes.
TEST_F(CudaGemvWgmma, Fp8MmaShapes) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const std::vector<int64_t> rows = {1, 2, 3, 4};
    struct Shape2 {
        const char* name;
        int64_t n, k;
    };
    for (const Shape2 s : {Shape2{"wq_a", 1024, 4096}, Shape2{"wkv", 512, 4096}, Shape2{"wq_b", 32768, 1024},
                           Shape2{"wo_b", 4096, 8192}, Shape2{"77 x 4096", 77, 4096}, Shape2{"200 x 384", 200, 384},
                           Shape2{"300 x 128", 300, 128}, Shape2{"40000 x 128", 40000, 128}})
        check_linear(fp8_weight(s.n, s.k, Scales::kE8m0), rows, s.name, DecodeGemv::kFp8Mma);
    for (Scales s : {Scales::kE8m0Large, Scales::kF32})
        check_linear(fp8_weight(1024, 4096, s), rows, s == Scales::kF32 ? "f32 scales" : "large e8m0",
                     DecodeGemv::kFp8Mma);
    HostWeight sub = fp8_weight(512, 1024, Scales::kE8m0);
    for (uint8_t& b : sub.data) b &= 0x87;
    check_linear(sub, {1, 4}, "subnormal codes", DecodeGemv::kFp8Mma);
}

// The FP8 mma GEMV's grouped wo_a and several products of two inputs in one launch (weight row offsets that are not
// multiples of 16 or 128, gaps between the output columns), and more products than a launch holds.
TEST_F(CudaGemvWgmma, Fp8MmaSeveralProducts) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    {
        const GroupedWeight w = wo_a();
        for (int64_t rows : {1, 4})
            check(w.hw, w.dw, w.prods, 1, rows, w.kGroups * w.kK, w.kGroups * w.kRows, "wo_a grouped",
                  DecodeGemv::kFp8Mma);
    }
    for (Scales s : {Scales::kE8m0, Scales::kF32}) {
        std::vector<HostWeight> hw;
        for (int64_t n : {700, 256, 1000}) hw.push_back(fp8_weight(n, 512, s));
        std::vector<LinearWeight> dw;
        for (const HostWeight& h : hw) dw.push_back(to_backend(*gpu_, h.w, &storage_));
        const std::vector<Product> four = {
            {0, 40, 600, 0, 0, 0}, {1, 0, 256, 1, 100, 610}, {2, 200, 77, 0, 0, 900}, {2, 513, 300, 1, 37, 1000}};
        for (int64_t rows : {1, 2, 4}) check(hw, dw, four, 2, rows, 612, 1310, "four products", DecodeGemv::kFp8Mma);
        std::vector<Product> many;
        for (int i = 0; i < 11; ++i) many.push_back({i % 3, 8 * i, 100 + 3 * i, i % 2, 8 * i, 200 * i});
        for (int64_t rows : {1, 3}) check(hw, dw, many, 2, rows, 612, 2200, "11 products", DecodeGemv::kFp8Mma);
    }
}

// Activations over a wide range: normal draws times 2^u, u uniform in [-20, 12] per element, a tenth exact zeros, so
// that many elements lie more than 2^14 below their block's largest; then rows of zeros but five elements.
TEST_F(CudaGemvWgmma, Fp8MmaWideRangeActivations) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const HostWeight hw = fp8_weight(1024, 4096, Scales::kE8m0);
    const std::vector<HostWeight> w(1, hw);
    const std::vector<LinearWeight> d(1, to_backend(*gpu_, hw.w, &storage_));
    std::mt19937 g(7);
    auto wide = [&](int64_t n) {
        std::vector<float> v = randn(n);
        std::uniform_int_distribution<int> e(-20, 12), z(0, 9);
        for (float& x : v) x = z(g) == 0 ? 0.0f : std::ldexp(x, e(g));
        return v;
    };
    auto sparse = [&](int64_t n) {
        std::vector<float> v(n, 0.0f);
        std::uniform_int_distribution<int64_t> at(0, n - 1);
        for (int i = 0; i < 5; ++i) v[at(g)] = std::ldexp(1.5f, 3 * i - 6);
        return v;
    };
    for (int64_t rows : {1, 4}) {
        check(w, d, {{0, 0, 1024, 0, 0, 0}}, 1, rows, 4096, 1024, "wide range", DecodeGemv::kFp8Mma, wide);
        check(w, d, {{0, 0, 1024, 0, 0, 0}}, 1, rows, 4096, 1024, "sparse", DecodeGemv::kFp8Mma, sparse);
    }
}

// The backend's FP8 products at 1..4 rows (DEEPINFER_CUDA_GEMV_FP8_MMA, read at each call): 2..4 rows on the FP8 mma
// GEMV by default (bitwise its direct launch), one row on the fp32 GEMV unless it is 1; under 0 the wgmma GEMV at 2..4
// rows; neither in batch-invariant and tiled modes; a bad value refused.
TEST_F(CudaGemvWgmma, Fp8MmaBackendSwitch) {
    if (!wgmma_device()) GTEST_SKIP() << "not a compute capability 9.0 device";
    const HostWeight hw = fp8_weight(1024, 4096, Scales::kE8m0);
    const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
    const std::vector<float> xv = randn(4 * 4096);
    Tensor xd = device(host(xv, Shape{4, 4096}));
    const std::unique_ptr<Backend> b = profiled_backend(gemm_);
    gpu_->synchronize();
    auto linear = [&](int64_t n) {
        Tensor out = b->alloc(DType::kF32, Shape{n, 1024});
        b->take_profile();
        b->linear(out, TensorView(xd.f32(), DType::kF32, Shape{n, 4096}), dw);
        std::vector<float> v(n * 1024);
        b->download(v.data(), out);
        return v;
    };
    {
        linear(1);  // the default at one row: the fp32 GEMV
        const std::string profile = b->take_profile();
        EXPECT_EQ(profile.find("fp8 mma"), std::string::npos) << profile;
        EXPECT_NE(profile.find("matmul gemv 1 row"), std::string::npos) << profile;
    }
    for (int64_t n : {1, 3}) {
        if (n == 1) setenv("DEEPINFER_CUDA_GEMV_FP8_MMA", "1", 1);
        const std::vector<float> got = linear(n);
        unsetenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
        const std::string profile = b->take_profile();
        Tensor out = poisoned(Shape{n, 1024});
        gpu_->synchronize();
        cuda::run_decode_gemv_sync(DecodeGemv::kFp8Mma, {{out.f32(), 1024, xd.f32(), 4096, &dw, 0, 1024}}, n);
        EXPECT_EQ(got, fetch(out)) << n << " rows";
        EXPECT_NE(profile.find("matmul gemv fp8 mma 1-4 rows"), std::string::npos) << profile;
        setenv("DEEPINFER_CUDA_GEMV_FP8_MMA", "0", 1);
        const std::vector<float> off = linear(n);
        const std::string off_profile = b->take_profile();
        unsetenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
        EXPECT_EQ(off_profile.find("fp8 mma"), std::string::npos) << off_profile;
        EXPECT_NE(off_profile.find(n == 1 ? "matmul gemv 1 row" : "matmul gemv wgmma 2-32 rows"), std::string::npos)
            << off_profile;
        EXPECT_LE(rel_error(got, off), n == 1 ? kBf16Bound : kFp8MmaBound) << n << " rows, against the GEMV before";
    }
    b->set_batch_invariant(true);
    setenv("DEEPINFER_CUDA_GEMV_FP8_MMA", "1", 1);
    std::string invariant;
    for (int64_t n : {1, 3}) {
        linear(n);
        invariant += b->take_profile();
    }
    unsetenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
    b->set_batch_invariant(false);
    EXPECT_EQ(invariant.find("fp8 mma"), std::string::npos) << invariant;
    const std::unique_ptr<Backend> tiled = profiled_backend("tiled");
    Tensor out = tiled->alloc(DType::kF32, Shape{1, 1024});
    tiled->take_profile();
    setenv("DEEPINFER_CUDA_GEMV_FP8_MMA", "1", 1);
    tiled->linear(out, TensorView(xd.f32(), DType::kF32, Shape{1, 4096}), dw);
    unsetenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
    tiled->synchronize();
    EXPECT_EQ(tiled->take_profile().find("fp8 mma"), std::string::npos);
    setenv("DEEPINFER_CUDA_GEMV_FP8_MMA", "yes", 1);
    EXPECT_THROW(linear(3), Error);
    unsetenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
}

// gemv_wgmma_applies: FP8 with 128 x 128 scales (E8M0 or f32) and K a multiple of 128 at 2..128 rows on a compute
// capability 9.0 device; not FP4, BF16, FP8 with 32 x 32 scales, K = 192 (one and a half scale blocks), 1 or 129 rows.
TEST_F(CudaGemvWgmma, AppliesPredicate) {
    const bool hopper = wgmma_device();
    const HostWeight e8m0 = fp8_weight(200, 256, Scales::kE8m0), f32 = fp8_weight(200, 256, Scales::kF32);
    for (const HostWeight* h : {&e8m0, &f32}) {
        const LinearWeight d = to_backend(*gpu_, h->w, &storage_);
        for (int64_t rows : {2, 9, 32, 33, 64, 128})
            EXPECT_EQ(cuda::gemv_wgmma_applies(rows, d), hopper) << rows << " rows";
        for (int64_t rows : {0, 1, 129, 256}) EXPECT_FALSE(cuda::gemv_wgmma_applies(rows, d)) << rows << " rows";
        for (int64_t rows : {1, 2, 4}) EXPECT_EQ(cuda::gemv_fp8_mma_applies(rows, d), hopper) << rows << " rows, mma";
        for (int64_t rows : {0, 5, 32}) EXPECT_FALSE(cuda::gemv_fp8_mma_applies(rows, d)) << rows << " rows, mma";
    }
    struct Kind {
        int format;  // make_weight's
        int64_t k;
    };
    for (const Kind kd : {Kind{4, 256}, Kind{1, 256}, Kind{0, 256}, Kind{2, 256}, Kind{6, 192}, Kind{3, 192}}) {
        const HostWeight h = testing_support::make_weight(rng_, kd.format, 128, kd.k);
        const LinearWeight d = to_backend(*gpu_, h.w, &storage_);
        for (int64_t rows : {2, 8, 32})
            EXPECT_FALSE(cuda::gemv_wgmma_applies(rows, d)) << "format " << kd.format << ", k " << kd.k;
        for (int64_t rows : {1, 4})
            EXPECT_FALSE(cuda::gemv_fp8_mma_applies(rows, d)) << "format " << kd.format << ", k " << kd.k << ", mma";
    }
}

}  // namespace
}  // namespace deepinfer
