// Warp-level tensor-core helpers (bf16 mma.sync m16n8k16, tf32 m16n8k8, ldmatrix) shared by the tensor-core
// kernels.
//
// Fragment layout of mma.m16n8k16 (lane = 4 g + c): A (16 x 16, row) a0: row g, k 2c..2c+1; a1: row g + 8;
// a2: row g, k 2c+8..; a3: row g + 8, k 2c+8..; B (16 x 8, col) b0: k 2c..2c+1 of column g, b1: k 2c+8..;
// C/D (16 x 8 f32) d0, d1: row g, columns 2c, 2c+1; d2, d3: row g + 8.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace deepinfer::cuda::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i, r[i] its fragment (lane
// 4 g + c holds row g, columns 2c, 2c+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// Two matrices (row addresses from lanes 0 .. 15).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
// Four matrices, transposed: lane 4 g + c holds rows 2c, 2c+1 of column g (a B fragment of a row-major
// [k][n] tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a . b: a 16x16 (row), b 16x8 (col), bf16; d 16x8 f32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with A's four registers given one by one (a0, a2: row g; a1, a3: row g + 8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    const uint32_t a[4] = {a0, a1, a2, a3};
    mma_bf16(d, a, b0, b1);
}

// d += a . b: a 16x8 (row), b 8x8 (col), tf32 (fp32 bit patterns whose low 13 bits the unit ignores); d 16x8 f32.
// Fragments (lane = 4 g + c): a0 row g, k c; a1 row g + 8, k c; a2 row g, k c + 4; a3 row g + 8, k c + 4;
// b0 k c of column g, b1 k c + 4; d as for m16n8k16.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x rounded to tf32 (nearest, ties away from zero): fp32 bits with the low 13 zero.
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// Two floats as a bf16 pair (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// 16 bytes global -> shared, asynchronously, to shared address dst; src_bytes 0 writes zeros (src must still be
// a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    cp_async16(smem_addr(dst), src, static_cast<uint32_t>(src_bytes));
}
// 4 bytes through L1 (cp.async.cg takes only 16); src 4-byte aligned.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) { cp_async4(smem_addr(dst), src); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace deepinfer::cuda::mma
