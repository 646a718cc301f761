// wgmma.mma_async with both operands in shared memory (SS), bf16 in, f32 accumulators: the products of
// attention_wgmma.cu. A is K-major; B is K-major (kTransB false) or MN-major (true: B's rows of N contiguous, as a
// [K][N] tile stored row by row). Both under the 128-byte swizzle (sw128_desc).
#pragma once

#include <cstdint>

#include "backend/cuda/wgmma_operands.cuh"

namespace deepinfer::cuda::wgmma {

// Descriptor of a shared-memory operand under the 128-byte swizzle (atoms of 8 rows x 128 bytes, 1024-byte
// aligned, so the base offset is 0). K-major: lbo unused (16), sbo = the stride between 8-row groups. MN-major:
// lbo = the stride between 64-element (128-byte) column blocks along M or N, sbo = between 8-row groups along K.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
           (static_cast<uint64_t>(sbo >> 4) << 32) | (uint64_t{1} << 62);
}

// d (+)= A B for m64nNk16; accumulate 0 overwrites d. d[4 j + v]: row 16 (warp % 4) + g + 8 (v >> 1), column
// 8 j + 2 c + (v & 1) (g = lane / 4, c = lane % 4).
template <int N, bool kTransB>
struct WgmmaSS;
template <>
struct WgmmaSS<32, false> {
    static __device__ __forceinline__ void mma(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" DI_WGMMA_REGS16 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
            : DI_WGMMA_ACC16(d)
            : "l"(a), "l"(b), "r"(accumulate));
    }
};
template <>
struct WgmmaSS<256, true> {
    static __device__ __forceinline__ void mma(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DI_WGMMA_REGS128 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
            : DI_WGMMA_ACC128(d)
            : "l"(a), "l"(b), "r"(accumulate));
    }
};

}  // namespace deepinfer::cuda::wgmma
