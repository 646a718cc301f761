// Whether cuBLASLt's FP8 GEMM with DeepSeek-style block scales (CUDA 12.9 and later, Hopper) can run the V4 prefill
// products in the form DEEPINFER_FP8_ACTIVATIONS defines them, and how fast. The activations X [T, K] are e4m3 with
// an fp32 power-of-two scale per 128 columns (model/activation_quant.h: 2^ceil(log2(amax / 448)), amax at least
// 1e-4), the weights W [N, K] e4m3 with a scale per 128 x 128 block (the checkpoint's E8M0 bytes as fp32), the
// output fp32: out[t, n] = sum_kb sx[kb, t] sw[n / 128, kb] sum_k x[t, k] w[n, k]. The activation scales are
// [K / 128, T] (each block's rows together; the CUDA op test found [T, K / 128] wrong once the blocks' scales
// differ), so the probe's activations span 2^-8 .. 2^8 block to block.
//
// For each V4-Flash FP8 product at --rows tokens: the cuBLASLt call (A = W, op T; B = X; D column-major [N, T], so
// row-major out [T, N]; A's scales in the layout that matches, tried both ways), its largest difference from an
// exact (double) sum over the first rows, relative to that row's largest |out|, and us per call against cuBLAS's
// bf16 GEMM on the same shape (what the backend runs now, its conversions not counted). "no algorithm" means
// cuBLASLt has no kernel for that combination (then the output type is tried as bf16).
//   fp8_gemm_probe [--rows 16384 (a multiple of 4, at least 8)] [--ms 200]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/device_fill.cuh"
#include "common/event_timing.cuh"

namespace {

#define CHECK(expr) DI_CUDA_CHECK(expr)
#define CHECK_BLAS(expr)                                                                                    \
    do {                                                                                                    \
        const cublasStatus_t st_ = (expr);                                                                  \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cublasGetStatusString(st_)); \
            std::exit(1);                                                                                   \
        }                                                                                                   \
    } while (0)

// The weights' E8M0 scale bytes as the fp32 scales cuBLASLt takes: 2^(e - 127).
__global__ void e8m0_to_f32_kernel(float* dst, const uint8_t* e, int64_t n) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i < n) dst[i] = ldexpf(1.0f, static_cast<int>(e[i]) - 127);
}

// X [T, K] fp32, each (row, block) times 2^((7 i) % 17 - 8) -> q [T, K] e4m3 and s [K / 128, T] fp32, a thread a
// (row, block) i.
__global__ void quantize_kernel(const float* x, uint8_t* q, float* s, int64_t t, int64_t k) {
    const int64_t blocks = k / 128, i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= t * blocks) return;
    const float* src = x + i * 128;  // row i / blocks, block i % blocks: rows are k floats, blocks contiguous
    const float f = ldexpf(1.0f, static_cast<int>((i * 7) % 17) - 8);
    float amax = 0;
    for (int j = 0; j < 128; ++j) amax = fmaxf(amax, fabsf(src[j] * f));
    const float r = fmaxf(amax, 1e-4f) * (1.0f / 448.0f);
    int e;
    const float m = frexpf(r, &e);  // r = m 2^e, m in [0.5, 1): 2^ceil(log2 r) is 2^(e - 1) when m == 0.5
    const float scale = ldexpf(1.0f, m == 0.5f ? e - 1 : e);
    for (int j = 0; j < 128; ++j) q[i * 128 + j] = __nv_cvt_float_to_fp8(src[j] * f / scale, __NV_SATFINITE, __NV_E4M3);
    s[(i % blocks) * t + i / blocks] = scale;
}

__device__ float e4m3(uint8_t b) {
    __nv_fp8_e4m3 v;
    v.__x = b;
    return static_cast<float>(v);
}

// The exact sum (double) for the first and the last rows_checked / 2 rows (the first and the last token tiles):
// ref [rows_checked, N]. sw [ceil(N / 128), K / 128] row-major.
__global__ void reference_kernel(double* ref, const uint8_t* xq, const float* sx, const uint8_t* wq, const float* sw,
                                 int64_t t_all, int64_t n, int64_t k, int rows_checked) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= rows_checked * n) return;
    const int64_t r = i / n, t = r < rows_checked / 2 ? r : t_all - rows_checked + r, f = i % n, kb = k / 128;
    double acc = 0;
    for (int64_t b = 0; b < kb; ++b) {
        double part = 0;
        for (int64_t j = b * 128; j < b * 128 + 128; ++j)
            part += static_cast<double>(e4m3(xq[t * k + j])) * static_cast<double>(e4m3(wq[f * k + j]));
        acc += part * sx[b * t_all + t] * sw[(f / 128) * kb + b];
    }
    ref[i] = acc;
}

__global__ void transpose_kernel(float* dst, const float* src, int64_t rows, int64_t cols) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i < rows * cols) dst[(i % cols) * rows + i / cols] = src[i];
}

