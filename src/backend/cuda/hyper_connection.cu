// Manifold-constrained hyper-connections: mix coefficients (split-width dot products, then a per-token finish
// with Sinkhorn), collapse and expand.
//
// Mix logits: for token t with flattened streams f_t [W = n * D] and fn [M, W], raw[t, j] = f_t . fn_j for
// j < M and raw[t, M] = f_t . f_t (the sum of squares, handled as one more "row" whose weights are f_t itself).
// At the model's shape (W = 16384, M = 24) fn is 1.5 MB and f 64 KB per token: a decode step is bound by memory
// latency, so the width is split over many blocks; a prefill by reading f once and its 2 * 25 FLOP per value, so
// 64 tokens share each staged piece of fn. The sums are done in a fixed order that depends only on W:
//   - W is cut into chunks of kChunk = 512 floats, and each chunk into 8 slices (one per warp); slice a of chunk
//     c is the four 16-float pieces at c * 512 + s * 128 + a * 16 (s = 0..3). Each slice is summed serially,
//     fmaf from 0 in ascending k (positions past W count as zeros).
//   - A chunk's partial is slice 0 + slice 1 + ... + slice 7, in that order; the partials go to a scratch
//     [T, chunks, M + 1] and the finish kernel adds them in chunk order.
// Two kernels compute exactly this, one for a few tokens (lanes own rows, whole chunk staged at once: one
// memory latency per block) and one for many (lanes own tokens, fn staged in shared memory and reused by 64
// tokens, f read once). Neither the kernel choice nor any tile shape changes the arithmetic, so a token's
// coefficients are bitwise the same whatever else is in the call (batch-invariant by construction).
// Outside batch-invariant and exact modes (HcDesc::tensor_cores), calls of more than kFewTokens tokens take the
// 3xTF32 tensor-core kernel instead (hc_dots_tc.cu: fp32-level accuracy, bound by reading f where the tiled
// kernel is bound by its FMAs), whose partials are per split of the width, their count set by the token count.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_rows.cuh"
#include "backend/cuda/pdl.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kStep = 128;               // width staged per step; warp a owns [a * 16, a * 16 + 16) of it
constexpr int kPiece = kStep / kWarps;   // 16
constexpr int kSteps = 4;                // steps per chunk
constexpr int kChunk = kStep * kSteps;   // 512 floats of width per partial
constexpr int kTileTokens = 64;          // tokens per block of the tiled kernel (2 per lane)
constexpr int kTilePad = kStep + 4;      // staged f row stride: rows land 16 bytes apart across banks
constexpr int kMaxGroupTokens = 4;       // tokens per block of the few-token kernel at most (see launch_dots)
constexpr int64_t kFewTokens = 64;       // up to this many tokens take the few-token kernel
constexpr int64_t kWideRowTokens = 512;  // from this many tokens the tiled kernel covers 24 rows per block
constexpr int64_t kSlabTokens = 4096;    // tokens per partials scratch (13 MB at W = 16384, M = 24)
constexpr int kFinishTokens = 8;         // tokens per finish block: enough blocks to overlap the partial loads
constexpr int kFinishBatch = 32;         // partials a finish thread loads before adding them
// Tokens per partials scratch of the tensor-core dots: 6.5 MB at W = 16384, M = 24 (4 splits: hc_dots_tc.cu).
constexpr int64_t kTcSlabTokens = 16384;

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The mix logits' scale, 1 / RMS of a token's flattened streams, from their sum of squares `ss` (raw row M).
__device__ __forceinline__ float mix_inv_rms(float ss, int64_t width, const HcDesc& p) {
    return 1.0f / sqrtf(ss / static_cast<float>(width) + p.norm_eps);
}

// pre weight j of a token (n = 4 layout) from its raw mix logit j and mix_inv_rms.
__device__ __forceinline__ float pre_weight(float raw, float inv, const HcDesc& p, int j) {
    return sigmoid(raw * inv * p.scale[0] + p.base[j]) + p.hc_eps;
}

