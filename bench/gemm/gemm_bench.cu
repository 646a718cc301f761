// Prefill GEMM micro-benchmark: the products of DeepSeek-V4-Flash at prefill row counts on the three kernels the
// backend can pick for more than 8 rows, timed with CUDA events: the fp32 tiled kernel (launch_gemm), the
// tensor-core kernel (launch_gemm_tc, with split-K as outside batch-invariant mode) and cuBLAS (CublasGemm::run,
// its whole call: x to bf16, the weight's dequantization into the bf16 scratch, the GEMMs). The dequantization
// alone is timed too (0 for BF16 weights, read in place). Weights rotate through enough copies to exceed the
// 50 MB L2. Prints us per call, TFLOP/s (2 T N K / time), the faster bf16 kernel's share of --tflops (the
// measured bf16 dense rate), and the relative differences of the tc and cuBLAS outputs from the tiled one (bf16
// activations against fp32: ~1e-3 expected; from each other without --tiled). The rows where cuBLAS starts to
// win set kCublasMinRows (kernels.h).
//   gemm_bench [--tflops 757] [--ms 200] [--no-tiled]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/kernels.h"
#include "common/device_fill.cuh"
#include "common/event_timing.cuh"

namespace {

using deepinfer::bench::device_fill;
using deepinfer::cuda::WeightDesc;

#define CHECK(expr) DI_CUDA_CHECK(expr)

struct Case {
    const char* name;
    int64_t n, k;
    int format;  // 0 bf16, 1 FP8 128x128 E8M0, 2 FP4 E8M0 per 32
    std::vector<int> rows;
};

struct Weight {
    WeightDesc d{};
    int64_t bytes = 0;
};

Weight make_weight(const Case& c, uint32_t seed) {
    Weight w;
    WeightDesc& d = w.d;
    d.rows = c.n, d.cols = c.k, d.format = c.format == 0 ? 0 : c.format == 1 ? 1 : 2, d.dtype = 1;
    int64_t scale_bytes = 0;
    if (c.format == 0) {
        w.bytes = c.n * c.k * 2;
    } else if (c.format == 1) {
        d.block_rows = d.block_cols = 128, d.scale_cols = (c.k + 127) / 128;
        w.bytes = c.n * c.k, scale_bytes = (c.n + 127) / 128 * d.scale_cols;
    } else {
        d.block_cols = 32, d.scale_cols = c.k / 32;
        w.bytes = c.n * c.k / 2, scale_bytes = c.n * d.scale_cols;
    }
    d.data = static_cast<const uint8_t*>(device_fill(w.bytes, c.format == 0 ? 1 : c.format == 1 ? 2 : 3, seed));
    if (scale_bytes) d.scale = static_cast<const uint8_t*>(device_fill(scale_bytes, 4, seed + 1));
    w.bytes += scale_bytes;
    return w;
}

using Launch = void (*)(float*, const float*, int64_t, const WeightDesc&);

std::unique_ptr<deepinfer::cuda::CublasGemm> g_cublas;  // on the legacy default stream, like the launches below
uint16_t* g_scratch = nullptr;                          // [kCublasScratchBytes] bf16, for dequantize()

void tc(float* out, const float* x, int64_t rows, const WeightDesc& d) {
    deepinfer::cuda::launch_gemm_tc(out, d.rows, x, d.cols, rows, d, 0, d.rows, true, nullptr);
}
void tiled(float* out, const float* x, int64_t rows, const WeightDesc& d) {
    deepinfer::cuda::launch_gemm(out, d.rows, x, d.cols, rows, d, 0, d.rows, nullptr);
}
void cublas(float* out, const float* x, int64_t rows, const WeightDesc& d) {
    g_cublas->run(out, d.rows, x, d.cols, rows, d, 0, d.rows);
}
// The cuBLAS path's dequantization of the whole weight, in scratch-sized chunks of rows as it runs it.
void dequantize(float*, const float*, int64_t, const WeightDesc& d) {
    const int64_t kp = (d.cols + 7) / 8 * 8;
    const int64_t chunk = std::max<int64_t>(deepinfer::cuda::kCublasScratchBytes / (kp * 2) / 256, 1) * 256;
    for (int64_t r0 = 0; r0 < d.rows; r0 += chunk)
        deepinfer::cuda::launch_dequantize_bf16(g_scratch, kp, d, r0, std::min(chunk, d.rows - r0), nullptr);
}

// Mean us per call over about `ms` milliseconds (at least 3 calls), after one warm-up call.
double time_us(Launch f, const std::vector<Weight>& ws, float* out, const float* x, int64_t rows, double ms) {
    auto run = [&](int iters) {
        return deepinfer::bench::mean_call_us(iters, [&](int i) { f(out, x, rows, ws[i % ws.size()].d); });
    };
    const double first = run(1);
    const int iters = static_cast<int>(std::clamp(ms * 1000.0 / first, 3.0, 2000.0));
    return run(iters);
}

// max |a - b| / max |b| over the first rows of two [rows, n] outputs (at most 2^28 values: the head at 16384
// rows would otherwise copy 17 GB to the host).
double rel_diff(const float* a_dev, const float* b_dev, int64_t rows, int64_t cols) {
    const int64_t n = std::min(rows, std::max<int64_t>((int64_t{1} << 28) / cols, 1)) * cols;
    std::vector<float> a(n), b(n);
    CHECK(cudaMemcpy(a.data(), a_dev, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), b_dev, n * 4, cudaMemcpyDeviceToHost));
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
    }
    return ref > 0 ? diff / ref : diff;
}

}  // namespace

