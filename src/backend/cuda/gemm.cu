// Matrix products over weights in any stored format: a tiled fp32 SIMT kernel that dequantizes weight
// tiles into shared memory as it loads them (W8A32/W4A32). The correctness baseline; tensor-core paths
// (wgmma for FP8, dequantize-then-MMA for FP4) replace it where they win.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256;

// Each of the 256 threads computes a 4x4 block of the 64x64 output tile.
__global__ void __launch_bounds__(kThreads) gemm_kernel(float* __restrict__ out, int64_t ldc,
                                                         const float* __restrict__ x, int64_t lda, int64_t rows,
                                                         WeightDesc w, int64_t w_row0, int64_t n_out) {
    __shared__ float xs[kTileK][kTileM + 1];
    __shared__ float ws[kTileK][kTileN + 1];
    const int tid = threadIdx.x;
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM, n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
    const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < w.cols; k0 += kTileK) {
        for (int i = tid; i < kTileM * kTileK; i += kThreads) {
            const int r = i / kTileK, kk = i % kTileK;
            const int64_t m = m0 + r, k = k0 + kk;
            xs[kk][r] = (m < rows && k < w.cols) ? x[m * lda + k] : 0.0f;
            const int64_t n = n0 + r;
            ws[kk][r] = (n < n_out && k < w.cols) ? weight_at(w, w_row0 + n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTileK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = xs[kk][tm + i];
                b[i] = ws[kk][tn + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t m = m0 + tm + i, n = n0 + tn + j;
            if (m < rows && n < n_out) out[m * ldc + n] = acc[i][j];
        }
}

__global__ void embedding_kernel(float* __restrict__ out, WeightDesc table, const int32_t* __restrict__ ids,
                                 int64_t rows) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * table.cols) return;
    const int64_t r = i / table.cols, c = i % table.cols;
    out[i] = weight_at(table, ids[r], c);
}

}  // namespace

void launch_gemm(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                 int64_t w_row0, int64_t n_out, cudaStream_t stream) {
    if (rows == 0 || n_out == 0) return;
    const dim3 grid(static_cast<unsigned>((n_out + kTileN - 1) / kTileN), static_cast<unsigned>((rows + kTileM - 1) / kTileM));
    gemm_kernel<<<grid, kThreads, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_embedding(float* out, const WeightDesc& table, const int32_t* ids, int64_t rows, cudaStream_t stream) {
    const int64_t n = rows * table.cols;
    if (n == 0) return;
    embedding_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(out, table, ids, rows);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
