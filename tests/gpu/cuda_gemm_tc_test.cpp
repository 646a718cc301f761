// The bf16 products for more than 8 rows against the CPU op on fresh random inputs, output poisoned with NaN:
// the tensor-core kernel (DEEPINFER_CUDA_GEMM=tc) and cuBLAS (DEEPINFER_CUDA_GEMM=cublas, which takes every such
// product; auto, the default, takes it from kCublasMinRows rows). Two bounds on max |cuda - cpu| / max |cpu|:
//  - 3e-2, the tolerance table's GPU (bf16 activations) vs CPU bound, for every weight kind;
//  - 1e-4 against the CPU product of the same bf16-rounded activations, for weights exact in bf16 (BF16, and
//    FP8/FP4 with E8M0 scales): then only the fp32 summation order differs, so a wrong scale, a dropped K chunk
//    or a misplaced tile (each well over 1e-2) cannot hide under the looser bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemm_policy.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "deepinfer/error.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;
using testing_support::kBf16Bound;
using testing_support::kSameInputsBound;

// The checks shared by the kernels; the fixtures below pick the DEEPINFER_CUDA_GEMM mode.
class GemmCompare : public testing_support::CudaCompare {
public:
    explicit GemmCompare(const char* mode) : CudaCompare(mode) {}

protected:
    // out [t, n] = x [t, groups * k] . W [n, k]^T in `groups` diagonal blocks (1: a plain linear).
    // same_inputs: the product takes bf16 activations (false where the fp32 GEMV takes it: then only the
    // table's bound applies).
    void check(int format, int64_t t, int64_t n, int64_t k, int64_t groups = 1, bool same_inputs = true) {
        HostWeight hw = make_weight(rng_, format, n, k);
        const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
        check(format, hw, dw, t, groups, same_inputs);
    }
    // The same for a weight made once (hw on the host, dw its device copy) and used at several row counts.
    void check(int format, const HostWeight& hw, const LinearWeight& dw, int64_t t, int64_t groups = 1,
               bool same_inputs = true) {
        const int64_t n = hw.w.rows, k = hw.w.cols;
        std::vector<float> xv = randn(t * groups * k);
        auto product = [&](Backend& b, Tensor& out, TensorView x, const LinearWeight& w) {
            if (groups == 1) b.linear(out, x, w);
            else b.grouped_linear(out, x, w, static_cast<int>(groups));
        };
        Tensor x = host(xv, Shape{t, groups * k}), xd = device(x);
        Tensor out = poisoned(Shape{t, n}), ref = Tensor::f32(Shape{t, n});
        product(*gpu_, out, xd, dw);
        product(*cpu_, ref, x, hw.w);
        const std::vector<float> got = fetch(out);
        const double err = rel_error(got, values(ref));
        EXPECT_LE(err, kBf16Bound) << "format " << format << " t " << t << " n " << n << " k " << k;
        // Weights exact in bf16: BF16, FP8 with E8M0 scales (2, 6), FP4.
        if (same_inputs && (format == 1 || format == 2 || format == 4 || format == 6)) {
            for (float& v : xv) v = round_to_bf16(v);
            Tensor xr = host(xv, Shape{t, groups * k}), ref16 = Tensor::f32(Shape{t, n});
            product(*cpu_, ref16, xr, hw.w);
            EXPECT_LE(rel_error(got, values(ref16)), kSameInputsBound)
                << "format " << format << " t " << t << " n " << n << " k " << k;
        }
    }

    // Every weight kind (see make_weight) and row count. n = 300, k = 400 end in partial N and K tiles on the
    // vector loaders (FP4 takes k = 416: its K must be whole groups of 32, as the weight loader requires, so it
    // never ends in a partial K step); k = 100 (not a multiple of 16, nor of 8) takes the element-wise loader (not
    // FP4, likewise); n = 1100 at 2048 rows fills the GPU with 128x128 tc tiles, n = 600 only with 128x64 ones
    // (80 and 160 tiles; 114 to 132 SMs); k = 4096 at 9 and 64 rows splits K (tc; cuBLAS may too).
    void every_kind_and_row_count() {
        for (int format = 0; format < 7; ++format) {
            for (int64_t t : {9, 64, 300, 2048}) {
                check(format, t, 300, format == 4 ? 416 : 400);
                if (format != 4) check(format, t, 77, 100);
            }
            check(format, 2048, 1100, 512);
            check(format, 2048, 600, 512);
            check(format, 9, 200, 4096);
            check(format, 64, 200, 4096);
        }
    }

