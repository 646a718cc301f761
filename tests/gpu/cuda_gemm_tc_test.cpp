// The tensor-core product (DEEPINFER_CUDA_GEMM=tc, the default, for more than 8 rows) against the CPU op on
// fresh random inputs, output poisoned with NaN. Two bounds on max |cuda - cpu| / max |cpu|:
//  - 3e-2, the tolerance table's GPU (bf16 activations) vs CPU bound, for every weight kind;
//  - 1e-4 against the CPU product of the same bf16-rounded activations, for weights exact in bf16 (BF16, and
//    FP8/FP4 with E8M0 scales): then only the fp32 summation order differs, so a wrong scale, a dropped K chunk
//    or a misplaced tile (each well over 1e-2) cannot hide under the looser bound.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_support.h"
#include "deepinfer/error.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;

constexpr double kBf16Bound = 3e-2;
constexpr double kSameInputsBound = 1e-4;

class CudaGemmTc : public testing_support::CudaCompare {
public:
    CudaGemmTc() : CudaCompare("tc") {}

protected:
    // out [t, n] = x [t, groups * k] . W [n, k]^T in `groups` diagonal blocks (1: a plain linear).
    void check(int format, int64_t t, int64_t n, int64_t k, int64_t groups = 1) {
        HostWeight hw = make_weight(rng_, format, n, k);
        const LinearWeight dw = to_backend(*gpu_, hw.w, &storage_);
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
        if (format == 1 || format == 2 || format == 4 || format == 6) {
            for (float& v : xv) v = round_to_bf16(v);
            Tensor xr = host(xv, Shape{t, groups * k}), ref16 = Tensor::f32(Shape{t, n});
            product(*cpu_, ref16, xr, hw.w);
            EXPECT_LE(rel_error(got, values(ref16)), kSameInputsBound)
                << "format " << format << " t " << t << " n " << n << " k " << k;
        }
    }
};

// Every weight kind (see make_weight) and row count. n = 300, k = 400 end in partial N and K tiles on the
// vector loaders (FP4 takes k = 416: its K must be whole groups of 32, as the weight loader requires, so it never
// ends in a partial K step); k = 100 (not a multiple of 16) takes the element-wise loader (not FP4, likewise);
// n = 1100 at 2048 rows fills the GPU with 128x128 tiles, n = 600 only with 128x64 ones (80 and 160 tiles; 114
// to 132 SMs); k = 4096 at 9 and 64 rows splits K.
TEST_F(CudaGemmTc, EveryKindAndRowCount) {
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

// The block-diagonal product: activation rows strided by groups * k, weight rows offset per group.
TEST_F(CudaGemmTc, GroupedLinear) {
    for (int format : {1, 4, 6}) {
        for (int64_t t : {9, 300}) check(format, t, 4 * 96, 160, 4);
    }
}

// In batch-invariant mode a row's product is bitwise the same alone, in a sub-batch of 10 rows or among all
// `t` rows, although the tile shape changes with the row count (128x128 at 2048 rows, 64x64 for 10) and the
// row sits at another position in its MMA tile; K = 4096 at 300 rows would split K outside this mode.
TEST_F(CudaGemmTc, BatchInvariantModeIgnoresRowCount) {
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
        EXPECT_EQ(std::vector<float>(a.begin() + r0 * c.n, a.begin() + (r0 + 10) * c.n), s) << "format " << c.format;
        EXPECT_EQ(std::vector<float>(a.end() - c.n, a.end()), o) << "format " << c.format;
        Tensor ref = Tensor::f32(Shape{c.t, c.n});
        cpu_->linear(ref, x, hw.w);
        EXPECT_LE(rel_error(a, values(ref)), kBf16Bound) << "format " << c.format;
    }
}

TEST(CudaGemmMode, RejectsUnknownKernel) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    setenv("DEEPINFER_CUDA_GEMM", "simt", 1);
    EXPECT_THROW(create_backend("cuda", 1), Error);
    unsetenv("DEEPINFER_CUDA_GEMM");
}

}  // namespace
}  // namespace deepinfer