int main(int argc, char** argv) {
    double peak = 757, ms = 200;
    bool with_tiled = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--tflops") && i + 1 < argc) peak = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) ms = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--no-tiled")) with_tiled = false;
        else {
            std::fprintf(stderr, "usage: gemm_bench [--tflops TFLOPS] [--ms MS] [--no-tiled]\n");
            return 2;
        }
    }
    // The backend's stream-ordered pool keeps freed blocks; so does this one (launch_gemm_tc and the cuBLAS path
    // allocate scratch).
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    g_cublas = std::make_unique<deepinfer::cuda::CublasGemm>(nullptr);
    CHECK(cudaMalloc(&g_scratch, deepinfer::cuda::kCublasScratchBytes));

    // DeepSeek-V4-Flash products (FP8 with 128x128 E8M0 blocks, routed experts FP4, head BF16) at the row counts
    // of decode-sized batches up to a 16K-token prefill step; a routed expert sees about T * 6 / 256 rows.
    const std::vector<int> prefill = {64, 256, 1024, 2048, 16384};
    auto with = [&](std::vector<int> extra) {
        extra.insert(extra.end(), prefill.begin(), prefill.end());
        std::sort(extra.begin(), extra.end());
        return extra;
    };
    const std::vector<Case> cases = {
        {"wq_a", 1024, 4096, 1, prefill},      {"wq_b", 32768, 1024, 1, prefill},
        {"wkv", 512, 4096, 1, prefill},        {"wo_b", 4096, 8192, 1, prefill},
        {"shared w1", 2048, 4096, 1, prefill}, {"expert w1", 2048, 4096, 2, with({512})},
        {"head", 129280, 4096, 0, with({8})},
    };
    int64_t max_x = 0, max_out = 0;
    for (const Case& c : cases)
        for (int rows : c.rows) max_x = std::max(max_x, rows * c.k), max_out = std::max(max_out, rows * c.n);
    float* x = static_cast<float*>(device_fill(max_x * 4, 0, 7));
    float *out_tc = nullptr, *out_tiled = nullptr, *out_cublas = nullptr;
    CHECK(cudaMalloc(&out_tc, max_out * 4));
    CHECK(cudaMalloc(&out_cublas, max_out * 4));
    if (with_tiled) CHECK(cudaMalloc(&out_tiled, max_out * 4));

    std::printf("%-10s %-5s %-15s %6s %11s %10s %10s %10s %8s %8s %7s %6s %9s %9s\n", "shape", "dtype", "[n x k]", "T",
                "tiled us", "tc us", "cublas us", "dequant", "tc TF/s", "cb TF/s", "% peak", "best",
                with_tiled ? "tc diff" : "", with_tiled ? "cb diff" : "cb vs tc");
    for (const Case& c : cases) {
        std::vector<Weight> ws(1, make_weight(c, 1));
        while (static_cast<int64_t>(ws.size()) * ws[0].bytes < (int64_t{256} << 20) && ws.size() < 16)
            ws.push_back(make_weight(c, 1 + 2 * static_cast<uint32_t>(ws.size())));
        char shape[32];
        std::snprintf(shape, sizeof shape, "[%lld x %lld]", static_cast<long long>(c.n), static_cast<long long>(c.k));
        const double deq_us = c.format == 0 ? 0.0 : time_us(dequantize, ws, nullptr, x, 0, ms);
        for (int rows : c.rows) {
            const double flop = 2.0 * rows * c.n * c.k;
            const double tiled_us = with_tiled ? time_us(tiled, ws, out_tiled, x, rows, ms) : 0.0;
            const double tc_us = time_us(tc, ws, out_tc, x, rows, ms);
            const double cb_us = time_us(cublas, ws, out_cublas, x, rows, ms);
            const double best = std::min(tc_us, cb_us);
            const char* dtype = c.format == 0 ? "bf16" : c.format == 1 ? "fp8" : "fp4";
            std::printf("%-10s %-5s %-15s %6d %11.1f %10.1f %10.1f %10.1f %8.1f %8.1f %6.1f%% %6s", c.name, dtype,
                        shape, rows, tiled_us, tc_us, cb_us, deq_us, flop / tc_us / 1e6, flop / cb_us / 1e6,
                        100.0 * flop / best / 1e6 / peak, cb_us < tc_us ? "cublas" : "tc");
            tc(out_tc, x, rows, ws[0].d);
            cublas(out_cublas, x, rows, ws[0].d);
            if (with_tiled) {
                tiled(out_tiled, x, rows, ws[0].d);
                std::printf(" %9.1e %9.1e", rel_diff(out_tc, out_tiled, rows, c.n),
                            rel_diff(out_cublas, out_tiled, rows, c.n));
            } else {
                std::printf(" %9s %9.1e", "", rel_diff(out_cublas, out_tc, rows, c.n));
            }
            std::printf("\n");
            std::fflush(stdout);
        }
        for (Weight& w : ws) {
            CHECK(cudaFree(const_cast<uint8_t*>(w.d.data)));
            if (w.d.scale) CHECK(cudaFree(const_cast<uint8_t*>(w.d.scale)));
        }
    }
    g_cublas.reset();
    CHECK(cudaFree(g_scratch));
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_tc));
    CHECK(cudaFree(out_cublas));
    if (out_tiled) CHECK(cudaFree(out_tiled));
    return 0;
}
