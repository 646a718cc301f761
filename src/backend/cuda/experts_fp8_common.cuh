// What the FP8 experts' kernels share (experts_fp8.cu at prefill, experts_fp8_decode.cu at decode): the k order of
// their B operands, which weight row an A slice row is, and the shared table that re-expresses FP4 codes as e4m3
// (see experts_fp8.cu's header for why that is exact).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/wgmma_common.cuh"

namespace deepinfer::cuda::fp8x {

constexpr int kSpan = 14;              // binades a weight row's scales may span
constexpr int kTableRows = kSpan + 1;  // d = e - ref = -8 .. 6

// Stored column p of a 128-block of B holds real column k8perm(p): wgmma step s (k32) gives lane 4 g + c the real k
// 32 c + 8 s .. + 3 (a0 / a1) and 32 c + 8 s + 4 .. + 7 (a2 / a3), so each lane decodes one 16-byte FP4 chunk (one
// E8M0 group) a block.
__host__ __device__ constexpr int k8perm(int p) {
    return 32 * ((p & 15) >> 2) + 8 * (p >> 5) + 4 * ((p >> 4) & 1) + (p & 3);
}
__host__ __device__ constexpr int k8perm_inv(int k) {
    return 32 * ((k >> 3) & 3) + 16 * ((k >> 2) & 1) + 4 * (k >> 5) + (k & 3);
}
static_assert(wgmma::inverse_permutations_of_128<k8perm, k8perm_inv>(), "k8perm and k8perm_inv are inverse");
static_assert(k8perm(4) == 32 && k8perm(16) == 4 && k8perm(32) == 8 && k8perm(20) == 36,
              "step 0: lane 1's a0 is real k 32; a2 of lane 0 is k 4; step 1 starts at k 8");
static_assert(k8perm(4 * 5) + 3 == k8perm(4 * 5 + 3), "a lane's 4 stored positions are 4 consecutive real columns");

// The weight row (matrix which = 0/1/2: W1/W3/W2, and its row) of row r of A slice s: gate/up slices interleave W1 and
// W3 rows so that a lane's fragment rows g and g + 8 are the gate and up rows of one feature (row r of slice s is
// feature f0 + 32 s + 8 (r / 16) + r % 8, of W1 where r % 16 < 8, else of W3); down slice s is W2 rows f0 + 64 s ..
template <bool kGateUp>
__device__ __forceinline__ void slice_row(int f0, int s, int r, int& which, int& row) {
    which = kGateUp ? (r >> 3) & 1 : 2;
    row = kGateUp ? f0 + 32 * s + 8 * (r >> 4) + (r & 7) : f0 + 64 * s + r;
}

// Byte tid of the e4m3 table (kTableRows rows of 8 bytes; threads 0 .. 8 kTableRows - 1 of the block each write one):
// byte m of row i is the e4m3 code of e2m1 magnitude m times 2^(i - 8), exact.
__device__ __forceinline__ void fill_e4m3_table(uint8_t* table, int tid) {
    if (tid >= kTableRows * 8) return;
    const int i = tid / 8, m = tid % 8;
    // e2m1 magnitude code m: 0, 0.5 (subnormals), then (1 + (m & 1) / 2) 2^(m / 2 - 1): 1, 1.5, 2, 3, 4, 6
    const float v = m < 2 ? 0.5f * m : ldexpf(1.0f + 0.5f * (m & 1), (m >> 1) - 1);
    table[tid] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(ldexpf(v, i - 8), __NV_SATFINITE, __NV_E4M3));
}

// A consumer lane's two weight rows arow and arow + 8 of an A slice of expert e: ref_idx[h] = kSpan - the row's
// largest E8M0 byte (table row e + ref_idx[h] is the row of d = e - ref) and post[h] = 2^(ref - 127), the factor
// its products take in the epilogue (2^-133 .. 2^121).
template <bool kGateUp>
__device__ __forceinline__ void row_refs(const ExpertsFp8Ptrs& e, int f0, int wg, int arow, int (&ref_idx)[2],
                                         float (&post)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int which, row;
        slice_row<kGateUp>(f0, wg, arow + 8 * h, which, row);
        const int top = e.row_max[which][row];
        ref_idx[h] = kSpan - top;
        post[h] = pow2_int(top - 6 - 127);
    }
}

// A lane's A fragments of one 128-k block: rows arow and arow + 8 of the slice at sw (64 bytes of FP4 a row), chunk
// c, their E8M0 bytes at ss[r * ss_row + c], re-expressed as e4m3 through the table (a[k4]: wgmma step k4's a0-a3).
__device__ __forceinline__ void decode_fragments(const uint8_t* sw, const uint8_t* ss, int ss_row, const uint2* table,
                                                 int arow, int c, const int (&ref_idx)[2], uint32_t (&a)[4][4]) {
    uint4 raw[2];
    uint2 t[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = arow + 8 * h;
        raw[h] = *reinterpret_cast<const uint4*>(sw + r * 64 + c * 16);
        t[h] = table[ss[r * ss_row + c] + ref_idx[h]];
    }
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
        chunks::fp4_word_to_e4m3(wgmma::word_of(raw[0], k4), t[0], a[k4][0], a[k4][2]);
        chunks::fp4_word_to_e4m3(wgmma::word_of(raw[1], k4), t[1], a[k4][1], a[k4][3]);
    }
}

// A tile's accumulators cleared, blk (the wgmmas' accumulator) pinned as defined before the first asynchronous product.
template <int N>
__device__ __forceinline__ void clear_accumulators(float (&acc)[N / 2], float (&blk)[N / 2]) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        acc[i] = 0.0f;
        blk[i] = 0.0f;
        wgmma::pin(blk[i]);
    }
}

// A block's products (blk, m64 x N) promoted into the fp32 accumulators times the activation scales xs of the
// block's B rows (the lane's columns 8 j + 2 c and 8 j + 2 c + 1).
template <int N>
__device__ __forceinline__ void promote(float (&acc)[N / 2], const float (&blk)[N / 2], const float* xs, int c) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const float2 x = *reinterpret_cast<const float2*>(xs + 8 * j + 2 * c);
        acc[4 * j + 0] = fmaf(blk[4 * j + 0], x.x, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(blk[4 * j + 1], x.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(blk[4 * j + 2], x.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(blk[4 * j + 3], x.y, acc[4 * j + 3]);
    }
}

// One 128-k block of a consumer warpgroup, its A fragments a decoded: 4 wgmma steps into the block accumulator blk (B
// at shared address b; step k4 starts 32 bytes on inside the swizzle atom's rows); decode_next() runs beside them
// (the next block's A fragments, into the other set); then blk promoted into acc times the scales xs.
template <int N, class DecodeNext>
__device__ __forceinline__ void block_products(float (&acc)[N / 2], float (&blk)[N / 2], uint32_t (&a)[4][4],
                                               uint32_t b, const float* xs, int c, DecodeNext&& decode_next) {
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4)
#pragma unroll
        for (int i = 0; i < 4; ++i) wgmma::pin(a[k4][i]);  // defined before the fence
    const uint64_t desc = wgmma::b_desc(b);
    wgmma::wgmma_fence();
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4)
        wgmma::Wgmma8<N>::mma(blk, a[k4][0], a[k4][1], a[k4][2], a[k4][3], desc + 2 * k4, k4 > 0 ? 1u : 0u);
    wgmma::wgmma_commit();
    decode_next();
    wgmma::wgmma_wait<0>();
    promote<N>(acc, blk, xs, c);
}

}  // namespace deepinfer::cuda::fp8x
