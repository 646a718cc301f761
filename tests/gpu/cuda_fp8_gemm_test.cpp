// Backend::quantized_linears and quantized_grouped_linear on CUDA against the CPU op (fake_quantize, then the fp32
// product): the products
//  - on cuBLASLt's FP8 GEMM (weights FP8 with 128 x 128 scales, E8M0 or f32, from kCublasMinRows rows) within 1e-3
//    of the CPU's largest output: the tensor cores sum each 128-k block at reduced precision (bench/gemm/
//    fp8_gemm_probe: a few 1e-4), while a wrong scale or a lost block is off by 1e-1 or more;
//  - elsewhere (fewer rows, other scale blocks) on the usual kernels from the quantized activations, which bf16 holds
//    exactly: 1e-4, the same-inputs bound.
// The op profile says which path ran. The activations are left as they were on both backends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/gemm_fp8.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;

// Of the product's largest output; twice that of each row's own (the probe: 4-6e-4 of a row's at K up to 8192).
constexpr double kFp8Bound = 1e-3;

class CudaFp8Gemm : public testing_support::CudaCompare {
public:
    CudaFp8Gemm() : CudaCompare("auto") {}

protected:
    void SetUp() override {
        setenv("DEEPINFER_CUDA_PROFILE", "1", 1);
        CudaCompare::SetUp();
        unsetenv("DEEPINFER_CUDA_PROFILE");
    }

    // Activations whose 128-column blocks span many binades (the scales then differ block to block), one block all
    // zeros (the scale's floor) where there are at least two.
    std::vector<float> activations(int64_t t, int64_t cols) {
        std::vector<float> v = randn(t * cols);
        std::uniform_int_distribution<int> exponent(-12, 8);
        for (int64_t b = 0; b < t * cols / 128; ++b) {
            const float s = std::ldexp(1.0f, exponent(rng_));
            for (int64_t i = 0; i < 128; ++i) v[b * 128 + i] = b == 1 ? 0.0f : v[b * 128 + i] * s;
        }
        return v;
    }

    // The rows whose largest |got - ref| exceeds `bound` times their own largest |ref| (rows of small blocks would hide
    // under a bound on the whole output), counted, the first ones listed.
    static std::pair<int64_t, std::string> rows_over(const std::vector<float>& got, const std::vector<float>& ref,
                                                     int64_t n, double bound) {
        std::string rows;
        int64_t count = 0;
        for (size_t r = 0; r * n < ref.size(); ++r) {
            double worst = 0, top = 0;
            for (int64_t j = 0; j < n; ++j) {
                worst = std::max(worst, std::fabs(double(got[r * n + j]) - ref[r * n + j]));
                top = std::max(top, std::fabs(double(ref[r * n + j])));
            }
            if (!(worst <= bound * top) && count++ < 12) rows += " " + std::to_string(r);
        }
        return {count, rows};
    }

    // x [t, groups * k] quantized and multiplied by `weights` (each [n_i, k]; groups > 1: one weight in `groups`
    // diagonal blocks) on both backends. fp8: whether the CUDA op must have taken the FP8 GEMM.
    void check(const std::vector<int>& formats, const std::vector<int64_t>& ns, int64_t t, int64_t k, int groups,
               bool fp8) {
        std::vector<HostWeight> hw;
        std::vector<LinearWeight> dw;
        for (size_t i = 0; i < formats.size(); ++i) hw.push_back(make_weight(rng_, formats[i], ns[i], k));
        for (HostWeight& h : hw) dw.push_back(to_backend(*gpu_, h.w, &storage_));
        const std::vector<float> xv = activations(t, groups * k);
        Tensor x = host(xv, Shape{t, groups * k}), xd = device(x);
        std::vector<Tensor> outs, refs;
        std::vector<Backend::Projection> gpu_p, cpu_p;
        for (size_t i = 0; i < hw.size(); ++i) {
            outs.push_back(poisoned(Shape{t, hw[i].w.rows}));
            refs.push_back(Tensor::f32(Shape{t, hw[i].w.rows}));
            gpu_p.push_back({outs[i], &dw[i]});
            cpu_p.push_back({refs[i], &hw[i].w});
        }
        gpu_->take_profile();  // earlier ops (the uploads) out of the way
        if (groups == 1) {
            gpu_->quantized_linears(xd, QuantSim::kFp8Ue8m0, 128, gpu_p);
            cpu_->quantized_linears(x, QuantSim::kFp8Ue8m0, 128, cpu_p);
        } else {
            gpu_->quantized_grouped_linear(outs[0], xd, QuantSim::kFp8Ue8m0, 128, dw[0], groups);
            cpu_->quantized_grouped_linear(refs[0], x, QuantSim::kFp8Ue8m0, 128, hw[0].w, groups);
        }
        const std::string profile = gpu_->take_profile();
        const std::string what =
            "rows " + std::to_string(t) + " k " + std::to_string(k) + " groups " + std::to_string(groups);
        EXPECT_EQ(profile.find("matmul fp8 cublaslt") != std::string::npos, fp8) << what << "\n" << profile;
        // x afterwards: as it was, on either backend.
        const std::vector<float> after = fetch(xd);
        EXPECT_EQ(std::memcmp(after.data(), xv.data(), xv.size() * 4), 0) << "x changed on the GPU, " << what;
        EXPECT_EQ(std::memcmp(x.f32(), xv.data(), xv.size() * 4), 0) << "x changed on the CPU, " << what;
        for (size_t i = 0; i < hw.size(); ++i) {
            const std::vector<float> got = fetch(outs[i]), ref = values(refs[i]);
            const double bound = fp8 ? kFp8Bound : testing_support::kSameInputsBound;
            EXPECT_LE(rel_error(got, ref), bound) << "projection " << i << " (format " << formats[i] << "), " << what;
            const auto [count, rows] = rows_over(got, ref, hw[i].w.rows, 2 * bound);
            EXPECT_EQ(count, 0) << "rows off by more than " << 2 * bound << " of their own largest output, projection "
                                << i << ", " << what << ":" << rows;
        }
    }
};

