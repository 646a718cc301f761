// Weight rows read as 16-byte chunks and dequantized in registers: the decode helpers of the weight-streaming
// products (gemv.cu, the routed experts in moe.cu). Every stored value decodes exactly (FP4 times 2^-6).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda::chunks {

enum Kind { kF32, kBF16, kF16, kFP8, kFP4 };

// Weights per 16-byte chunk.
constexpr int elems_of(int k) { return k == kF32 ? 4 : (k == kBF16 || k == kF16) ? 8 : k == kFP8 ? 16 : 32; }
template <int K>
constexpr int kElems = elems_of(K);

inline int kind_of(const WeightDesc& w) {
    if (w.format == 1) return kFP8;
    if (w.format == 2) return kFP4;
    return w.dtype == 0 ? kF32 : w.dtype == 1 ? kBF16 : kF16;
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
    float2 f;
    asm("{.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;}"
        : "=f"(f.x), "=f"(f.y) : "r"(h));
    return f;
}

// Two e4m3 bytes (low byte = first element) to floats, exactly (e4m3 -> f16 is exact; sm_89+ does a pair in
// one instruction).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t pair) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<unsigned short>(pair & 0xffffu)));
    return half2_bits_to_float2(h);
}

// Weights per decode step: 4, except FP4 (a 32-bit word of 8 codes).
template <int K>
constexpr int kGran = K == kFP4 ? 8 : 4;

// Granule g (kGran<K> consecutive weights) of a chunk as floats. FP4 comes out times 2^-6 (see below).
template <int K>
__device__ __forceinline__ void decode(const uint4& v, int g, float* out) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    if constexpr (K == kF32) {
        for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
    } else if constexpr (K == kBF16 || K == kF16) {
        for (int i = 0; i < 2; ++i) {
            const uint32_t u = words[2 * g + i];
            if constexpr (K == kBF16) {
                out[2 * i] = __uint_as_float(u << 16);
                out[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
            } else {
                const float2 f = half2_bits_to_float2(u);
                out[2 * i] = f.x;
                out[2 * i + 1] = f.y;
            }
        }
    } else if constexpr (K == kFP8) {
        const float2 a = e4m3x2_to_float2(words[g]), b = e4m3x2_to_float2(words[g] >> 16);
        out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
    } else {
        // An e2m1 code s|e1 e0|m placed as the e4m3 byte s|0 0 e1 e0|m 0 0 is the same number times 2^-6,
        // zero and the subnormal 0.5 included; codes are little-endian nibbles, low nibble first.
        const uint32_t u = words[g];
        const uint32_t even = ((u << 4) & 0x80808080u) | ((u << 2) & 0x1c1c1c1cu);  // codes 0, 2, 4, 6
        const uint32_t odd = (u & 0x80808080u) | ((u >> 2) & 0x1c1c1c1cu);         // codes 1, 3, 5, 7
        const float2 a = e4m3x2_to_float2(even), b = e4m3x2_to_float2(even >> 16);
        const float2 c = e4m3x2_to_float2(odd), d = e4m3x2_to_float2(odd >> 16);
        out[0] = a.x, out[1] = c.x, out[2] = a.y, out[3] = c.y;
        out[4] = b.x, out[5] = d.x, out[6] = b.y, out[7] = d.y;
    }
}

}  // namespace deepinfer::cuda::chunks