struct Shape {
    const char* name;
    int64_t n, k;
};

struct Lt {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = size_t{64} << 20;
    Lt() {
        CHECK_BLAS(cublasLtCreate(&handle));
        CHECK(cudaMalloc(&workspace, workspace_bytes));
    }
    ~Lt() {
        cudaFree(workspace);
        cublasLtDestroy(handle);
    }
};

// One FP8 product on cuBLASLt: D [N, T] column-major = W^T-op . X, output type `out_type`. Returns false when
// cuBLASLt offers no algorithm; else runs it `iters` times (0: once) and sets *us to the mean.
bool run_fp8(Lt& lt, cudaDataType_t out_type, void* d, const uint8_t* wq, const float* sw, const uint8_t* xq,
             const float* sx, int64_t t, int64_t n, int64_t k, int iters, double* us) {
    cublasLtMatmulDesc_t desc;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                  mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, t, k));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, out_type, n, t, n));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.workspace_bytes,
                                                    sizeof lt.workspace_bytes));
    cublasLtMatmulHeuristicResult_t heur = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt.handle, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    const bool ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) {
        const float alpha = 1.0f, beta = 0.0f;
        auto call = [&](int) {
            CHECK_BLAS(cublasLtMatmul(lt.handle, desc, &alpha, wq, la, xq, lb, &beta, d, lc, d, lc, &heur.algo,
                                      lt.workspace, lt.workspace_bytes, nullptr));
        };
        call(0);
        CHECK(cudaDeviceSynchronize());
        *us = iters > 0 ? deepinfer::bench::mean_call_us(iters, call) : 0;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    return ok;
}

// Largest |got - ref| over the first rows, relative to each row's largest |ref|. got: D column-major [N, T].
double max_row_error(const std::vector<float>& got, const std::vector<double>& ref, int64_t n, int rows) {
    double worst = 0;
    for (int t = 0; t < rows; ++t) {
        double top = 0, diff = 0;
        for (int64_t f = 0; f < n; ++f) {
            top = std::max(top, std::fabs(ref[t * n + f]));
            diff = std::max(diff, std::fabs(static_cast<double>(got[t * n + f]) - ref[t * n + f]));
        }
        worst = std::max(worst, top > 0 ? diff / top : diff);
    }
    return worst;
}

}  // namespace