// row[k .. k + 3], zeros past `width`. vec: width % 4 == 0 and rows 16-byte aligned (then k % 4 == 0 keeps a
// float4 wholly inside or wholly past the row).
__device__ __forceinline__ float4 load4(const float* __restrict__ row, int64_t k, int64_t width, bool vec) {
    if (vec) return k < width ? *reinterpret_cast<const float4*>(row + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v;
    v.x = k < width ? row[k] : 0.f;
    v.y = k + 1 < width ? row[k + 1] : 0.f;
    v.z = k + 2 < width ? row[k + 2] : 0.f;
    v.w = k + 3 < width ? row[k + 3] : 0.f;
    return v;
}

__device__ __forceinline__ float fma4(float4 x, float4 w, float acc) {
    acc = fmaf(x.x, w.x, acc);
    acc = fmaf(x.y, w.y, acc);
    acc = fmaf(x.z, w.z, acc);
    return fmaf(x.w, w.w, acc);
}

// hc_post's new stream k of a token at one float4 column: post_k y + sum_j comb[j][k] s_j, j in order. comb: the
// token's [n, n]; s: its n old streams there. hc_post_vec_kernel and the few-token dots' expand both take it, so that
// their streams are bitwise the same.
template <int kMax>
__device__ __forceinline__ float4 hc_post_stream(float pk, float4 yv, const float* comb, const float4 (&s)[kMax], int n,
                                                 int k) {
    float4 acc = make_float4(pk * yv.x, pk * yv.y, pk * yv.z, pk * yv.w);
#pragma unroll
    for (int j = 0; j < kMax; ++j)
        if (j < n) acc = fma4v(comb[j * n + k], s[j], acc);
    return acc;
}

// The expand of the sublayer before the mix (n = 4), made by the few-token dots as they stage f (hc_post_stream, so
// the streams are bitwise hc_post_vec_kernel<4>'s): out = the new streams f [T, 4, d], y [T, d],
// post [T, 4], comb [T, 4, 4], old [T, 4, d]; d a multiple of kChunk, so that a chunk lies in one stream.
struct FewExpand {
    float4* out;
    const float4* y;
    const float* post;
    const float* comb;
    const float4* old;
    int64_t d4;  // d / 4
};

// Few tokens (decode). Block (chunk c, group of G tokens); warp a computes slice a; lane v owns virtual row v
// (v == M: sum of squares) and keeps its 64 fn values of the slice in registers for all the group's tokens, whose
// dots it computes together (G independent FMA chains, each token's the same serial chain as alone). The group's f
// chunk is staged in shared memory while the fn loads are in flight; with kExpand, made there from the sublayer's
// output and the old streams (FewExpand) and written out as well: one launch, and one dependent launch's latency,
// fewer than hc_post then the dots (f is not read: the arguments f and vec are unused). H200, 8-layer decode step
// (CUPTI, time a call adds to the step): 4.7 us a boundary at batch 1 against 3.5 + 1.9 for the dots and hc_post,
// 9.6 against 7.8 + 2.7 at batch 32.
// part: [T, chunks, M + 1] f32; f: [T, W] f32; fn: [M, W] f32.
template <int G, bool kExpand = false>
__global__ void __launch_bounds__(kThreads)
    hc_dots_few_kernel(float* __restrict__ part, const float* __restrict__ f, const float* __restrict__ fn,
                       int64_t tokens, int64_t width, int rows, int chunks, bool vec, FewExpand ex) {
    pdl_prologue();  // see pdl.cuh
    extern __shared__ __align__(16) float smem[];
    float* fs = smem;                // [G tokens, 512] f32: the group's chunk (zeros past the tokens)
    float* red = smem + G * kChunk;  // [G tokens, 8 slices, M + 1] f32: slice sums
    const int c = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, stride = rows + 1;
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * G, k0 = static_cast<int64_t>(c) * kChunk;
    const int nt = static_cast<int>(min(static_cast<int64_t>(G), tokens - t0));
    for (int i = threadIdx.x; i < G * kChunk / 4; i += kThreads) {
        const int r = i / (kChunk / 4), q = i % (kChunk / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (kExpand) {
            if (r < nt) {  // stream k's float4 column j of token t
                const int64_t t = t0 + r, k = k0 / (4 * ex.d4), j = (k0 % (4 * ex.d4)) / 4 + q;
                const float4 yv = ex.y[t * ex.d4 + j];
                float4 sv[4];
#pragma unroll
                for (int s = 0; s < 4; ++s) sv[s] = ex.old[(t * 4 + s) * ex.d4 + j];
                v = hc_post_stream(ex.post[t * 4 + k], yv, ex.comb + t * 16, sv, 4, k);
                ex.out[(t * 4 + k) * ex.d4 + j] = v;
            }
        } else {
            if (r < nt) v = load4(f + (t0 + r) * width, k0 + 4 * q, width, vec);
        }
        reinterpret_cast<float4*>(fs)[i] = v;
    }
    float4 w[kSteps * 4];  // fn_v at k0 + s * 128 + a * 16 + 4 q, index s * 4 + q
    auto load_row = [&](int v) {
#pragma unroll
        for (int i = 0; i < kSteps * 4; ++i)
            w[i] = v < rows ? load4(fn + v * width, k0 + (i / 4) * kStep + warp * kPiece + 4 * (i % 4), width, vec)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    load_row(lane);
    __syncthreads();
    for (int v = lane; v <= rows; v += 32) {
        if (v != lane) load_row(v);
        float acc[G];
#pragma unroll
        for (int u = 0; u < G; ++u) acc[u] = 0.f;
#pragma unroll
        for (int i = 0; i < kSteps * 4; ++i)
#pragma unroll
            for (int u = 0; u < G; ++u) {
                const float* x = fs + u * kChunk + warp * kPiece + (i / 4) * kStep + 4 * (i % 4);
                const float4 xv = *reinterpret_cast<const float4*>(x);
                acc[u] = fma4(xv, v < rows ? w[i] : xv, acc[u]);
            }
#pragma unroll
        for (int u = 0; u < G; ++u)
            if (u < nt) red[(u * kWarps + warp) * stride + v] = acc[u];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * stride; i += kThreads) {
        const int tt = i / stride, v = i % stride;
        const float* s = red + tt * kWarps * stride + v;
        float sum = s[0];
        for (int a = 1; a < kWarps; ++a) sum += s[a * stride];
        part[((t0 + tt) * chunks + c) * stride + v] = sum;
    }
}

// Many tokens (prefill). Block (chunk c, tile of 64 tokens, group g of R rows); warp a computes slice a; lane l
// owns tokens l and l + 32 and accumulates all R rows and the sum of squares for both. Per step the block
// stages f [64, 128] and fn [R, 128] in shared memory; fn reads are warp-wide broadcasts, so one f value read
// feeds R FMAs. Rows past M are zeros and not written; only group 0 writes the sum of squares.
template <int R>
__global__ void __launch_bounds__(kThreads, 2)
    hc_dots_tiled_kernel(float* __restrict__ part, const float* __restrict__ f, const float* __restrict__ fn,
                         int64_t tokens, int64_t width, int rows, int chunks, bool vec) {
    pdl_prologue();  // see pdl.cuh
    __shared__ __align__(16) float tile[kTileTokens * kTilePad];  // [64, 128 + 4] f32 f; then [8, 32, R + 1] sums
    __shared__ __align__(16) float wtile[R * kStep];              // [R, 128] f32 fn
    static_assert(kWarps * 32 * (R + 1) <= kTileTokens * kTilePad, "slice sums must fit the f tile");
    const int c = blockIdx.x, g = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileTokens;
    float acc[2][R], ss[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = 0.f;
    for (int s = 0; s < kSteps; ++s) {
        const int64_t k0 = static_cast<int64_t>(c) * kChunk + s * kStep;
        for (int i = threadIdx.x; i < kTileTokens * kStep / 4; i += kThreads) {
            const int r = i / (kStep / 4), q = i % (kStep / 4);
            const int64_t t = t0 + r;
            const float4 v =
                t < tokens ? load4(f + t * width, k0 + 4 * q, width, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4*>(tile + r * kTilePad + 4 * q) = v;
        }
        for (int i = threadIdx.x; i < R * kStep / 4; i += kThreads) {
            const int r = i / (kStep / 4), q = i % (kStep / 4), j = g * R + r;
            const float4 v = j < rows ? load4(fn + j * width, k0 + 4 * q, width, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4*>(wtile + r * kStep + 4 * q) = v;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < kPiece / 4; ++q) {
            const int col = warp * kPiece + 4 * q;
            const float4 x0 = *reinterpret_cast<const float4*>(tile + lane * kTilePad + col);
            const float4 x1 = *reinterpret_cast<const float4*>(tile + (lane + 32) * kTilePad + col);
            ss[0] = fma4(x0, x0, ss[0]);
            ss[1] = fma4(x1, x1, ss[1]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float4 wv = *reinterpret_cast<const float4*>(wtile + r * kStep + col);
                acc[0][r] = fma4(x0, wv, acc[0][r]);
                acc[1][r] = fma4(x1, wv, acc[1][r]);
            }
        }
        __syncthreads();
    }
    // Slice sums in slice order, one token half at a time (the [8, 64, R + 1] sums would not fit).
    float* red = tile;  // [8 slices, 32 lanes, R + 1] f32
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < R; ++r) red[(warp * 32 + lane) * (R + 1) + r] = acc[h][r];
        red[(warp * 32 + lane) * (R + 1) + R] = ss[h];
        __syncthreads();
        for (int i = threadIdx.x; i < 32 * (R + 1); i += kThreads) {
            const int l = i / (R + 1), r = i % (R + 1);
            float sum = red[i];
            for (int a = 1; a < kWarps; ++a) sum += red[a * 32 * (R + 1) + i];
            const int64_t t = t0 + h * 32 + l;
            const int j = r < R ? g * R + r : rows;
            if (t < tokens && (r < R ? j < rows : g == 0)) part[(t * chunks + c) * (rows + 1) + j] = sum;
        }
        __syncthreads();
    }
}

// From a token's mix logits [(2 + n) * n]: pre and post weights [n] and the Sinkhorn-normalised comb [n, n],
// worked on in place in global memory, one thread per token (any n; n = 4 takes finish_n4 below).
__device__ __forceinline__ void mix_coefficients(float* __restrict__ pr, float* __restrict__ po,
                                                 float* __restrict__ c, const float* mix, const HcDesc& p) {
    const int n = p.n;
    for (int j = 0; j < n; ++j) {
        pr[j] = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
        po[j] = 2.0f * sigmoid(mix[n + j] * p.scale[1] + p.base[n + j]);
    }
    for (int i = 0; i < n; ++i) {
        float m = -INFINITY;
        for (int k = 0; k < n; ++k) {
            c[i * n + k] = mix[2 * n + i * n + k] * p.scale[2] + p.base[2 * n + i * n + k];
            m = fmaxf(m, c[i * n + k]);
        }
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += (c[i * n + k] = expf(c[i * n + k] - m));
        for (int k = 0; k < n; ++k) c[i * n + k] = c[i * n + k] / sum + p.hc_eps;
    }
    for (int it = 0; it < p.sinkhorn_iters; ++it) {
        if (it > 0)  // rows, then columns; the first sweep normalises columns only
            for (int i = 0; i < n; ++i) {
                float sum = 0;
                for (int k = 0; k < n; ++k) sum += c[i * n + k];
                for (int k = 0; k < n; ++k) c[i * n + k] /= sum + p.hc_eps;
            }
        for (int k = 0; k < n; ++k) {
            float sum = 0;
            for (int i = 0; i < n; ++i) sum += c[i * n + k];
            for (int i = 0; i < n; ++i) c[i * n + k] /= sum + p.hc_eps;
        }
    }
}

// n = 4: 16 threads per token, one per comb element, so the 20 Sinkhorn sweeps (2 * 16 divisions each) run in
// parallel instead of on one thread (~15 us a call at one token). Each row and column sum reads its four
// values through shuffles and adds them in index order, as mix_coefficients (and the CPU) do.
__device__ __forceinline__ void finish_n4(float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb,
                                          const float* raw, int64_t t0, int nt, int stride, int64_t width,
                                          const HcDesc& p) {
    constexpr int n = 4;
    const int tt = threadIdx.x / 16, e = threadIdx.x % 16, i = e / 4, k = e % 4;
    const int lane = threadIdx.x % 32, base = lane & ~15;  // this token's first lane in the warp
    const bool live = tt < nt;
    const float* mix = raw + (live ? tt : 0) * stride;
    const float inv = mix_inv_rms(mix[2 * n + n * n], width, p);
    const int64_t t = t0 + tt;
    if (pre && live && e < n) pre[t * n + e] = pre_weight(mix[e], inv, p, e);
    if (live && e >= n && e < 2 * n)
        post[t * n + e - n] = 2.0f * sigmoid(mix[e] * inv * p.scale[1] + p.base[e]);
    auto row_sum = [&](float v) {  // sum over k of this row, in order
        float s = __shfl_sync(0xffffffffu, v, base + 4 * i);
#pragma unroll
        for (int q = 1; q < n; ++q) s += __shfl_sync(0xffffffffu, v, base + 4 * i + q);
        return s;
    };
    auto col_sum = [&](float v) {  // sum over i of this column, in order
        float s = __shfl_sync(0xffffffffu, v, base + k);
#pragma unroll
        for (int q = 1; q < n; ++q) s += __shfl_sync(0xffffffffu, v, base + 4 * q + k);
        return s;
    };
    float c = mix[2 * n + e] * inv * p.scale[2] + p.base[2 * n + e];
    float m = __shfl_sync(0xffffffffu, c, base + 4 * i);
#pragma unroll
    for (int q = 1; q < n; ++q) m = fmaxf(m, __shfl_sync(0xffffffffu, c, base + 4 * i + q));
    c = expf(c - m);
    c = c / row_sum(c) + p.hc_eps;
    for (int it = 0; it < p.sinkhorn_iters; ++it) {
        if (it > 0) c /= row_sum(c) + p.hc_eps;  // rows, then columns; the first sweep normalises columns only
        c /= col_sum(c) + p.hc_eps;
    }
    if (live) comb[t * n * n + e] = c;
}

// One raw mix value of a token: the sum of its `chunks` partials src[0], src[stride], ... in chunk order, up to
// kFinishBatch loaded at once: one memory latency per batch (a decode step's 32 chunks: one, where a loop of
// dependent adds kept 8 loads in flight and paid four).
__device__ __forceinline__ float sum_partials(const float* __restrict__ src, int chunks, int stride) {
    float sum = src[0];
    for (int ch0 = 1; ch0 < chunks; ch0 += kFinishBatch) {
        float v[kFinishBatch];
#pragma unroll
        for (int q = 0; q < kFinishBatch; ++q) v[q] = ch0 + q < chunks ? src[(ch0 + q) * stride] : 0.0f;
#pragma unroll
        for (int q = 0; q < kFinishBatch; ++q)
            if (ch0 + q < chunks) sum += v[q];
    }
    return sum;
}

// Per token of the block's kFinishTokens (from token block * kFinishTokens): add the partials (of the chunks, or
// of the tensor-core dots' splits) in order (threads over (token, virtual row)), then scale by rsqrt(mean square +
// eps) and make the coefficients: pre/post/comb (16 threads a token for n = 4, else one; pre may be null there),
// or the head's pre only. Any block size of at least 128 threads; raw: shared [8 tokens, M + 1] f32.
// part: [T, chunks, M + 1] f32 with M = (2 + n) * n, or n for the head.
template <int N, bool kHead>
__device__ __forceinline__ void finish_tokens(float* __restrict__ pre, float* __restrict__ post,
                                              float* __restrict__ comb, const float* __restrict__ part, int64_t tokens,
                                              int chunks, int64_t width, const HcDesc& p, int block, float* raw) {
    const int n = N > 0 ? N : p.n;
    const int rows = kHead ? n : (2 + n) * n, stride = rows + 1;
    const int64_t t0 = static_cast<int64_t>(block) * kFinishTokens;
    const int nt = static_cast<int>(min(static_cast<int64_t>(kFinishTokens), tokens - t0));
    for (int i = threadIdx.x; i < nt * stride; i += blockDim.x)
        raw[i] = sum_partials(part + (t0 + i / stride) * chunks * stride + i % stride, chunks, stride);
    __syncthreads();
    if constexpr (N == 4 && !kHead) {
        finish_n4(pre, post, comb, raw, t0, nt, stride, width, p);
    } else {
        if (static_cast<int>(threadIdx.x) >= nt) return;
        const int64_t t = t0 + threadIdx.x;
        float* mix = raw + threadIdx.x * stride;
        const float inv = mix_inv_rms(mix[rows], width, p);
        for (int j = 0; j < rows; ++j) mix[j] *= inv;
        if (kHead) {
            for (int j = 0; j < n; ++j) pre[t * n + j] = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
        } else {
            mix_coefficients(pre + t * n, post + t * n, comb + t * n * n, mix, p);
        }
    }
}

template <int N, bool kHead>
__global__ void __launch_bounds__(128)
    hc_finish_kernel(float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb,
                     const float* __restrict__ part, int64_t tokens, int chunks, int64_t width, HcDesc p) {
    pdl_prologue();                 // see pdl.cuh
    extern __shared__ float raw[];  // [8 tokens, M + 1] f32
    finish_tokens<N, kHead>(pre, post, comb, part, tokens, chunks, width, p, blockIdx.x, raw);
}

// A few tokens' (n = 4) finish, collapse and RMSNorm in one launch, with the Sinkhorn off the collapse's path:
// blocks 0 .. finish_blocks - 1 make post and comb (finish_tokens), and block finish_blocks + r makes token r's
// four pre weights itself (its raw rows 0..3 and the sum of squares, summed and scaled as finish_tokens does) and
// then its collapsed, normed row (collapse_norm_row): bitwise hc_finish_kernel<4> then hc_collapse_norm_kernel<4>,
// with the collapse no longer waiting for the 20 Sinkhorn sweeps (~4.5 us a call at decode on an H200).
// part: [T, chunks, 25] f32; streams [T, 4, cols] f32; out [T, cols] f32.
__global__ void __launch_bounds__(kNormThreads)
    hc_finish_collapse_norm_kernel(float* __restrict__ post, float* __restrict__ comb, float* __restrict__ out,
                                   const float* __restrict__ part, const float4* __restrict__ streams,
                                   const float* __restrict__ weight, int64_t tokens, int chunks, int64_t cols,
                                   float eps, HcDesc p, int finish_blocks) {
    pdl_prologue();  // see pdl.cuh
    constexpr int n = 4, stride = (2 + n) * n + 1;
    __shared__ float raw[kFinishTokens * stride];
    if (static_cast<int>(blockIdx.x) < finish_blocks) {
        finish_tokens<4, false>(nullptr, post, comb, part, tokens, chunks, n * cols, p, blockIdx.x, raw);
        return;
    }
    const int64_t r = blockIdx.x - finish_blocks;
    __shared__ float pre[n];
    if (threadIdx.x <= n) {  // raw rows 0..3 and the sum of squares (row 24)
        const int v = threadIdx.x < n ? threadIdx.x : stride - 1;
        raw[threadIdx.x] = sum_partials(part + r * chunks * stride + v, chunks, stride);
    }
    __syncthreads();
    if (threadIdx.x < n)
        pre[threadIdx.x] = pre_weight(raw[threadIdx.x], mix_inv_rms(raw[n], n * cols, p), p, threadIdx.x);
    __syncthreads();
    collapse_norm_row<n>(out + r * cols, streams + r * n * (cols / 4), pre, weight, n, cols, eps);
}

__global__ void hc_collapse_kernel(float* __restrict__ out, const float* __restrict__ streams,
                                   const float* __restrict__ pre, int64_t rows, int64_t n, int64_t d) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * d) return;
    const int64_t r = i / d, c = i % d;
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += pre[r * n + j] * streams[(r * n + j) * d + c];
    out[i] = acc;
}

__global__ void hc_post_kernel(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ post,
                               const float* __restrict__ comb, const float* __restrict__ streams, int64_t rows,
                               int64_t n, int64_t d) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * n * d) return;
    const int64_t c = i % d, k = (i / d) % n, r = i / (n * d);
    float acc = post[r * n + k] * y[r * d + c];
    for (int64_t j = 0; j < n; ++j) acc += comb[(r * n + j) * n + k] * streams[(r * n + j) * d + c];
    out[i] = acc;
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// The same two ops with a thread per (row, 4 columns): each stream value is read once for all n outputs, and
// no 64-bit division per element (the kernels above spent 2.1 ms on hc_post at 16,384 tokens, ~14x their
// bytes' time). Rows loop over the grid's y dimension. d4 = d / 4; all pointers 16-byte aligned.
constexpr int kHcVecThreads = 256;
constexpr unsigned kHcMaxGridY = 65535;

__global__ void __launch_bounds__(kHcVecThreads)
    hc_collapse_vec_kernel(float4* __restrict__ out, const float4* __restrict__ streams, const float* __restrict__ pre,
                           int64_t rows, int n, int64_t d4) {
    pdl_prologue();  // see pdl.cuh
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kHcVecThreads + threadIdx.x;
    if (c >= d4) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < n; ++j) acc = fma4v(pre[r * n + j], streams[(r * n + j) * d4 + c], acc);
        out[r * d4 + c] = acc;
    }
}

