// Weight chunks as operands of the bf16 tensor-core products that stream weights (gemv_tc.cu, the routed experts
// in moe.cu): mma.sync m16n8k16 with bf16 inputs and f32 accumulators, and the decode of a 16-byte chunk of weights
// into bf16 pairs. Weights exact in bf16 (BF16, FP8 and FP4 times E8M0 scales) decode exactly; F32, F16 and FP8
// with F32 scales round to nearest even.
// Also FP4's decode to e4m3 codes, the FP8 experts' A fragments (fp4_word_to_e4m3).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/weight_chunks.cuh"

namespace deepinfer::cuda::chunks {

// mma.sync m16n8k16 and the bf16 packing: see mma.cuh.
using mma::mma_bf16;
using mma::pack_bf16;

// A chunk of E weights as E/2 bf16 pairs (consecutive weights, the first in the low half), times its scale.
template <int K>
__device__ __forceinline__ void chunk_to_bf16(const uint4& v, float scale, uint32_t (&o)[kElems<K> / 2]) {
    if constexpr (K == kBF16) {
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    } else {
        constexpr int G = kGran<K>;
#pragma unroll
        for (int g = 0; g < kElems<K> / G; ++g) {
            float f[G];
            decode<K>(v, g, f);
#pragma unroll
            for (int i = 0; i < G / 2; ++i) o[g * G / 2 + i] = pack_bf16(f[2 * i] * scale, f[2 * i + 1] * scale);
        }
    }
}

__device__ __forceinline__ uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(selector));
    return d;
}

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// FP4 without conversion instructions: one 32-bit word of 8 e2m1 codes (low nibble first) -> 4 bf16 pairs, each
// exactly code x 2^S for the scale 2^S, in the pair order (c0, c4), (c1, c5), (c2, c6), (c3, c7) (the staged
// activations of the routed-expert kernel follow that order). Byte permutes look up twice each magnitude (0, 1,
// 2, 3, 4, 6, 8, 12: exact integers) from two constant registers and put it under the bf16 exponent of 128, so a
// pair reads as 128 + 2|v|; one bf16 FMA with (alpha, beta) = (2^(S-1), -2^(S+6)) leaves |v| 2^S exactly (every
// value has at most 4 significant bits), and the code's sign bit is ORed in. Bits of a bf16 pair of 2^p (both
// halves): (p + 127) * 0x00800080 for p in [-126, 127].
//
// kFp4FastScale: the E8M0 scale bytes e for which both constants are normal bf16 (S = e - 127 in [-125, 121]).
// Other scales take kSlow: (alpha, beta) = (2^-1, -2^6) (or (2^-2, -2^5) for e = 0, whose 2^-127 is not a normal
// bf16; then post = 2^-126), and the result is multiplied by post = 2^S (NaN for e = 255).
__device__ __forceinline__ bool fp4_fast_scale(uint32_t e) { return e - 2u <= 246u; }

struct Fp4Scale {
    uint32_t alpha, beta, post;  // bf16 pairs
};

template <bool kSlow>
__device__ __forceinline__ Fp4Scale fp4_scale(uint32_t e) {
    if constexpr (!kSlow) {
        return {(e - 1u) * 0x00800080u, (e + 6u) * 0x00800080u | 0x80008000u, 0u};
    } else {
        const uint32_t p = e == 255u ? 0x7fc07fc0u : e == 0u ? 0x00800080u : e * 0x00800080u;
        return e == 0u ? Fp4Scale{0x3e803e80u, 0xc200c200u, p} : Fp4Scale{0x3f003f00u, 0xc280c280u, p};
    }
}

template <bool kSlow>
__device__ __forceinline__ void fp4_word_to_bf16(uint32_t u, const Fp4Scale& s, uint32_t (&o)[4]) {
    constexpr uint32_t kLo = 0x03020100u, kHi = 0x0c080604u;  // byte c: 2|v| of magnitude code c
    constexpr uint32_t kMagic = 0x43434343u;                  // 0x43: the high byte of bf16 128
    const uint32_t m = u & 0x77777777u;                       // the magnitudes (a selector nibble's bit 3 is clear)
    const uint32_t n0 = byte_perm(kLo, kHi, byte_perm(m, 0u, 0x20u));  // bytes: codes 0, 1, 4, 5
    const uint32_t n1 = byte_perm(kLo, kHi, byte_perm(m, 0u, 0x31u));  // codes 2, 3, 6, 7
    const uint32_t w[4] = {byte_perm(n0, kMagic, 0x4240u), byte_perm(n0, kMagic, 0x4341u),
                           byte_perm(n1, kMagic, 0x4240u), byte_perm(n1, kMagic, 0x4341u)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t t = fma_bf16x2(w[j], s.alpha, s.beta);
        if constexpr (kSlow) t = mul_bf16x2(t, s.post);
        o[j] = t | ((u << (12 - 4 * j)) & 0x80008000u);  // the signs of codes j and j + 4 (bits 4j + 3, 4j + 19)
    }
}

// One word of 8 e2m1 codes (low nibble first) -> e4m3 bytes (experts_fp8.cu's A fragments) lo = codes 0-3, hi = codes
// 4-7 (code j in byte j % 4), the magnitudes from table row t (bytes: e4m3 of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
// times 2^d).
__device__ __forceinline__ void fp4_word_to_e4m3(uint32_t u, uint2 t, uint32_t& lo, uint32_t& hi) {
    const uint32_t m = u & 0x77777777u;  // magnitudes: a selector nibble's bit 3 (sign replication) clear
    const uint32_t ul = u << 4;          // byte b: bit 7 = the sign of code 2 b
    // Signs at bit 7 of byte j from code j: codes 0, 2 from ul's bytes 0, 1; codes 1, 3 from u's (4-7: bytes 2, 3).
    const uint32_t s_lo = byte_perm(u, ul, 0x1504u), s_hi = byte_perm(u, ul, 0x3726u);
    lo = byte_perm(t.x, t.y, m) | (s_lo & 0x80808080u);
    hi = byte_perm(t.x, t.y, m >> 16) | (s_hi & 0x80808080u);
}

}  // namespace deepinfer::cuda::chunks
