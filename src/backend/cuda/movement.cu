// Row gather/scatter through device addresses, index lists from runs, element-wise add and scale, the MoE
// combine.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// float4 copies where both ends are 16-byte aligned (a thread per element with a 64-bit division each ran the decode's
// key gathers at ~1.5 TB/s), kCopyThreads threads a block.
constexpr int kCopyThreads = 128;

// A block per row (the grid's x dimension takes up to 2^31 - 1 of them).
unsigned row_grid(int64_t r) {
    DI_ICHECK(r <= INT32_MAX, "row movement: ", r, " rows");
    return static_cast<unsigned>(r);
}

// Threads a row of c floats gets in copy_rows_kernel: a warp up to 128 floats (32 float4s), two up to 256, else the
// whole block. One block a row left most of a block idle on narrow rows: the indexer's 512-byte key rows (32,800 of
// them at batch 32) took 40 us, 0.8 TB/s.
int copy_threads_per_row(int64_t c) { return c <= 128 ? 32 : c <= 256 ? 64 : kCopyThreads; }

// One row of c floats by `threads` threads (this one `lane`): float4 copies where the width and both ends allow.
__device__ __forceinline__ void copy_row(float* __restrict__ to, const float* __restrict__ from, int64_t c, int lane,
                                         int threads) {
    if (c % 4 == 0 && (reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to)) % 16 == 0) {
        const float4* f4 = reinterpret_cast<const float4*>(from);
        float4* t4 = reinterpret_cast<float4*>(to);
        for (int64_t j = lane; j < c / 4; j += threads) t4[j] = f4[j];
    } else {
        for (int64_t j = lane; j < c; j += threads) to[j] = from[j];
    }
}

template <bool kGather>  // gather: dst [r, c] from rows[i]; scatter: rows[i] from src [r, c]
__global__ void __launch_bounds__(kCopyThreads)
    copy_rows_kernel(float* const* __restrict__ rows, float* __restrict__ packed, int64_t r, int64_t c, int tpr) {
    pdl_prologue();  // see pdl.cuh
    const int per_block = kCopyThreads / tpr, lane = static_cast<int>(threadIdx.x) % tpr;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / tpr;
    if (i >= r) return;
    float* row = rows[i];
    float* line = packed + i * c;
    copy_row(kGather ? line : row, kGather ? row : line, c, lane, tpr);
}

template <bool kGather>
void launch_copy_rows(float* const* rows, float* packed, int64_t r, int64_t c, cudaStream_t stream) {
    if (r * c == 0) return;
    const int tpr = copy_threads_per_row(c), per_block = kCopyThreads / tpr;
    launch_pdl(copy_rows_kernel<kGather>, row_grid((r + per_block - 1) / per_block), kCopyThreads, 0, stream, rows,
               packed, r, c, tpr);
    DI_CUDA_LAUNCH_CHECK();
}

// Backend::copy_rows: kPairThreads threads a row (a ring row of 256-1024 floats is 1-4 KB).
constexpr int kPairThreads = 64;
__global__ void __launch_bounds__(kCopyThreads)
    copy_row_pairs_kernel(float* const* __restrict__ dst, const float* const* __restrict__ src,
                          const int32_t* __restrict__ cols, int64_t r) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * (kCopyThreads / kPairThreads) + threadIdx.x / kPairThreads;
    if (i >= r) return;
    copy_row(dst[i], src[i], cols[i], static_cast<int>(threadIdx.x) % kPairThreads, kPairThreads);
}

// One block per row of runs [R, 5] = (at, a, na, b, nb).
// Entries a run would write outside dst [0, n) are skipped (the CPU backend reports such runs as errors; on the device
// the runs are not read by the host, so an out-of-range one must at least not write over other memory).
__global__ void fill_index_ranges_kernel(int32_t* __restrict__ dst, int64_t n, const int32_t* __restrict__ runs) {
    pdl_prologue();  // see pdl.cuh
    const int64_t q = blockIdx.x;
    const int32_t* run = runs + 5 * q;
    const int64_t at = run[0], a = run[1], na = run[2], b = run[3], nb = run[4];
    for (int64_t i = threadIdx.x; i < na + nb; i += kCopyThreads)
        if (at + i >= 0 && at + i < n) dst[at + i] = static_cast<int32_t>(i < na ? a + i : b + (i - na));
}