    // In batch-invariant mode a row's product is bitwise the same alone, in a sub-batch of 10 rows or among all
    // `t` rows, although the tile shape changes with the row count (128x128 at 2048 rows, 64x64 for 10) and the
    // row sits at another position in its MMA tile; K = 4096 at 300 rows would split K outside this mode.
    void batch_invariant_mode_ignores_row_count() {
        struct Case {
            int format;
            int64_t t, n, k;
        };
        for (const Case c : {Case{6, 2048, 1100, 512}, Case{4, 300, 200, 4096}, Case{0, 64, 77, 100}}) {
            HostWeight hw = make_weight(rng_, c.format, c.n, c.k);
            const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
            Tensor x = host(randn(c.t * c.k), Shape{c.t, c.k}), xd = device(x);
            const int64_t r0 = c.t / 2 - 5;
            Tensor all = poisoned(Shape{c.t, c.n}), sub = poisoned(Shape{10, c.n}), one = poisoned(Shape{1, c.n});
            gpu_->set_batch_invariant(true);
            gpu_->linear(all, xd, dw);
            gpu_->linear(sub, xd.view().slice_rows(r0, r0 + 10), dw);
            gpu_->linear(one, xd.view().slice_rows(c.t - 1, c.t), dw);
            gpu_->set_batch_invariant(false);
            const std::vector<float> a = fetch(all), s = fetch(sub), o = fetch(one);
            EXPECT_EQ(std::vector<float>(a.begin() + r0 * c.n, a.begin() + (r0 + 10) * c.n), s)
                << "format " << c.format;
            EXPECT_EQ(std::vector<float>(a.end() - c.n, a.end()), o) << "format " << c.format;
            Tensor ref = Tensor::f32(Shape{c.t, c.n});
            cpu_->linear(ref, x, hw.w);
            EXPECT_LE(rel_error(a, values(ref)), kBf16Bound) << "format " << c.format;
        }
    }
};

class CudaGemmTc : public GemmCompare {
public:
    CudaGemmTc() : GemmCompare("tc") {}
};

class CudaGemmCublas : public GemmCompare {
public:
    CudaGemmCublas() : GemmCompare("cublas") {}
};

class CudaGemmAuto : public GemmCompare {
public:
    CudaGemmAuto() : GemmCompare("auto") {}
};

TEST_F(CudaGemmTc, EveryKindAndRowCount) { every_kind_and_row_count(); }

// The block-diagonal product: activation rows strided by groups * k, weight rows offset per group.
TEST_F(CudaGemmTc, GroupedLinear) {
    for (int format : {1, 4, 6}) {
        for (int64_t t : {9, 300}) check(format, t, 4 * 96, 160, 4);
    }
}

TEST_F(CudaGemmTc, BatchInvariantModeIgnoresRowCount) { batch_invariant_mode_ignores_row_count(); }

// cuBLAS from 9 rows up: x rounded to bf16 into a scratch with rows padded to 8 (k = 100 pads to 104), every
// weight kind dequantized into bf16 (BF16 read in place; k = 100 and k % 16 != 0 take the element-wise
// dequantization), then one cublasGemmEx.
TEST_F(CudaGemmCublas, EveryKindAndRowCount) { every_kind_and_row_count(); }

// Grouped: each group's weight rows start at g * 96 (w_row0 != 0; in place for BF16, dequantized otherwise) and
// its outputs land at column g * 96 of rows strided by 4 * 96 (ldc != n_out).
TEST_F(CudaGemmCublas, GroupedLinear) {
    for (int format : {0, 1, 2, 4, 5, 6}) {
        for (int64_t t : {9, 300}) check(format, t, 4 * 96, 160, 4);
    }
}

