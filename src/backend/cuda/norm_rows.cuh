// Row RMSNorm pieces shared by the norm kernels (pointwise.cu) and the mHC kernels that end in a norm
// (hyper_connection.cu): one copy of the arithmetic, so that fused and separate kernels agree bitwise.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

// A block per row of up to kNormThreads * kNormVec float4s (4096 floats), kNormVec float4s a thread in registers.
constexpr int kNormThreads = 256, kNormVec = 4;

// The sum of squares of v's floats, in the order every RMSNorm kernel here takes (one expression, so that the
// compiler contracts it alike everywhere).
template <int V>
__device__ __forceinline__ float sum_squares(const float4 (&v)[V]) {
    float ss = 0;
#pragma unroll
    for (int u = 0; u < V; ++u) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    return ss;
}

// A row's float4s i = first + u * step (u < V, i < n4) in registers; returns their sum of squares.
template <int V>
__device__ __forceinline__ float load_row(float4 (&v)[V], const float4* __restrict__ xr, int first, int step, int n4) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const int i = first + u * step;
        v[u] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return sum_squares(v);
}

// The normed float4 i of a row: v * inv, times weight[i] if any.
__device__ __forceinline__ float4 normed4(const float4& v, float inv, const float* __restrict__ weight, int i) {
    float4 r = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    if (weight) {
        const float4 w = reinterpret_cast<const float4*>(weight)[i];
        r = make_float4(w.x * r.x, w.y * r.y, w.z * r.z, w.w * r.w);
    }
    return r;
}

// yr[i] = normed4(v[u]) for the float4s load_row() read.
template <int V>
__device__ __forceinline__ void store_normed(float4* __restrict__ yr, const float4 (&v)[V], float inv,
                                             const float* __restrict__ weight, int first, int step, int n4) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const int i = first + u * step;
        if (i >= n4) break;
        yr[i] = normed4(v[u], inv, weight, i);
    }
}

// hc_collapse then RMSNorm of one row, by a block of kNormThreads: float4 i of the collapsed row is
// sum_j pre[j] s[j n4 + i] with fmaf from zero in ascending j (hc_collapse_vec_kernel's arithmetic), kept in
// registers and normed as rms_norm_vec_kernel norms a loaded row, so the output is bitwise the two kernels' without
// the collapsed row's trip through memory. s: the row's n streams [n, cols / 4]; pre: its n weights (any memory);
// out_row: [cols]. N > 0: n known at compile time.
template <int N>
__device__ __forceinline__ void collapse_norm_row(float* __restrict__ out_row, const float4* __restrict__ s,
                                                  const float* pre, const float* __restrict__ weight, int n,
                                                  int64_t cols, float eps) {
    const int n4 = static_cast<int>(cols / 4);
    if (N > 0) n = N;
    float4 v[kNormVec];
#pragma unroll
    for (int u = 0; u < kNormVec; ++u) {
        const int i = threadIdx.x + u * kNormThreads;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            for (int j = 0; j < n; ++j) acc = fma4v(pre[j], s[j * n4 + i], acc);
        }
        v[u] = acc;
    }
    const float inv = 1.0f / sqrtf(block_sum(sum_squares(v)) / static_cast<float>(cols) + eps);
    store_normed(reinterpret_cast<float4*>(out_row), v, inv, weight, threadIdx.x, kNormThreads, n4);
}

}  // namespace deepinfer::cuda