// The release format (128 x 128 E8M0) and f32 block scales, projections of one input sharing its quantization.
TEST_F(CudaFp8Gemm, ProjectionsOnTheFp8Gemm) {
    for (int64_t t : {128, 333}) check({6, 3, 6}, {512, 256, 1536}, t, 1024, 1, true);
    check({6}, {384}, 200, 4096, 1, true);
    // N of one scale block, at the default model's perplexity windows' row count (4 rows short of 3815) and more.
    check({6, 6}, {128, 128}, 3811, 512, 1, true);
    check({6}, {128}, 3812, 1024, 1, true);
}

// The quantizer the FP8 GEMM reads (launch_quantize_fp8_rows): each code times its scale is fake_quantize's value bit
// for bit, the scales laid out [cols / 128, rows], x left as it was.
TEST_F(CudaFp8Gemm, QuantizerCodesTimesScalesAreFakeQuantize) {
    const int64_t t = 36, cols = 640;
    const std::vector<float> xv = activations(t, cols);
    Tensor x = host(xv, Shape{t, cols}), xd = device(x);
    Tensor codes = gpu_->alloc(DType::kU8, Shape{t, cols}), scales = gpu_->alloc(DType::kF32, Shape{cols / 128, t});
    gpu_->synchronize();  // the upload done: the launch goes to the legacy stream
    cuda::launch_quantize_fp8_rows(xd.f32(), codes.as<uint8_t>(), scales.f32(), t, cols, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> c(t * cols);
    std::vector<float> s(t * cols / 128);
    gpu_->download(c.data(), codes);
    gpu_->download(s.data(), scales);
    cpu_->fake_quantize(x, QuantSim::kFp8Ue8m0, 128);
    const std::vector<float> want = values(x), after = fetch(xd);
    int64_t differ = 0;
    for (int64_t r = 0; r < t; ++r)
        for (int64_t j = 0; j < cols; ++j) {
            const float v = f8e4m3_to_f32(c[r * cols + j]) * s[(j / 128) * t + r];
            differ += std::memcmp(&v, &want[r * cols + j], 4) != 0;
        }
    EXPECT_EQ(differ, 0) << "of " << t * cols << " values";
    EXPECT_EQ(std::memcmp(after.data(), xv.data(), xv.size() * 4), 0) << "x changed";
}

// wo_a's form: a group's activations are its own 128-column blocks, its scales and codes read in place.
TEST_F(CudaFp8Gemm, GroupedOnTheFp8Gemm) {
    check({6}, {4 * 256}, 130, 512, 4, true);
    check({3}, {2 * 128}, 256, 1024, 2, true);
    check({6}, {8 * 1024}, 400, 4096, 8, true);  // V4-Flash's wo_a
}

// Not for the FP8 GEMM: too few rows (the GEMVs and the mma.sync GEMM), 32 x 32 scale blocks, a BF16 weight among the
// projections, K under 512; the usual kernels then multiply the quantized activations.
TEST_F(CudaFp8Gemm, OtherProductsMultiplyTheQuantizedActivations) {
    for (int64_t t : {1, 8, 64}) check({6, 6}, {512, 256}, t, 1024, 1, false);
    check({2}, {512}, 256, 1024, 1, false);
    check({6, 1}, {512, 256}, 256, 1024, 1, false);
    check({6}, {4 * 256}, 16, 512, 4, false);
    // K under 512 (see fp8_gemm_applies): the default model's shapes.
    check({6, 6}, {128, 128}, 3811, 256, 1, false);
    check({6, 6}, {512, 512}, 3812, 128, 1, false);
    check({6}, {2 * 128}, 3811, 256, 2, false);
}

}  // namespace
}  // namespace deepinfer