// A weight whose bf16 copy (33000 x 4096 x 2 bytes = 270 MB) exceeds kCublasScratchBytes (256 MB): dequantized
// and multiplied in chunks of 32768 weight rows, the last one partial (232 rows).
TEST_F(CudaGemmCublas, ChunkedLargeWeight) {
    for (int format : {4, 6}) check(format, 9, 33000, 4096);
}

// Batch-invariant mode ignores the cublas mode (cuBLAS picks algorithms per shape): the tc kernel without split-K.
TEST_F(CudaGemmCublas, BatchInvariantModeIgnoresRowCount) { batch_invariant_mode_ignores_row_count(); }

// The default: the tc kernel below kCublasMinRows (128) rows, cuBLAS from there.
TEST_F(CudaGemmAuto, BothSidesOfTheThreshold) {
    for (int format : {1, 4, 6}) {
        for (int64_t t : {64, 127, 128, 300}) check(format, t, 300, format == 4 ? 416 : 400);
        check(format, 300, 4 * 96, 160, 4);
    }
}

// A BF16 weight of kCublasBf16MinFeatures rows (the head's kind) goes to cuBLAS from 2 rows (read in place); a
// narrower one stays on the tensor-core GEMV. Both against the CPU.
TEST_F(CudaGemmAuto, WideBf16WeightsOnCublas) {
    const HostWeight wide = make_weight(rng_, 1, cuda::kCublasBf16MinFeatures, 256);
    const LinearWeight wide_d = to_backend(*gpu_, wide.w, &storage_);
    for (int64_t t : {2, 8, 17, 32}) check(1, wide, wide_d, t);
    for (int64_t t : {2, 32}) check(1, t, cuda::kCublasBf16MinFeatures - 8, 256);
}

// grouped_linear from a BF16 input where takes_bf16_inputs holds (cuBLAS's rows: V4's attention output written in
// bf16 for wo_a) is bitwise the product of the F32 input it rounds (both make the same cuBLAS calls from one bf16
// copy at row stride groups x K), and within kSameInputsBound of the CPU's on the rounded input: FP8 at 4 groups of
// K 512, and wo_a's shape in V4-Flash (8 groups of K 4096, 1024 features each; each group's input read at a row
// stride of 32,768). Fewer rows (the GEMVs and the tc kernel compute from f32) answer false, and a BF16 input there
// is an error.
TEST_F(CudaGemmAuto, GroupedLinearTakesBf16Inputs) {
    struct Case {
        int format;
        int64_t t, features, k, groups;
    };
    for (const Case& cs : {Case{6, 300, 256, 512, 4}, Case{6, 256, 1024, 4096, 8}}) {
        const std::string what = "K " + std::to_string(cs.k) + ", " + std::to_string(cs.groups) + " groups";
        const HostWeight hw = make_weight(rng_, cs.format, cs.groups * cs.features, cs.k);
        const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
        EXPECT_TRUE(gpu_->takes_bf16_inputs(cs.t, dw)) << what;
        EXPECT_FALSE(gpu_->takes_bf16_inputs(cuda::kCublasMinRows - 1, dw)) << what;
        const int64_t cols = cs.groups * cs.k;
        std::vector<float> xv = randn(cs.t * cols);
        std::vector<uint16_t> bits(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) bits[i] = f32_to_bf16(xv[i]);
        Tensor x32 = device(host(xv, Shape{cs.t, cols})), x16 = gpu_->alloc(DType::kBF16, Shape{cs.t, cols});
        gpu_->upload(x16, bits.data());
        Tensor from32 = poisoned(Shape{cs.t, hw.w.rows}), from16 = poisoned(Shape{cs.t, hw.w.rows});
        gpu_->grouped_linear(from32, x32, dw, static_cast<int>(cs.groups));
        gpu_->grouped_linear(from16, x16, dw, static_cast<int>(cs.groups));
        const std::vector<float> got = fetch(from16);
        EXPECT_EQ(got, fetch(from32)) << what;
        for (float& v : xv) v = round_to_bf16(v);
        Tensor ref = Tensor::f32(Shape{cs.t, hw.w.rows});
        cpu_->grouped_linear(ref, host(xv, Shape{cs.t, cols}), hw.w, static_cast<int>(cs.groups));
        EXPECT_LE(rel_error(got, values(ref)), kSameInputsBound) << what;

        const int64_t few = 8;
        Tensor small16 = gpu_->alloc(DType::kBF16, Shape{few, cols}), small_out = poisoned(Shape{few, hw.w.rows});
        gpu_->upload(small16, bits.data());
        EXPECT_THROW(gpu_->grouped_linear(small_out, small16, dw, static_cast<int>(cs.groups)), Error) << what;
    }
}