template <int N>  // N > 0: n known at compile time (the streams stay in registers); 0: any n <= 8
__global__ void __launch_bounds__(kHcVecThreads)
    hc_post_vec_kernel(float4* __restrict__ out, const float4* __restrict__ y, const float* __restrict__ post,
                       const float* __restrict__ comb, const float4* __restrict__ streams, int64_t rows, int n_rt,
                       int64_t d4) {
    pdl_prologue();  // see pdl.cuh
    constexpr int kMax = N > 0 ? N : 8;
    const int n = N > 0 ? N : n_rt;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kHcVecThreads + threadIdx.x;
    if (c >= d4) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float4 s[kMax];
#pragma unroll
        for (int j = 0; j < kMax; ++j)
            if (j < n) s[j] = streams[(r * n + j) * d4 + c];
        const float4 yv = y[r * d4 + c];
#pragma unroll
        for (int k = 0; k < kMax; ++k) {
            if (k >= n) break;
            out[(r * n + k) * d4 + c] = hc_post_stream(post[r * n + k], yv, comb + r * n * n, s, n, k);
        }
    }
}

bool hc_vec_ok(int64_t n, int64_t d, std::initializer_list<const void*> ptrs) {
    if (d % 4 != 0 || n < 1 || n > 8) return false;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

dim3 hc_vec_grid(int64_t rows, int64_t d4) {
    return dim3(blocks_for(d4, kHcVecThreads), static_cast<unsigned>(std::min<int64_t>(rows, kHcMaxGridY)));
}

// Stream-ordered scratch (from the retaining pool, so no driver call); free with cudaFreeAsync on `stream`.
float* scratch_floats(int64_t n, cudaStream_t stream) {
    void* p = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(n) * sizeof(float), stream));
    return static_cast<float*>(p);
}

