// Shared device helpers for the CUDA kernels: error checks, dtype decoding, weight element access.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/error.h"

#define DI_CUDA_CHECK(expr)                                                                          \
    do {                                                                                             \
        cudaError_t di_err_ = (expr);                                                                \
        if (di_err_ != cudaSuccess)                                                                  \
            ::deepinfer::detail::throw_internal_failure(__FILE__, __LINE__, #expr,                   \
                                                        cudaGetErrorString(di_err_));                \
    } while (0)

// After a kernel launch: configuration errors surface here, execution errors at the next sync.
#define DI_CUDA_LAUNCH_CHECK() DI_CUDA_CHECK(cudaGetLastError())

namespace deepinfer::cuda {

// Whether p is 16-byte aligned (float4 and 16-byte copy paths).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Storage formats of a weight matrix, as the kernels see them (POD, passed by value).
struct WeightDesc {
    const uint8_t* data;    // [rows, cols] in `dtype`; FP4: [rows, cols / 2] packed bytes
    const uint8_t* scale;   // FP8: [ceil(rows/br), ceil(cols/bc)] E8M0 or F32; FP4: [rows, cols/group] E8M0
    int64_t rows, cols;
    int64_t scale_cols;     // columns of the scale grid
    int format;             // 0 dense, 1 FP8 block, 2 FP4 group
    int dtype;              // dense: 0 F32, 1 BF16, 2 F16
    int scale_f32;          // FP8: scales are F32 (1) or E8M0 (0)
    int block_rows, block_cols;  // FP8 block; FP4 group = block_cols
};

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

__device__ __forceinline__ float f16_bits_to_f32(uint16_t v) {
    const uint32_t sign = (v >> 15) & 1u, exp = (v >> 10) & 0x1fu, mant = v & 0x3ffu;
    float mag;
    if (exp == 0) mag = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    else if (exp == 31) mag = mant ? __uint_as_float(0x7fc00000u) : __uint_as_float(0x7f800000u);
    else mag = __uint_as_float(((exp + 112u) << 23) | (mant << 13));
    return sign ? -mag : mag;
}

__device__ __forceinline__ float f8e4m3_to_f32(uint8_t v) {
    const uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
    float mag;
    if (exp == 15 && mant == 7) mag = __uint_as_float(0x7fc00000u);
    else if (exp == 0) mag = static_cast<float>(mant) * 0.001953125f;  // m/8 * 2^-6
    else mag = __uint_as_float(((exp + 120u) << 23) | (mant << 20));
    return sign ? -mag : mag;
}

__device__ __forceinline__ float e8m0_to_f32(uint8_t e) {
    if (e == 255) return __uint_as_float(0x7fc00000u);
    if (e == 0) return __uint_as_float(0x00400000u);  // 2^-127, subnormal
    return __uint_as_float(static_cast<uint32_t>(e) << 23);
}

// e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit. Built from bits rather than read from a table: a
// table indexed by a runtime value lives in local memory, which made every FP4 product several times slower.
__device__ __forceinline__ float fp4e2m1_to_f32(uint8_t code) {
    const uint32_t e = (code >> 1) & 3u, m = code & 1u;
    const float v = e ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : (m ? 0.5f : 0.0f);
    return (code & 8) ? -v : v;
}

// acc + s * a, element by element (fmaf: the mHC collapse's arithmetic, shared by its kernels).
__device__ __forceinline__ float4 fma4v(float s, const float4& a, const float4& acc) {
    return make_float4(fmaf(s, a.x, acc.x), fmaf(s, a.y, acc.y), fmaf(s, a.z, acc.z), fmaf(s, a.w, acc.w));
}

// The largest of the warp's 32 values (fmaxf: NaN ignored unless all are NaN; any order gives the same); every lane
// gets it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// SwiGLU of one gate g and up u: silu(min(g, limit)) * clamp(u, +-limit), no clamp for limit <= 0 (the CPU op's
// recipe, term for term).
__device__ __forceinline__ float swiglu_value(float g, float u, float limit) {
    if (limit > 0) {  // a NaN stays NaN, as with the CPU's std::min / std::max and torch.clamp (fminf would drop it)
        g = g > limit ? limit : g;
        u = u > limit ? limit : u < -limit ? -limit : u;
    }
    return g / (1.0f + expf(-g)) * u;
}

// Sum over a block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. Every thread of the
// block must call it (it synchronizes the block).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
    return total;
}

// W[n, k] as fp32.
__device__ __forceinline__ float weight_at(const WeightDesc& w, int64_t n, int64_t k) {
    if (w.format == 0) {
        const int64_t i = n * w.cols + k;
        if (w.dtype == 0) return reinterpret_cast<const float*>(w.data)[i];
        const uint16_t bits = reinterpret_cast<const uint16_t*>(w.data)[i];
        return w.dtype == 1 ? bf16_bits_to_f32(bits) : f16_bits_to_f32(bits);
    }
    if (w.format == 1) {
        const int64_t si = (n / w.block_rows) * w.scale_cols + k / w.block_cols;
        const float s = w.scale_f32 ? reinterpret_cast<const float*>(w.scale)[si] : e8m0_to_f32(w.scale[si]);
        return f8e4m3_to_f32(w.data[n * w.cols + k]) * s;
    }
    const uint8_t byte = w.data[n * (w.cols / 2) + k / 2];
    const float s = e8m0_to_f32(w.scale[n * w.scale_cols + k / w.block_cols]);
    return fp4e2m1_to_f32((k & 1) ? (byte >> 4) : (byte & 0xf)) * s;
}

}  // namespace deepinfer::cuda