int main(int argc, char** argv) {
    int64_t rows = 16384;
    double ms = 200;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc)
            ms = std::atof(argv[++i]);
        else {
            std::fprintf(stderr, "usage: fp8_gemm_probe [--rows 16384] [--ms 200]\n");
            return 2;
        }
    }
    if (rows < 8 || rows % 4 != 0) {  // the checked rows; cuBLASLt's activation scales want whole groups of 4 rows
        std::fprintf(stderr, "fp8_gemm_probe: --rows must be a multiple of 4, at least 8\n");
        return 2;
    }
    std::printf("cuBLASLt %zu; %lld rows; FP8 e4m3 x e4m3, A scales 128x128, B scales 1x128, fp32 accumulation\n",
                cublasLtGetVersion(), static_cast<long long>(rows));
    // V4-Flash's FP8 products (wo_a: one of its 8 groups).
    const Shape shapes[] = {{"wq_a", 1024, 4096},       {"wkv", 512, 4096},          {"wq_b", 32768, 1024},
                            {"wo_a group", 1024, 4096}, {"wo_b", 4096, 8192},        {"shared w1+w3", 4096, 4096},
                            {"shared w2", 4096, 2048},  {"indexer wq_b", 8192, 1024}};
    constexpr int kChecked = 8;  // rows compared with the exact sum
    Lt lt;
    cublasHandle_t blas;
    CHECK_BLAS(cublasCreate(&blas));
    std::printf("%-14s %6s %6s %-6s %-10s %10s %9s %9s %9s %7s\n", "product", "N", "K", "out", "A scales", "max err",
                "fp8 us", "TFLOP/s", "bf16 us", "ratio");
    for (const Shape& s : shapes) {
        const int64_t t = rows, n = s.n, k = s.k, kb = k / 128, nb = (n + 127) / 128;
        float *x, *sx, *sw, *sw_t, *d32;
        uint8_t *xq, *wq, *sw_e8m0;
        __nv_bfloat16 *xb, *wb;
        double* ref;
        CHECK(cudaMalloc(&x, t * k * 4));
        CHECK(cudaMalloc(&xq, t * k));
        CHECK(cudaMalloc(&sx, t * kb * 4));
        CHECK(cudaMalloc(&wq, n * k));
        CHECK(cudaMalloc(&sw, nb * kb * 4));
        CHECK(cudaMalloc(&sw_e8m0, nb * kb));
        CHECK(cudaMalloc(&sw_t, nb * kb * 4));
        CHECK(cudaMalloc(&d32, t * n * 4));
        CHECK(cudaMalloc(&xb, t * k * 2));
        CHECK(cudaMalloc(&wb, n * k * 2));
        CHECK(cudaMalloc(&ref, kChecked * n * 8));
        using namespace deepinfer::bench;
        fill_device(x, t * k * 4, kFillF32, 1);
        fill_device(wq, n * k, kFillE4m3, 2);
        fill_device(sw_e8m0, nb * kb, kFillE8m0, 3);
        fill_device(xb, t * k * 2, kFillBf16, 4);
        fill_device(wb, n * k * 2, kFillBf16, 5);
        e8m0_to_f32_kernel<<<static_cast<unsigned>((nb * kb + 255) / 256), 256>>>(sw, sw_e8m0, nb * kb);
        quantize_kernel<<<static_cast<unsigned>((t * kb + 255) / 256), 256>>>(x, xq, sx, t, k);
        reference_kernel<<<static_cast<unsigned>((kChecked * n + 255) / 256), 256>>>(ref, xq, sx, wq, sw, t, n, k,
                                                                                     kChecked);
        transpose_kernel<<<static_cast<unsigned>((nb * kb + 255) / 256), 256>>>(sw_t, sw, nb, kb);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<double> ref_h(kChecked * n);
        CHECK(cudaMemcpy(ref_h.data(), ref, ref_h.size() * 8, cudaMemcpyDeviceToHost));

        // bf16 cuBLAS on the same shape: out [T, N] row-major = D column-major [N, T] = W^T-op . X.
        const float one = 1.0f, zero = 0.0f;
        auto bf16_call = [&](int) {
            CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t),
                                    static_cast<int>(k), &one, wb, CUDA_R_16BF, static_cast<int>(k), xb, CUDA_R_16BF,
                                    static_cast<int>(k), &zero, d32, CUDA_R_32F, static_cast<int>(n),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        bf16_call(0);
        CHECK(cudaDeviceSynchronize());
        const double once = deepinfer::bench::mean_call_us(1, bf16_call);
        const int iters = std::max(3, static_cast<int>(ms * 1000 / std::max(once, 1.0)));
        const double bf16_us = deepinfer::bench::mean_call_us(iters, bf16_call);

        bool any = false;
        for (const cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF}) {
            for (int layout = 0; layout < 2 && !any; ++layout) {
                const float* scales = layout == 0 ? sw : sw_t;
                double us = 0;
                if (!run_fp8(lt, out, d32, wq, scales, xq, sx, t, n, k, 0, &us)) {
                    std::printf("%-14s %6lld %6lld %-6s %-10s no algorithm\n", s.name, static_cast<long long>(n),
                                static_cast<long long>(k), out == CUDA_R_32F ? "fp32" : "bf16",
                                layout == 0 ? "[nb, kb]" : "[kb, nb]");
                    break;  // the layout does not change whether an algorithm exists
                }
                // The checked rows: the first kChecked / 2 and the last kChecked / 2 of D.
                std::vector<float> got(kChecked * n);
                const size_t bytes = out == CUDA_R_32F ? 4 : 2, half = kChecked / 2 * n;
                std::vector<unsigned char> raw(got.size() * bytes);
                CHECK(cudaMemcpy(raw.data(), d32, half * bytes, cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(raw.data() + half * bytes,
                                 static_cast<unsigned char*>(static_cast<void*>(d32)) + (t - kChecked / 2) * n * bytes,
                                 half * bytes, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < got.size(); ++i)
                    got[i] = bytes == 4 ? reinterpret_cast<float*>(raw.data())[i]
                                        : __bfloat162float(reinterpret_cast<__nv_bfloat16*>(raw.data())[i]);
                const double err = max_row_error(got, ref_h, n, kChecked);
                run_fp8(lt, out, d32, wq, scales, xq, sx, t, n, k, iters, &us);
                std::printf("%-14s %6lld %6lld %-6s %-10s %10.2e %9.1f %9.1f %9.1f %6.2fx\n", s.name,
                            static_cast<long long>(n), static_cast<long long>(k), out == CUDA_R_32F ? "fp32" : "bf16",
                            layout == 0 ? "[nb, kb]" : "[kb, nb]", err, us, 2.0 * t * n * k / us / 1e6, bf16_us,
                            bf16_us / us);
                // The matching layout is the one whose error is at the fp32 level; the other is tried for the record.
                any = err < 1e-4;
            }
            if (any) break;
        }
        for (void* p : {static_cast<void*>(x), static_cast<void*>(xq), static_cast<void*>(sx), static_cast<void*>(wq),
                        static_cast<void*>(sw), static_cast<void*>(sw_t), static_cast<void*>(d32),
                        static_cast<void*>(xb), static_cast<void*>(wb), static_cast<void*>(ref)})
            CHECK(cudaFree(p));
    }
    cublasDestroy(blas);
    return 0;
}
