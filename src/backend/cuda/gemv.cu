// Matrix products for a few activation rows (decode): memory-bound, so each weight byte is read once, in
// 16-byte coalesced loads, and dequantized in registers. One warp owns one output feature and walks its
// weight row; every lane keeps a partial sum per activation row, reduced across the warp at the end.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

constexpr int kWarps = 8;   // output features per block
constexpr int kUnroll = 4;  // 16-byte loads in flight per lane

enum Kind { kF32, kBF16, kF16, kFP8, kFP4 };

// Weights per 16-byte chunk.
template <int K>
constexpr int kElems = K == kF32 ? 4 : (K == kBF16 || K == kF16) ? 8 : K == kFP8 ? 16 : 32;

template <int K>
__device__ __forceinline__ void dequantize(const uint4& v, float* out) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t u = words[i];
        if constexpr (K == kF32) {
            out[i] = __uint_as_float(u);
        } else if constexpr (K == kBF16) {
            out[2 * i] = bf16_bits_to_f32(static_cast<uint16_t>(u & 0xffff));
            out[2 * i + 1] = bf16_bits_to_f32(static_cast<uint16_t>(u >> 16));
        } else if constexpr (K == kF16) {
            out[2 * i] = f16_bits_to_f32(static_cast<uint16_t>(u & 0xffff));
            out[2 * i + 1] = f16_bits_to_f32(static_cast<uint16_t>(u >> 16));
        } else if constexpr (K == kFP8) {
#pragma unroll
            for (int b = 0; b < 4; ++b) out[4 * i + b] = f8e4m3_to_f32(static_cast<uint8_t>(u >> (8 * b)));
        } else {
            // Little-endian bytes, low nibble first: element 2j is byte j's low nibble.
#pragma unroll
            for (int b = 0; b < 8; ++b) out[8 * i + b] = fp4e2m1_to_f32(static_cast<uint8_t>((u >> (4 * b)) & 0xf));
        }
    }
}

// out[t, n] = sum_k x[t, k] * W[w_row0 + n, k] for t < rows (<= kGemvMaxRows).
template <int K>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(float* __restrict__ out, int64_t ldc,
                                                           const float* __restrict__ x, int64_t lda, int rows,
                                                           WeightDesc w, int64_t w_row0, int64_t n_out) {
    constexpr int E = kElems<K>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    if (n >= n_out) return;
    const int64_t row = w_row0 + n, chunks = w.cols / E;
    const uint4* wrow = reinterpret_cast<const uint4*>(w.data) + row * chunks;
    float acc[kGemvMaxRows] = {};
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * 32;
            v[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * 32;
            if (c >= chunks) break;
            const int64_t k0 = c * E;
            float wv[E];
            dequantize<K>(v[u], wv);
            float s = 1.0f;  // one scale per chunk: the chunk never straddles a scale block
            if constexpr (K == kFP8) {
                const int64_t si = (row / w.block_rows) * w.scale_cols + k0 / w.block_cols;
                s = w.scale_f32 ? reinterpret_cast<const float*>(w.scale)[si] : e8m0_to_f32(w.scale[si]);
            } else if constexpr (K == kFP4) {
                s = e8m0_to_f32(w.scale[row * w.scale_cols + k0 / w.block_cols]);
            }
#pragma unroll
            for (int t = 0; t < kGemvMaxRows; ++t) {
                if (t >= rows) break;
                const float* xr = x + t * lda + k0;
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(wv[e], __ldg(xr + e), d);
                acc[t] = fmaf(d, s, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxRows; ++t) {
        if (t >= rows) break;
        float a = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) out[t * ldc + n] = a;
    }
}

int kind_of(const WeightDesc& w) {
    if (w.format == 1) return kFP8;
    if (w.format == 2) return kFP4;
    return w.dtype == 0 ? kF32 : w.dtype == 1 ? kBF16 : kF16;
}

int elems_of(int kind) {
    switch (kind) {
        case kF32: return kElems<kF32>;
        case kBF16: return kElems<kBF16>;
        case kF16: return kElems<kF16>;
        case kFP8: return kElems<kFP8>;
        default: return kElems<kFP4>;
    }
}

}  // namespace

bool gemv_applies(int64_t rows, const WeightDesc& w) {
    if (rows < 1 || rows > kGemvMaxRows) return false;
    const int e = elems_of(kind_of(w));
    // Whole 16-byte chunks per row (so rows stay 16-byte aligned), each inside one scale block.
    if (w.cols % e != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
    if (w.format != 0 && w.block_cols % e != 0) return false;
    return true;
}

void launch_gemv(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                 int64_t w_row0, int64_t n_out, cudaStream_t stream) {
    if (n_out == 0) return;
    const unsigned grid = static_cast<unsigned>((n_out + kWarps - 1) / kWarps);
    const int r = static_cast<int>(rows);
    switch (kind_of(w)) {
        case kF32: gemv_kernel<kF32><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, r, w, w_row0, n_out); break;
        case kBF16: gemv_kernel<kBF16><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, r, w, w_row0, n_out); break;
        case kF16: gemv_kernel<kF16><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, r, w, w_row0, n_out); break;
        case kFP8: gemv_kernel<kFP8><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, r, w, w_row0, n_out); break;
        default: gemv_kernel<kFP4><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, r, w, w_row0, n_out); break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