// One block per row of runs [R, 4] = (at, address, count, stride in bytes).
// Entries outside dst [0, n) are skipped, as above.
__global__ void fill_row_addresses_kernel(int64_t* __restrict__ dst, int64_t n, const int64_t* __restrict__ runs) {
    pdl_prologue();  // see pdl.cuh
    const int64_t* run = runs + 4 * static_cast<int64_t>(blockIdx.x);
    const int64_t at = run[0], address = run[1], count = run[2], stride = run[3];
    for (int64_t i = threadIdx.x; i < count; i += kCopyThreads)
        if (at + i >= 0 && at + i < n) dst[at + i] = address + i * stride;
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void scale_kernel(float* __restrict__ x, float s, int64_t n) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ routed,
                                   const float* __restrict__ weights, const float* __restrict__ shared, int64_t t,
                                   int64_t k, int64_t d) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= t * d) return;
    const int64_t r = i / d, c = i % d;
    float acc = 0;
    for (int64_t j = 0; j < k; ++j) acc += weights[r * k + j] * routed[(r * k + j) * d + c];
    out[i] = acc + shared[i];
}

// The same sums four columns a thread (d % 4 == 0, 16-byte aligned rows), a row per grid row: no 64-bit division a
// thread, and k independent 16-byte loads in flight. Each output sums its k products in the scalar kernel's order.
__global__ void moe_combine_vec4_kernel(float4* __restrict__ out, const float4* __restrict__ routed,
                                        const float* __restrict__ weights, const float4* __restrict__ shared, int64_t t,
                                        int64_t k, int64_t d4) {
    pdl_prologue();  // see pdl.cuh
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= d4) return;
    for (int64_t r = blockIdx.y; r < t; r += gridDim.y) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int64_t j = 0; j < k; ++j) {
            const float w = __ldg(weights + r * k + j);
            const float4 v = __ldg(routed + (r * k + j) * d4 + c);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        const float4 sh = __ldg(shared + r * d4 + c);
        out[r * d4 + c] = make_float4(acc.x + sh.x, acc.y + sh.y, acc.z + sh.z, acc.w + sh.w);
    }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

void launch_gather_rows(float* dst, const float* const* rows, int64_t r, int64_t c, cudaStream_t stream) {
    launch_copy_rows<true>(const_cast<float* const*>(rows), dst, r, c, stream);
}

void launch_scatter_rows(float* const* rows, const float* src, int64_t r, int64_t c, cudaStream_t stream) {
    launch_copy_rows<false>(rows, const_cast<float*>(src), r, c, stream);
}

void launch_copy_row_pairs(float* const* dst, const float* const* src, const int32_t* cols, int64_t r,
                           cudaStream_t stream) {
    if (r == 0) return;
    constexpr int per_block = kCopyThreads / kPairThreads;
    launch_pdl(copy_row_pairs_kernel, row_grid((r + per_block - 1) / per_block), kCopyThreads, 0, stream, dst, src,
               cols, r);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_fill_index_ranges(int32_t* dst, int64_t n, const int32_t* runs, int64_t r, cudaStream_t stream) {
    if (r == 0) return;
    launch_pdl(fill_index_ranges_kernel, row_grid(r), kCopyThreads, 0, stream, dst, n, runs);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_fill_row_addresses(int64_t* dst, int64_t n, const int64_t* runs, int64_t r, cudaStream_t stream) {
    if (r == 0) return;
    launch_pdl(fill_row_addresses_kernel, row_grid(r), kCopyThreads, 0, stream, dst, n, runs);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    launch_pdl(add_kernel, blocks_for(n), 256, 0, stream, x, y, n);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_scale(float* x, float s, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    launch_pdl(scale_kernel, blocks_for(n), 256, 0, stream, x, s, n);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_moe_combine(float* out, const float* routed, const float* weights, const float* shared, int64_t t,
                        int64_t k, int64_t d, cudaStream_t stream) {
    if (t * d == 0) return;
    const bool vec4 = d % 4 == 0 && (reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(routed) |
                                     reinterpret_cast<uintptr_t>(shared)) %
                                            16 ==
                                        0;
    if (vec4) {
        const int64_t d4 = d / 4;
        const dim3 grid(blocks_for(d4), static_cast<unsigned>(std::min<int64_t>(t, 65535)));
        launch_pdl(moe_combine_vec4_kernel, grid, 256, 0, stream, reinterpret_cast<float4*>(out),
                   reinterpret_cast<const float4*>(routed), weights, reinterpret_cast<const float4*>(shared), t, k, d4);
        DI_CUDA_LAUNCH_CHECK();
        return;
    }
    launch_pdl(moe_combine_kernel, blocks_for(t * d), 256, 0, stream, out, routed, weights, shared, t, k, d);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
