// Hopper (sm_90a) helpers shared by the kernels that stream weights through an mbarrier ring into wgmma.mma_async
// with A in registers (experts_wgmma.cu, experts_fp8.cu, gemv_wgmma.cu; attention_wgmma.cu uses the ring's wrappers
// and fences with both operands in shared memory, wgmma_ss.cuh): the mbarrier and cp.async-arrive wrappers and the
// ring's set-up, the proxy and wgmma fences, the shared-memory descriptor of a K-major B operand under the 128-byte
// swizzle, the m64nNk16 bf16 and m64nNk32 e4m3 products (N = 8 .. 128) and the gather that writes activations in a
// kernel's permuted k order.
//
// The stage ring these kernels share: a producer warpgroup copies each stage with cp.async and signals the stage's
// full barrier with cp.async.mbarrier.arrive.noinc (one arrival per producer thread, counted when its copies have
// landed); the consumer threads wait on it (phase parity = round & 1), read the stage and arrive on its empty
// barrier; the producer waits on that one with the opposite parity (a fresh barrier passes at once) before it
// refills the stage.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma_operands.cuh"

namespace deepinfer::cuda::wgmma {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// The barrier's arrival (one of its expected count) when this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins a register value at this point of the program (accumulators around the asynchronous products).
__device__ __forceinline__ void pin(float& v) { asm volatile("" : "+f"(v)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& v) { asm volatile("" : "+r"(v)::"memory"); }
__device__ __forceinline__ void pin(uint64_t& v) { asm volatile("" : "+l"(v)::"memory"); }

// Descriptor of a K-major bf16 B operand under the 128-byte swizzle: start address (16-byte units), LBO 1
// (unused by swizzled K-major layouts), SBO 1024 bytes (next 8 rows), swizzle mode 1 (128B) in bits 62-63.
// Tiles are 1024-byte aligned, so the base offset is 0; a k step inside the atom adds 32 bytes to the start.
__device__ __forceinline__ uint64_t b_desc(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
           (uint64_t{1} << 62);
}

// wgmma.mma_async m64nNk16, f32 += bf16 A (registers: a0 row g k 2c..; a1 row g+8; a2 row g k 2c+8..; a3 row g+8
// k 2c+8..) x bf16 B (shared memory, K-major, descriptor). d[4 j + v]: row g + 8 (v >> 1), column 8 j + 2 c + (v & 1).
template <int N>
struct Wgmma;
template <>
struct Wgmma<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DI_WGMMA_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
            : DI_WGMMA_ACC64(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    }
};
template <>
struct Wgmma<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" DI_WGMMA_REGS32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
            : DI_WGMMA_ACC32(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    }
};
template <>
struct Wgmma<32> {
    static __device__ __forceinline__ void mma(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" DI_WGMMA_REGS16 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
            : DI_WGMMA_ACC16(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    }
};
template <>
struct Wgmma<16> {
    static __device__ __forceinline__ void mma(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {" DI_WGMMA_REGS8 "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
            : DI_WGMMA_ACC8(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    }
};

template <>
struct Wgmma<8> {
    static __device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {" DI_WGMMA_REGS4 "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
            : DI_WGMMA_ACC4(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    }
};

// wgmma.mma_async m64nNk32, f32 (+)= e4m3 A (registers, four codes each: a0 row g k 4c .. 4c + 3, a1 row g + 8,
// a2 / a3 the same at k 16 + 4c) x e4m3 B (shared memory, K-major, descriptor); scale_d = 0 overwrites d.
// d[4 j + v]: row g + 8 (v >> 1), column 8 j + 2 c + (v & 1).
template <int N>
struct Wgmma8;
template <>
struct Wgmma8<16> {
    static __device__ __forceinline__ void mma(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc, uint32_t scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS8 "}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
            : DI_WGMMA_ACC8(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
    }
};
template <>
struct Wgmma8<32> {
    static __device__ __forceinline__ void mma(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc, uint32_t scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS16 "}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
            : DI_WGMMA_ACC16(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
    }
};
template <>
struct Wgmma8<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc, uint32_t scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS32 "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
            : DI_WGMMA_ACC32(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
    }
};
template <>
struct Wgmma8<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc, uint32_t scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
            : DI_WGMMA_ACC64(d)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d));
    }
};

// The stage ring's barriers at bars: full[stages] (full_count arrivals a phase), then empty[stages] (empty_count).
// One thread calls it, before the block's first barrier.
__device__ __forceinline__ void mbar_init_ring(uint32_t bars, int stages, uint32_t full_count, uint32_t empty_count) {
    for (int s = 0; s < stages; ++s) {
        mbar_init(bars + 8 * s, full_count);
        mbar_init(bars + 8 * (stages + s), empty_count);
    }
}
// Word w (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}
// The wgmma width (N 16, 32, 64 or 128) of a tile of `rows` token rows.
__device__ __forceinline__ int tile_width(int rows) { return rows > 64 ? 128 : rows > 32 ? 64 : rows > 16 ? 32 : 16; }

// Whether Perm and Inv are inverse permutations of 0..127: a kernel's k order within a 128-column block (stored
// column q holds real column Perm(q)), checked at compile time.
template <int (*Perm)(int), int (*Inv)(int)>
constexpr bool inverse_permutations_of_128() {
    for (int q = 0; q < 128; ++q)
        if (Perm(q) < 0 || Perm(q) >= 128 || Inv(Perm(q)) != q) return false;
    return true;
}

// The k order of both wgmma kernels' B operands within a 128-column block: stored column q holds real column kperm(q).
// In a 128-k stage, lane 4 g + c of a warp holds for its A rows the 32 real k 32 c .. 32 c + 31, decoded four codes
// at a time (k 32 c + 4 s .. + 3, codes b0..b3 in memory order) for wgmma step s as the pairs a0 = (b0, b2) and
// a2 = (b1, b3) (gemv_wgmma.cu: one FP8 word; experts_wgmma.cu: half an FP4 word). The A fragment wants a0 = logical
// k 2c, 2c+1 and a2 = 2c+8, 2c+9 of the step, so logical k p (0..15) of step s is the real k
//     kperm(16 s + p) = 32 ((p & 7) >> 1) + 4 s + 2 (p & 1) + (p >> 3)
// (a bijection of 0..127; a dot product does not care about k order, so the activations are stored in that order).
__host__ __device__ constexpr int kperm(int q) {
    return 32 * ((q & 7) >> 1) + 4 * (q >> 4) + 2 * (q & 1) + ((q >> 3) & 1);
}
// Stored column of real column k.
__host__ __device__ constexpr int kperm_inv(int k) {
    return 16 * ((k >> 2) & 7) + 8 * (k & 1) + 2 * (k >> 5) + ((k >> 1) & 1);
}
static_assert(inverse_permutations_of_128<kperm, kperm_inv>(), "kperm and kperm_inv are inverse permutations");
static_assert(kperm(0) == 0 && kperm(1) == 2 && kperm(2) == 32 && kperm(8) == 1 && kperm(9) == 3 && kperm(16) == 4,
              "a0 = (b0, b2) and a2 = (b1, b3) of the 4 codes of step s of lane c's 32, c = 1 at k 32; step 1 is k 4");
static_assert(kperm(8 * 5 + 3) == kperm(8 * 5) + 32 + 2 && kperm(8 * 6 + 6) == kperm(8 * 6) + 96,
              "the 8 stored columns of a chunk are 8 real columns 32 (j / 2) + 2 (j % 2) past the first");

// 8 activations src[32 (j / 2) + 2 (j % 2)], j = 0..7, rounded to bf16 (nearest even) as one 16-byte chunk: the 8
// stored columns 8 m .. 8 m + 7 of a block in kperm order, src = the block + kperm(8 m).
__device__ __forceinline__ uint4 bf16_chunk_of(const float* __restrict__ src) {
    uint4 o;
    o.x = mma::pack_bf16(__ldg(src), __ldg(src + 2));
    o.y = mma::pack_bf16(__ldg(src + 32), __ldg(src + 34));
    o.z = mma::pack_bf16(__ldg(src + 64), __ldg(src + 66));
    o.w = mma::pack_bf16(__ldg(src + 96), __ldg(src + 98));
    return o;
}

}  // namespace deepinfer::cuda::wgmma