int chunks_for(int64_t width) { return static_cast<int>((width + kChunk - 1) / kChunk); }

// Shared memory of the few-token dots for groups of g tokens: their chunk and slice sums.
size_t few_dots_smem(int g, int rows) { return (g * kChunk + g * kWarps * (rows + 1)) * sizeof(float); }

// launch_dots' few-token kernels (tokens <= kFewTokens), their group size by the token count; with an expand
// (non-null), f made from it (hc_dots_few_kernel<G, true>).
void launch_dots_few(float* part, const float* f, int64_t tokens, int64_t width, const float* fn, int rows, bool vec,
                     const FewExpand* expand, cudaStream_t stream) {
    const int chunks = chunks_for(width);
    // Tokens a block: 1, 2 up to 16 tokens, else 4. The kernel is latency-bound (ncu, 32 tokens in groups of 8:
    // 128 blocks of 8 warps, 0.27 instructions a cycle a scheduler, 11.4 us), so more blocks of fewer tokens each
    // beat reading fn once per 8 tokens (fn is 1.5 MB, read from L2 once a group). H200, 8-layer decode step:
    // 6.7 -> 4.5 us a call at batch 8, 9.7 -> 7.8 at batch 32.
    const auto launch = [&](auto plain, auto expanding, int group) {
        const dim3 grid(static_cast<unsigned>(chunks), blocks_for(tokens, group));
        if (expand)
            launch_pdl(expanding, grid, kThreads, few_dots_smem(group, rows), stream, part, f, fn, tokens, width, rows,
                       chunks, vec, *expand);
        else
            launch_pdl(plain, grid, kThreads, few_dots_smem(group, rows), stream, part, f, fn, tokens, width, rows,
                       chunks, vec, FewExpand{});
    };
    if (tokens == 1)
        launch(hc_dots_few_kernel<1>, hc_dots_few_kernel<1, true>, 1);
    else if (tokens <= 16)
        launch(hc_dots_few_kernel<2>, hc_dots_few_kernel<2, true>, 2);
    else
        launch(hc_dots_few_kernel<kMaxGroupTokens>, hc_dots_few_kernel<kMaxGroupTokens, true>, kMaxGroupTokens);
}