// Backend::linears' cuBLAS products (the default mode from kCublasMinRows rows) share one bf16 copy of x, made as
// each product's own call would make it: every output bitwise linear()'s alone. Those may write BF16 outs. K 520 (FP8
// scale blocks cut short; BF16 read in place; FP8 of 32-wide blocks) at 300 rows (all on cuBLAS) and at 8 (the GEMVs:
// the shared launches).
TEST_F(CudaGemmAuto, LinearsShareTheirInputsConversion) {
    const int64_t k = 520;
    std::vector<HostWeight> hw;
    std::vector<LinearWeight> dw;
    for (const int format : {6, 1, 2, 6})
        hw.push_back(make_weight(rng_, format, 128 + 64 * static_cast<int64_t>(hw.size()), k));
    for (HostWeight& h : hw) dw.push_back(to_backend(*gpu_, h.w, &storage_));
    for (const int64_t t : {300, 8}) {
        Tensor xd = device(host(randn(t * k), Shape{t, k}));
        std::vector<Tensor> shared, alone;
        std::vector<Backend::Projection> ps;
        for (size_t i = 0; i < hw.size(); ++i) {
            shared.push_back(poisoned(Shape{t, hw[i].w.rows}));
            alone.push_back(poisoned(Shape{t, hw[i].w.rows}));
            ps.push_back({shared[i], &dw[i]});
            gpu_->linear(alone[i], xd, dw[i]);
        }
        gpu_->linears(xd, ps);
        for (size_t i = 0; i < hw.size(); ++i)
            EXPECT_EQ(fetch(shared[i]), fetch(alone[i])) << "projection " << i << ", " << t << " rows";

        // A BF16 out where the product takes bf16 inputs (cuBLAS's rows): the fp32 sums rounded once, within half a
        // bf16 step of linear()'s f32 out (cuBLAS may pick another algorithm for it: a little more), and an error
        // where the product's GEMV cannot write one.
        Tensor b16 = gpu_->alloc(DType::kBF16, Shape{t, hw[0].w.rows});
        std::vector<Backend::Projection> mixed = {{b16, &dw[0]}, {shared[1], &dw[1]}};
        if (!gpu_->takes_bf16_inputs(t, dw[0])) {
            EXPECT_THROW(gpu_->linears(xd, mixed), Error) << t << " rows";
            continue;
        }
        gpu_->linears(xd, mixed);
        std::vector<uint16_t> bits(static_cast<size_t>(b16.numel()));
        gpu_->download(bits.data(), b16);
        const std::vector<float> f = fetch(alone[0]);
        double most = 0;
        for (float v : f) most = std::max(most, static_cast<double>(std::fabs(v)));
        int64_t outside = 0;
        for (size_t j = 0; j < bits.size(); ++j)
            outside += std::fabs(bf16_to_f32(bits[j]) - f[j]) > std::ldexp(std::fabs(f[j]), -8) + 1e-6 * most;
        EXPECT_EQ(outside, 0) << t << " rows: bf16 outputs beyond half a step of the f32 ones";
        EXPECT_EQ(fetch(shared[1]), fetch(alone[1])) << t << " rows: the f32 projection beside the bf16 one";
    }
}

