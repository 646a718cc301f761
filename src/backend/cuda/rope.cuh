// RoPE of interleaved pairs, shared by the RoPE kernels (pointwise.cu) and the attention that applies it to its
// queries and output (attention_wgmma.cu): one copy of the arithmetic, so that fused and separate kernels agree
// bitwise.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The rotation of a pair at `position` with inverse frequency f, cos and sin scaled by af: (c, s) for the forward
// rotation (s negated, exactly, for the inverse).
__device__ __forceinline__ void rope_cos_sin(int32_t position, float f, float af, float& c, float& s) {
    const float angle = static_cast<float>(position) * f;
    c = cosf(angle) * af;
    s = sinf(angle) * af;
}

// (a, b) rotated by (c, s), each output one rounded product and one fused multiply-add. Written out with the
// rounding intrinsics: a plain x * c - y * s leaves ptxas to choose which product it fuses into the subtraction,
// and it chose differently in different kernels (1-ulp differences that moved bf16 roundings of the queries).
__device__ __forceinline__ void rotate_by(float& a, float& b, float c, float s) {
    const float x = a, y = b;
    a = __fmaf_rn(x, c, -__fmul_rn(y, s));
    b = __fmaf_rn(y, c, __fmul_rn(x, s));
}

// RoPE of one interleaved pair (a, b) at `position` with inverse frequency f: rotated by position * f (by its
// negative for sign -1), cos and sin scaled by af.
__device__ __forceinline__ void rotate_pair(float& a, float& b, int32_t position, float f, float af, float sign) {
    float c, s;
    rope_cos_sin(position, f, af, c, s);
    rotate_by(a, b, c, s * sign);
}

}  // namespace deepinfer::cuda