// part [tokens, chunks, rows + 1] = the chunk partials of f [tokens, width] against fn [rows, width] and of the
// sums of squares. The kernel and tile choice only affect speed (see the top of the file).
void launch_dots(float* part, const float* f, int64_t tokens, int64_t width, const float* fn, int rows,
                 cudaStream_t stream) {
    const int chunks = chunks_for(width);
    const bool vec =
        width % 4 == 0 && reinterpret_cast<uintptr_t>(f) % 16 == 0 && reinterpret_cast<uintptr_t>(fn) % 16 == 0;
    if (tokens <= kFewTokens && few_dots_smem(kMaxGroupTokens, rows) <= 48 * 1024) {
        launch_dots_few(part, f, tokens, width, fn, rows, vec, nullptr, stream);
    } else {
        // 24 rows per block reads f once for the whole mix; with few tokens, 8 rows per block triples the
        // blocks (f is re-read from L2) so that the grid still fills the GPU.
        const unsigned tiles = blocks_for(tokens, kTileTokens);
        if (rows <= 4) {
            launch_pdl(hc_dots_tiled_kernel<4>, dim3(static_cast<unsigned>(chunks), tiles, blocks_for(rows, 4)), kThreads, 0, stream, part, f, fn, tokens, width, rows, chunks, vec);
        } else if (rows <= 8 || tokens < kWideRowTokens) {
            launch_pdl(hc_dots_tiled_kernel<8>, dim3(static_cast<unsigned>(chunks), tiles, blocks_for(rows, 8)), kThreads, 0, stream, part, f, fn, tokens, width, rows, chunks, vec);
        } else {
            launch_pdl(hc_dots_tiled_kernel<24>, dim3(static_cast<unsigned>(chunks), tiles, blocks_for(rows, 24)), kThreads, 0, stream, part, f, fn, tokens, width, rows, chunks, vec);
        }
    }
    DI_CUDA_LAUNCH_CHECK();
}

