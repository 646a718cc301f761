// Prefill GEMM micro-benchmark: the products of DeepSeek-V4-Flash at prefill row counts, on the tensor-core
// kernel (launch_gemm_tc, as the backend calls it outside batch-invariant mode) and on the fp32 tiled kernel it
// replaces, timed with CUDA events. Weights rotate through enough copies to exceed the 50 MB L2. Prints us per
// call, TFLOP/s (2 T N K / time), its share of --tflops (the measured bf16 dense rate), the tiled kernel's time
// and the relative difference of the two outputs (bf16 activations against fp32: ~1e-3 expected).
//   gemm_bench [--tflops 757] [--ms 200] [--no-tiled]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels.h"

namespace {

using deepinfer::cuda::WeightDesc;

#define CHECK(expr) DI_CUDA_CHECK(expr)

// Deterministic finite contents by byte index: kind 0 f32 in [-1, 1), 1 bf16 in +-[0.5, 1), 2 e4m3 without NaN,
// 3 packed e2m1, 4 E8M0 scales 2^-8 .. 2^-1.
__global__ void fill(uint8_t* p, int64_t bytes, int kind, uint32_t seed) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += stride) {
        uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 40503u + static_cast<uint32_t>(i >> 32));
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        if (kind == 0) {
            if (i % 4 == 0) *reinterpret_cast<float*>(p + i) = static_cast<float>(h % 2048) / 1024.0f - 1.0f;
        } else if (kind == 1) {
            if (i % 2 == 0) *reinterpret_cast<uint16_t*>(p + i) = static_cast<uint16_t>((h & 0x807f) | 0x3f00);
        } else if (kind == 2) {
            p[i] = static_cast<uint8_t>(h & 0xbf);  // exponent < 8: no NaN
        } else if (kind == 3) {
            p[i] = static_cast<uint8_t>(h);
        } else {
            p[i] = static_cast<uint8_t>(119 + h % 8);
        }
    }
}

void* device_fill(int64_t bytes, int kind, uint32_t seed) {
    void* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    fill<<<2048, 256>>>(static_cast<uint8_t*>(p), bytes, kind, seed);
    DI_CUDA_LAUNCH_CHECK();
    return p;
}

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

void tc(float* out, const float* x, int64_t rows, const WeightDesc& d) {
    deepinfer::cuda::launch_gemm_tc(out, d.rows, x, d.cols, rows, d, 0, d.rows, true, nullptr);
}
void tiled(float* out, const float* x, int64_t rows, const WeightDesc& d) {
    deepinfer::cuda::launch_gemm(out, d.rows, x, d.cols, rows, d, 0, d.rows, nullptr);
}

// Mean us per call over about `ms` milliseconds (at least 3 calls), after one warm-up call.
double time_us(Launch f, const std::vector<Weight>& ws, float* out, const float* x, int64_t rows, double ms) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    auto run = [&](int iters) {
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < iters; ++i) f(out, x, rows, ws[i % ws.size()].d);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, a, b));
        return 1000.0 * t / iters;
    };
    const double first = run(1);
    const int iters = static_cast<int>(std::clamp(ms * 1000.0 / first, 3.0, 2000.0));
    const double us = run(iters);
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return us;
}

double rel_diff(const float* a_dev, const float* b_dev, int64_t n) {
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
    // The backend's stream-ordered pool keeps freed blocks; so does this one (launch_gemm_tc allocates scratch).
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

    // DeepSeek-V4-Flash products (FP8 with 128x128 E8M0 blocks, routed experts FP4, head BF16).
    const std::vector<Case> cases = {
        {"wq_a", 1024, 4096, 1, {2048, 16384}},   {"wq_b", 32768, 1024, 1, {2048, 16384}},
        {"wkv", 512, 4096, 1, {2048, 16384}},     {"wo_b", 4096, 8192, 1, {2048, 16384}},
        {"shared w1", 2048, 4096, 1, {2048, 16384}}, {"expert w1", 2048, 4096, 2, {64, 512}},
        {"head", 129280, 4096, 0, {8}},
    };
    const int64_t max_x = 16384 * 8192, max_out = 16384 * int64_t{32768};
    float* x = static_cast<float*>(device_fill(max_x * 4, 0, 7));
    float *out_tc = nullptr, *out_tiled = nullptr;
    CHECK(cudaMalloc(&out_tc, max_out * 4));
    CHECK(cudaMalloc(&out_tiled, max_out * 4));

    std::printf("%-10s %-5s %-15s %6s %10s %9s %7s %11s %8s %9s\n", "shape", "dtype", "[n x k]", "T", "us/call",
                "TFLOP/s", "% peak", "tiled us", "speedup", "rel diff");
    for (const Case& c : cases) {
        std::vector<Weight> ws(1, make_weight(c, 1));
        while (static_cast<int64_t>(ws.size()) * ws[0].bytes < (int64_t{256} << 20) && ws.size() < 16)
            ws.push_back(make_weight(c, 1 + 2 * static_cast<uint32_t>(ws.size())));
        char shape[32];
        std::snprintf(shape, sizeof shape, "[%lld x %lld]", static_cast<long long>(c.n), static_cast<long long>(c.k));
        for (int rows : c.rows) {
            const double flop = 2.0 * rows * c.n * c.k;
            const double us = time_us(tc, ws, out_tc, x, rows, ms);
            const double tflops = flop / us / 1e6;
            std::printf("%-10s %-5s %-15s %6d %10.1f %9.1f %6.1f%%", c.name,
                        c.format == 0 ? "bf16" : c.format == 1 ? "fp8" : "fp4", shape, rows, us, tflops,
                        100.0 * tflops / peak);
            if (with_tiled) {
                const double old_us = time_us(tiled, ws, out_tiled, x, rows, ms);
                tc(out_tc, x, rows, ws[0].d);
                tiled(out_tiled, x, rows, ws[0].d);
                std::printf(" %11.1f %7.1fx %9.1e", old_us, old_us / us, rel_diff(out_tc, out_tiled, rows * c.n));
            }
            std::printf("\n");
            std::fflush(stdout);
        }
        for (Weight& w : ws) {
            CHECK(cudaFree(const_cast<uint8_t*>(w.d.data)));
            if (w.d.scale) CHECK(cudaFree(const_cast<uint8_t*>(w.d.scale)));
        }
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_tc));
    CHECK(cudaFree(out_tiled));
    return 0;
}