// 2..32 rows in the bf16 modes take the tensor-core GEMV (gemv_tc.cu; 17..32 rows on two MMA row tiles): every
// weight kind (FP8 with 32-wide scale blocks, smaller than its 64-wide k blocks, stays on the fp32 GEMV up to 8
// rows and takes the tensor-core GEMM above). n = 77 ends in a partial tile of 32 features; k = 4096 with 40
// features and k = 8192 (staged in slices of 2048 over 4 ranks, or of 1024 over 8 above 16 rows) split K over a
// cluster; n = 5000 makes blocks loop over tiles; k = 128 is one k block of FP4.
TEST_F(CudaGemmTc, GemvTensorCoresEveryKindAndRowCount) {
    struct Shape2 {
        int64_t n, k;
    };
    for (int format = 0; format < 7; ++format) {
        for (Shape2 s : {Shape2{77, 256}, Shape2{40, 4096}, Shape2{300, 8192}, Shape2{5000, 128}}) {
            const HostWeight hw = make_weight(rng_, format, s.n, s.k);  // once per shape: most of the time
            const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
            for (int64_t t = 2; t <= 32; ++t)
                check(format, hw, dw, t, 1, format != 2 || t > 8);  // format 2 up to 8 rows: the fp32 GEMV
        }
    }
}

// Grouped at decode row counts, the groups sharing a launch: per group w_row0 = g * 96 and ldc = 4 * 96. With
// 4 x 5000 features a block's contiguous range of tiles crosses from one group (one staged input) into the next.
TEST_F(CudaGemmTc, GemvTensorCoresGrouped) {
    for (int format : {1, 4, 6}) {
        for (int64_t t : {2, 5, 8, 9, 16, 17, 24, 32}) check(format, t, 4 * 96, 256, 4);
        for (int64_t t : {3, 24}) check(format, t, 4 * 5000, 256, 4);
    }
}

// Backend::linears: several weights of one input. On the fp32 GEMV (1 row, and every row count in tiled mode)
// and on the tensor-core GEMVs (2..32 rows in tc mode; FP8 up to 128 rows on wgmma) the compatible ones share a
// launch (here FP8 of two heights, then BF16, then FP8 again: three launches); the others run as linear() does.
class CudaLinears : public GemmCompare {
public:
    explicit CudaLinears(const char* mode = "tiled") : GemmCompare(mode) {}

protected:
    void check_projections(double bound) {
        const int64_t k = 1024;
        struct Spec {
            int format;
            int64_t n;
        };
        const Spec specs[] = {{6, 512}, {6, 1536}, {1, 64}, {6, 96}};
        std::vector<HostWeight> hw;
        std::vector<LinearWeight> dw;
        for (const Spec& sp : specs) hw.push_back(make_weight(rng_, sp.format, sp.n, k));
        for (HostWeight& h : hw) dw.push_back(to_backend(*gpu_, h.w, &storage_));
        for (int64_t t : {1, 3, 8, 20, 32, 40}) {
            Tensor x = host(randn(t * k), Shape{t, k}), xd = device(x);
            std::vector<Tensor> outs, refs;
            std::vector<Backend::Projection> gpu_p, cpu_p;
            for (size_t i = 0; i < hw.size(); ++i) {
                outs.push_back(poisoned(Shape{t, hw[i].w.rows}));
                refs.push_back(Tensor::f32(Shape{t, hw[i].w.rows}));
            }
            for (size_t i = 0; i < hw.size(); ++i) {
                gpu_p.push_back({outs[i], &dw[i]});
                cpu_p.push_back({refs[i], &hw[i].w});
            }
            gpu_->linears(xd, gpu_p);
            cpu_->linears(x, cpu_p);
            for (size_t i = 0; i < hw.size(); ++i)
                EXPECT_LE(rel_error(fetch(outs[i]), values(refs[i])), bound) << "projection " << i << " rows " << t;
        }
    }
};

class CudaLinearsTc : public CudaLinears {
public:
    CudaLinearsTc() : CudaLinears("tc") {}
};

TEST_F(CudaLinears, SharedLaunchesMatchTheCpu) { check_projections(1e-5); }
TEST_F(CudaLinearsTc, MatchTheCpu) { check_projections(kBf16Bound); }

TEST(CudaGemmMode, RejectsUnknownKernel) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    setenv("DEEPINFER_CUDA_GEMM", "simt", 1);
    EXPECT_THROW(create_backend("cuda", 1), Error);
    unsetenv("DEEPINFER_CUDA_GEMM");
}

}  // namespace
}  // namespace deepinfer