// Runs the dots and the finish over slabs of at most kSlabTokens tokens (kTcSlabTokens on the tensor cores), so
// the partials scratch stays small; tokens are independent, so slabs do not change results. The tensor-core dots
// take calls of more than kFewTokens tokens when allowed and their layout applies (else the SIMT kernels); their
// split width is set by the first slab, for all.
// expand (non-null, n = 4): streams (= expand->out) are made as the tensor-core dots load them
// (launch_hc_post_dots_tc), which the caller has checked apply.
struct HcExpand {
    float* out;      // [rows, width]: the streams
    const float* y;  // [rows, width / 4]
    const float* post;
    const float* comb;
    const float* old;  // [rows, width]
};
template <typename Finish>
void mix_in_slabs(const float* streams, int64_t rows, int64_t width, int n, const float* fn, int mix_rows,
                  bool tensor_cores, cudaStream_t stream, Finish finish, const HcExpand* expand = nullptr) {
    DI_ICHECK(kFinishTokens * (mix_rows + 1) * sizeof(float) <= 48 * 1024, "hc mix rows ", mix_rows, " too many");
    const bool tc = tensor_cores && rows > kFewTokens && hc_dots_tc_applies(streams, width, fn, mix_rows);
    DI_ICHECK(!expand || tc, "hc mix: the expand needs the tensor-core dots");
    const int64_t slab = std::min(rows, tc ? kTcSlabTokens : kSlabTokens);
    // 4 streams: split by columns, as the expand's dots (the same sums, whichever made the streams)
    const int64_t streams_in_width = n == 4 && width % 16 == 0 ? 4 : 1;
    const int64_t split_width = tc ? hc_dots_tc_split_width(slab, width, streams_in_width) : kChunk;
    const int parts = static_cast<int>((width + split_width - 1) / split_width);  // partials per token
    float* part = scratch_floats(slab * parts * (mix_rows + 1), stream);          // [slab, parts, M + 1] f32
    for (int64_t t0 = 0; t0 < rows; t0 += slab) {
        const int64_t count = std::min(slab, rows - t0);
        if (expand) {  // its slab's post and comb rows are read here, and rewritten only by the finish below
            const int64_t d = width / 4;
            launch_hc_post_dots_tc(part, expand->out + t0 * width, expand->y + t0 * d, expand->post + t0 * 4,
                                   expand->comb + t0 * 16, expand->old + t0 * width, count, d, fn, mix_rows,
                                   split_width, stream);
        } else if (tc) {
            launch_hc_dots_tc(part, streams + t0 * width, count, width, fn, mix_rows, split_width, streams_in_width,
                              stream);
        } else {
            launch_dots(part, streams + t0 * width, count, width, fn, mix_rows, stream);
        }
        finish(part, t0, count, parts);
        DI_CUDA_LAUNCH_CHECK();
    }
    DI_CUDA_CHECK(cudaFreeAsync(part, stream));
}

}  // namespace

namespace {
void mix(float* pre, float* post, float* comb, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
         cudaStream_t stream, const HcExpand* expand) {
    if (rows == 0) return;
    const int n = p.n, mix_rows = (2 + n) * n;
    const int64_t width = n * d;
    const size_t smem = kFinishTokens * (mix_rows + 1) * sizeof(float);
    mix_in_slabs(
        streams, rows, width, n, p.fn, mix_rows, p.tensor_cores, stream,
        [&](const float* part, int64_t t0, int64_t count, int chunks) {
            auto kernel = n == 4 ? hc_finish_kernel<4, false> : hc_finish_kernel<0, false>;
            launch_pdl(kernel, blocks_for(count, kFinishTokens), 128, smem, stream, pre + t0 * n, post + t0 * n,
                       comb + t0 * n * n, part, count, chunks, width, p);
        },
        expand);
}
}  // namespace

void launch_hc_mix(float* pre, float* post, float* comb, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
                   cudaStream_t stream) {
    mix(pre, post, comb, streams, rows, d, p, stream, nullptr);
}

bool hc_post_mix_applies(int64_t rows, int64_t d, const float* out, const float* y, const float* old, const HcDesc& p) {
    return p.n == 4 && p.tensor_cores && rows > kFewTokens && hc_post_dots_tc_applies(out, y, old, d, p.fn, 24);
}

void launch_hc_post_mix(float* pre, float* post, float* comb, float* out, const float* y, const float* old,
                        int64_t rows, int64_t d, const HcDesc& p, cudaStream_t stream) {
    DI_ICHECK(rows == 0 || hc_post_mix_applies(rows, d, out, y, old, p), "hc_post_mix: n ", p.n, ", ", rows,
              " rows, d ", d);
    const HcExpand expand{out, y, post, comb, old};
    mix(pre, post, comb, out, rows, d, p, stream, &expand);
}

bool hc_pre_norm_fused_applies(int64_t n, int64_t rows, int64_t d, const float* out, const float* streams,
                               const float* weight) {
    return n == 4 && rows <= kFewTokens && hc_collapse_norm_applies(n, d, out, streams, weight);
}

namespace {
// A few tokens' (n = 4) mix and collapse-norm of streams [rows, 4, d]: dots(part) launches the dots into the partials
// scratch part [rows, chunks, 25], then hc_finish_collapse_norm_kernel makes post, comb and the normed rows out. The
// finish rewrites post and comb, which the dots may read: it starts once they are done (PDL waits for the whole grid
// before its first instruction past the prologue).
template <typename Dots>
void few_token_pre_norm(float* out, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                        const HcDesc& p, const float* weight, float eps, cudaStream_t stream, Dots dots) {
    constexpr int mix_rows = 24;
    const int chunks = chunks_for(4 * d);
    float* part = scratch_floats(rows * chunks * (mix_rows + 1), stream);
    dots(part, mix_rows);
    DI_CUDA_LAUNCH_CHECK();
    const int finish_blocks = static_cast<int>(blocks_for(rows, kFinishTokens));
    launch_pdl(hc_finish_collapse_norm_kernel, static_cast<unsigned>(finish_blocks + rows), kNormThreads, 0, stream,
               post, comb, out, part, reinterpret_cast<const float4*>(streams), weight, rows, chunks, d, eps, p,
               finish_blocks);
    DI_CUDA_LAUNCH_CHECK();
    DI_CUDA_CHECK(cudaFreeAsync(part, stream));
}
}  // namespace

void launch_hc_pre_norm_fused(float* out, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                              const HcDesc& p, const float* weight, float eps, cudaStream_t stream) {
    if (rows == 0) return;
    DI_ICHECK(hc_pre_norm_fused_applies(p.n, rows, d, out, streams, weight), "hc_pre_norm_fused: n ", p.n, ", ", rows,
              " rows, d ", d);
    few_token_pre_norm(out, post, comb, streams, rows, d, p, weight, eps, stream, [&](float* part, int mix_rows) {
        launch_dots(part, streams, rows, 4 * d, p.fn, mix_rows, stream);
    });
}

bool hc_post_pre_norm_fused_applies(int64_t n, int64_t rows, int64_t d, const float* out, const float* y,
                                    const float* old, const float* normed, const float* weight, const HcDesc& p) {
    const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    const auto* o = reinterpret_cast<const char*>(out);
    const auto* s = reinterpret_cast<const char*>(old);
    const size_t bytes = static_cast<size_t>(rows * n * d) * sizeof(float);
    return hc_pre_norm_fused_applies(n, rows, d, normed, out, weight) && d % kChunk == 0 && aligned(y) &&
           aligned(old) && aligned(p.fn) && (o + bytes <= s || s + bytes <= o) &&  // blocks read every old stream
           few_dots_smem(kMaxGroupTokens, (2 + n) * n) <= 48 * 1024;
}

void launch_hc_post_pre_norm_fused(float* normed, float* post, float* comb, float* out, const float* y,
                                   const float* old, int64_t rows, int64_t d, const HcDesc& p, const float* weight,
                                   float eps, cudaStream_t stream) {
    if (rows == 0) return;
    DI_ICHECK(hc_post_pre_norm_fused_applies(p.n, rows, d, out, y, old, normed, weight, p),
              "hc_post_pre_norm_fused: n ", p.n, ", ", rows, " rows, d ", d);
    const FewExpand expand{reinterpret_cast<float4*>(out),
                           reinterpret_cast<const float4*>(y),
                           post,
                           comb,
                           reinterpret_cast<const float4*>(old),
                           d / 4};
    few_token_pre_norm(normed, post, comb, out, rows, d, p, weight, eps, stream, [&](float* part, int mix_rows) {
        launch_dots_few(part, out, rows, 4 * d, p.fn, mix_rows, true, &expand, stream);
    });
}

void launch_hc_head_pre(float* pre, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
                        cudaStream_t stream) {
    if (rows == 0) return;
    const int n = p.n;
    const int64_t width = n * d;
    const size_t smem = kFinishTokens * (n + 1) * sizeof(float);
    mix_in_slabs(streams, rows, width, 1, p.fn, n, p.tensor_cores, stream,
                 [&](const float* part, int64_t t0, int64_t count, int chunks) {
                     launch_pdl(hc_finish_kernel<0, true>, blocks_for(count, kFinishTokens), 128, smem, stream, pre + t0 * n, nullptr, nullptr, part, count, chunks, width, p);
                 });
}

void launch_hc_collapse(float* out, const float* streams, const float* pre, int64_t rows, int64_t n, int64_t d,
                        cudaStream_t stream) {
    if (rows * d == 0) return;
    if (hc_vec_ok(n, d, {out, streams})) {
        launch_pdl(hc_collapse_vec_kernel, hc_vec_grid(rows, d / 4), kHcVecThreads, 0, stream, reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(streams), pre, rows, static_cast<int>(n),
            d / 4);
    } else {
        launch_pdl(hc_collapse_kernel, blocks_for(rows * d, 256), 256, 0, stream, out, streams, pre, rows, n, d);
    }
    DI_CUDA_LAUNCH_CHECK();
}

void launch_hc_post(float* out, const float* y, const float* post, const float* comb, const float* streams,
                    int64_t rows, int64_t n, int64_t d, cudaStream_t stream) {
    if (rows * n * d == 0) return;
    if (hc_vec_ok(n, d, {out, y, streams})) {
        auto kernel = n == 4 ? hc_post_vec_kernel<4> : hc_post_vec_kernel<0>;
        launch_pdl(kernel, hc_vec_grid(rows, d / 4), kHcVecThreads, 0, stream, reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(y), post, comb,
            reinterpret_cast<const float4*>(streams), rows, static_cast<int>(n), d / 4);
    } else {
        launch_pdl(hc_post_kernel, blocks_for(rows * n * d, 256), 256, 0, stream, out, y, post, comb, streams, rows, n, d);
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
