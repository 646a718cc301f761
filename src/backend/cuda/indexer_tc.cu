// The lightning indexer's scores on the tensor cores: the bf16 modes' Backend::indexer_scores and
// indexer_scores_rows (attention.cu keeps the fp32 SIMT kernel for DEEPINFER_CUDA_GEMM=tiled and for shapes this
// one does not take: more than 256 heads, c above 512, or too little shared memory).
//
// scores[t, e] = scale * sum_h w[t, h] * relu(q[t, h] . k[e]). With the (row, head) pairs as M, S = Q K^T is a GEMM
// [T * Hi, c] x [c, E] (mma.sync m16n8k16, bf16 inputs, fp32 accumulation), then relu, the head weight and a sum
// over each row's heads. The rows of a sequence share their keys, so the keys stay put and the rows stream by:
//  - a block takes 8 warps x NT n8 tiles of entries (512 at V4's c = 128) and a chunk of up to 64 consecutive
//    rows; each warp loads its 8 NT entries' B fragments (rounded to bf16, zero past c and past the row's count)
//    straight from the fp32 keys into registers (KS k16 steps x NT x 2, up to 128) once per run of rows
//    with the same key range, and keeps them for the whole run;
//  - a row's queries [Hi, c] come by cp.async into an fp32 staging slot two rows ahead (the thread that copies a
//    float4 also converts it, so the staging needs no barrier), and are rounded into one of two bf16 slots
//    [HP, c] (heads padded to 16 with zero rows, c to 16 KS with zero columns); one barrier per row;
//  - per row a warp walks the HP / 16 m16 head tiles: A by ldmatrix from the slot (one A fragment serves NT
//    MMAs), S in NT x 4 fp32 registers, then lane (g, c) adds w[h] relu(S) for heads g and g + 8 of the tile into
//    its column pair (2c, 2c + 1) of each n8 tile; after the last tile a butterfly over g (xor 4, 8, 16) sums the
//    8 lanes of each column, and lane (g, c) writes n8 tile g's pair times scale.
// Rows of a chunk with different ranges (sequence boundaries in indexer_scores_rows, ragged counts) are runs of
// their own: B is reloaded where a row's (begin, count) differs from the previous row's; rows whose count ends
// before the block's entries are skipped, and warps whose entries are all past the count skip the products.
//
// Batch-invariant by construction: per output the k16 steps run in order, then heads are added in one fixed
// order (per lane: tile 0 head g, tile 0 head g + 8, tile 1 head g, ...; then the xor-4, 8, 16 butterfly), which
// depends only on Hi and c (KS = 4, 8, 16 or 32 from c), not on T, the chunk, NT or the other rows.
// Numerics: q and keys rounded to bf16 (relative 2^-9 each); products exact in fp32, sums, relu, weights in fp32.
//
// Cost model (H200: 132 SMs at ~1.75 GHz; HBM ~4.3 TB/s; 128 B/clk of shared memory per SM; mma.sync m16n8k16
// ~2,500 FLOP/clk/SM, ~1.6 clk per MMA), V4 (Hi = 64, c = 128, KS = 8, NT = 8, 512 entries per block), prefill of
// 8 sequences x 2048 rows with 512 entries each (indexer_scores_rows):
//  - 2 x 16384 x 64 x 128 x 512 = 137 GFLOP = 33.5 M MMAs, 254 K per SM: 410 K clk = 0.23 ms at the mma.sync rate.
//  - per row a block issues 2,048 MMAs (3,300 clk) and reads 208 KB of shared memory (A fragments 8 warps x 4 tiles
//    x 8 k-steps x 512 B = 128 KB; the queries' cp.async 32 KB, conversion 32 + 16 KB): 1,600 clk, so the MMAs
//    bound it. The epilogue (per warp and tile 64 fmax + 64 fma per lane) and the butterfly (48 shuffles a row)
//    run while the other warp of the scheduler issues MMAs; one barrier a row.
//  - HBM: the queries 537 MB (each row read once: one block covers all 512 entries), weights 4 MB, scores 34 MB:
//    0.57 GB = 0.13 ms, under the MMAs and two rows ahead of them; keys 256 KB per block from L2 (64 MB in all).
//  - 256 blocks of 64 rows (one block per SM: 238 registers a thread): two waves of 64 x 3,300 clk = 0.24 ms at
//    the MMA rate; at ~70% of it (8 warps an SM, the epilogues, a barrier a row) ~0.35 ms (fp32 SIMT: 7.6 ms).
//    Measured (H200, run 18): 0.58 ms a call, ~40% of the mma.sync rate (not yet profiled).
//  - decode, T rows of their own sequences, E entries each: every key serves one row (64 heads), so B is reloaded
//    every row (its latency exposed once a row) and the kernel is HBM-bound on the fp32 keys (T x E x 512 B:
//    1.07 GB at T = 128, E = 16384: 0.25 ms; SIMT: 34 GFLOP at ~18 TFLOP/s = 1.9 ms). When the rows' tiles of
//    512 entries leave SMs idle (few rows), NT = 2 (tiles of 128 entries) gives 4x the blocks.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace deepinfer::cuda {

namespace {

using namespace mma;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxChunk = 64;        // rows per block
constexpr int kMaxHeads = kThreads;  // one thread per head stages the weights
constexpr int kMaxDim = 512;         // c: 32 k16 steps
constexpr int64_t kSmemLimit = 227 * 1024;

struct IdxTcParams {
    float* scores;             // [T, ld] f32: row t's entries 0 .. count(t) - 1
    const float* q;            // [T, Hi, c] f32
    const float* keys;         // [*, c] f32
    const float* weights;      // [T, Hi] f32
    const int32_t* key_begin;  // [T] I32: row t's keys start at keys[key_begin[t]] (null: at keys[0])
    const int32_t* key_count;  // [T] I32: row t scores key_count[t] keys (null: every row ld)
    int64_t ld;                // row stride of scores
    int rows, heads, c;
    int hp;     // heads rounded up to 16
    int chunk;  // rows per block
    int stage;  // c % 4 == 0, q 16-byte aligned and room: queries by cp.async through the fp32 staging
    int vec_k;  // c even and keys 8-byte aligned: float2 key loads
    float scale;
};

// k16 steps of a query row: c padded to 64, 128, 256 or 512 (zeros multiply exactly, so the padding only costs time).
int k_steps(int64_t c) { return c <= 64 ? 4 : c <= 128 ? 8 : c <= 256 ? 16 : 32; }
int64_t padded_heads(int64_t heads) { return ceil_div(std::max<int64_t>(heads, 1), 16) * 16; }

// Dynamic shared memory in bytes: bf16 query slots [2][hp][16 KS + 8], with `stage` the fp32 staging [2][Hi * c],
// weights and their staging [4][hp], the block's rows' key ranges [2][kMaxChunk].
constexpr int64_t smem_bytes(int ks, int64_t hp, int64_t heads, int64_t c, bool stage) {
    return 2 * hp * (16 * ks + 8) * 2 + (stage ? 2 * heads * c * 4 : 0) + 4 * hp * 4 + 2 * kMaxChunk * 4;
}

__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most the newest group is in flight.
__device__ __forceinline__ void wait_all_but_newest() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Grid: (ceil(E / (64 NT)), ceil(T / chunk)), 256 threads. Warp w scores entries tile0 + 8 NT w .. + 8 NT of each
// row of the block's chunk; c <= 16 KS.
template <int KS, int NT>
__global__ void __launch_bounds__(kThreads, 1) indexer_tc_kernel(const __grid_constant__ IdxTcParams p) {
    pdl_prologue();  // see pdl.cuh
    // bf16 row stride of a query slot (16 B of padding: ldmatrix's 8 rows hit distinct banks)
    constexpr int QLD = 16 * KS + 8;
    constexpr int NB = kWarps * NT * 8;  // entries of a block
    extern __shared__ __align__(16) unsigned char smem[];
    const int hp = p.hp, c = p.c, heads = p.heads, qn = heads * c;
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [2][hp][QLD] two rows' queries, zero past (Hi, c)
    float* fs = reinterpret_cast<float*>(qs + 2 * hp * QLD);     // [2][qn] (stage) the next rows' queries as loaded
    float* ws = fs + (p.stage ? 2 * qn : 0);                     // [2][hp] the slots' head weights, zero past Hi
    float* wf = ws + 2 * hp;                                     // [2][hp] weights as loaded
    int* rbegin = reinterpret_cast<int*>(wf + 2 * hp);           // [kMaxChunk] the chunk's rows' first keys
    int* rcount = rbegin + kMaxChunk;                            // [kMaxChunk] and key counts

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, cq = lane % 4;
    const int tile0 = blockIdx.x * NB, ew0 = tile0 + warp * NT * 8;  // the block's and this warp's first entry
    const int t0 = blockIdx.y * p.chunk, t1 = min(p.rows, t0 + p.chunk);

    for (int i = tid; i < 2 * hp * QLD / 8; i += kThreads) reinterpret_cast<uint4*>(qs)[i] = make_uint4(0, 0, 0, 0);
    for (int i = tid; i < t1 - t0; i += kThreads) {
        rbegin[i] = p.key_begin ? p.key_begin[t0 + i] : 0;
        rcount[i] = p.key_count ? p.key_count[t0 + i] : static_cast<int>(p.ld);
    }
    __syncthreads();
    // The next row from t on whose keys reach this block's entries (t1 if none).
    auto next_row = [&](int t) {
        while (t < t1 && rcount[t - t0] <= tile0) ++t;
        return t;
    };

    // Row t's queries and weights into staging slot f, as one cp.async group (empty past the chunk). Thread tid
    // copies float4s tid, tid + 256, .. and weight tid, and is the one that converts them.
    auto issue = [&](int t, int f) {
        if (t < t1) {
            if (p.stage) {
                const float* src = p.q + static_cast<int64_t>(t) * qn;
                for (int i = tid; i < qn / 4; i += kThreads) cp_async16(fs + f * qn + 4 * i, src + 4 * i, 16);
            }
            if (tid < heads) cp_async4(wf + f * hp + tid, p.weights + static_cast<int64_t>(t) * heads + tid);
        }
        commit_group();
    };
    // Row t's queries (from staging slot f, or without staging from global memory) into query slot s as bf16, and
    // its weights.
    auto convert = [&](int t, int f, int s) {
        __nv_bfloat16* dst = qs + s * hp * QLD;
        if (p.stage) {
            for (int i = tid; i < qn / 4; i += kThreads) {
                const float4 v = *reinterpret_cast<const float4*>(fs + f * qn + 4 * i);
                const int h = 4 * i / c, k = 4 * i - h * c;
                *reinterpret_cast<uint2*>(dst + h * QLD + k) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
            }
        } else {
            const float* src = p.q + static_cast<int64_t>(t) * qn;
#pragma unroll 4
            for (int i = tid; i < qn; i += kThreads) {
                const int h = i / c;
                dst[h * QLD + i - h * c] = __float2bfloat16_rn(__ldg(src + i));
            }
        }
        if (tid < hp) ws[s * hp + tid] = tid < heads ? wf[f * hp + tid] : 0.0f;
    };

    // B fragments of this warp's entries for the run of row t: b[nt][ks] = keys k 16 ks + 2 cq, +1 and
    // 16 ks + 8 + 2 cq, +1 of entry ew0 + 8 nt + g, as bf16 pairs; zero past c and past the row's count.
    uint32_t b[NT][KS][2];
    auto key_pair = [&](const float* row, int k) -> uint32_t {
        if (!row || k >= c) return 0u;
        if (p.vec_k) {
            const float2 v = __ldg(reinterpret_cast<const float2*>(row + k));
            return pack_bf16(v.x, v.y);
        }
        return pack_bf16(__ldg(row + k), k + 1 < c ? __ldg(row + k + 1) : 0.0f);
    };
    auto load_b = [&](int t) {
        const int64_t key0 = rbegin[t - t0];
        const int count = rcount[t - t0];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int e = ew0 + nt * 8 + g;
            const float* row = e < count ? p.keys + (key0 + e) * c : nullptr;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) b[nt][ks][hf] = key_pair(row, 16 * ks + 8 * hf + 2 * cq);
        }
    };

    // Prologue: the first two rows' queries in flight, the keys, the first row converted.
    int r = next_row(t0);
    if (r >= t1) return;  // (ragged rows) no row's keys reach this block's entries
    int rn = next_row(r + 1);
    issue(r, 0);
    issue(rn, 1);
    load_b(r);
    wait_all_but_newest();
    convert(r, 0, 0);
    __syncthreads();

    // ldmatrix lane addresses of A (as in gemm_tc.cu): matrices (heads 0-7, k 0-7), (8-15, k 0-7), (0-7, k 8-15),
    // (8-15, k 8-15) of an m16 tile.
    const uint32_t a_lane = smem_addr(qs + (lane % 16) * QLD + (lane / 16) * 8);
    for (int s = 0;; s ^= 1) {
        // Query slot s holds row r (its staging slot is s too: free again), staging s ^ 1 receives row rn; the
        // row after rn goes to staging s.
        const int rn2 = rn < t1 ? next_row(rn + 1) : t1;
        issue(rn2, s);
        const int count = rcount[r - t0];
        if (ew0 < count) {
            float part[NT][2] = {};  // this lane's heads' share of columns 8 nt + 2 cq, +1
            const uint32_t a_slot = a_lane + s * hp * QLD * 2;
            const float* w = ws + s * hp;
#pragma unroll 1
            for (int mt = 0; mt < hp / 16; ++mt) {
                float acc[NT][4] = {};  // S: heads 16 mt + g (acc 0, 1) and + 8 (acc 2, 3), columns 8 nt + 2 cq, +1
                uint32_t a[2][4];
                const uint32_t a_mt = a_slot + mt * 16 * QLD * 2;
                ldmatrix_x4(a[0], a_mt);
#pragma unroll
                for (int ks = 0; ks < KS; ++ks) {
                    if (ks + 1 < KS) ldmatrix_x4(a[(ks + 1) % 2], a_mt + (ks + 1) * 32);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[nt], a[ks % 2], b[nt][ks][0], b[nt][ks][1]);
                }
                const float w_lo = w[mt * 16 + g], w_hi = w[mt * 16 + g + 8];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        part[nt][j] =
                            fmaf(w_hi, fmaxf(acc[nt][2 + j], 0.0f), fmaf(w_lo, fmaxf(acc[nt][j], 0.0f), part[nt][j]));
            }
            // Sum over the 8 lanes of each column (every lane gets the same bits), then lane (g, cq) writes
            // n8 tile g's columns.
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int m = 4; m < 32; m *= 2) part[nt][j] += __shfl_xor_sync(0xffffffffu, part[nt][j], m);
            if (g < NT) {
                float v0 = part[0][0], v1 = part[0][1];
#pragma unroll
                for (int nt = 1; nt < NT; ++nt)
                    if (g == nt) v0 = part[nt][0], v1 = part[nt][1];
                const int e = ew0 + 8 * g + 2 * cq;
                float* out = p.scores + static_cast<int64_t>(r) * p.ld;
                if (e < count) out[e] = v0 * p.scale;
                if (e + 1 < count) out[e + 1] = v1 * p.scale;
            }
        }
        if (rn >= t1) break;
        wait_all_but_newest();  // row rn's group
        convert(rn, s ^ 1, s ^ 1);
        if (rbegin[rn - t0] != rbegin[r - t0] || rcount[rn - t0] != count) load_b(rn);
        __syncthreads();  // slot s ^ 1 holds row rn; slot s is free
        r = rn;
        rn = rn2;
    }
}

template <int KS, int NT>
void launch_tc(const IdxTcParams& p, int64_t tiles, int64_t chunks, int smem, cudaStream_t stream) {
    auto kernel = indexer_tc_kernel<KS, NT>;
    static std::atomic<uint64_t> configured{0};
    allow_smem(kernel, static_cast<int>(kSmemLimit), configured);
    launch_pdl(kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), kThreads, smem, stream, p);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool indexer_scores_tc_applies(int64_t heads, int64_t c) {
    return heads <= kMaxHeads && c <= kMaxDim &&
           smem_bytes(k_steps(c), padded_heads(heads), heads, c, false) <= kSmemLimit;
}

void launch_indexer_scores_tc(float* scores, const float* q, const float* keys, const float* weights, int64_t rows,
                              int64_t heads, int64_t c, int64_t entries, float scale, cudaStream_t stream,
                              const int32_t* key_begin, const int32_t* key_count, int64_t key_rows) {
    DI_ICHECK(indexer_scores_tc_applies(heads, c), "indexer shape ", heads, " x ", c,
              " is outside the tensor-core indexer kernel");
    if (rows * entries == 0) return;
    DI_ICHECK(entries <= INT_MAX - 1024 && rows <= int64_t{65535} * kMaxChunk, "indexer_scores: ", rows, " rows x ",
              entries, " entries");
    const int ks = k_steps(c);
    const int64_t hp = padded_heads(heads), sms = device_sm_count();
    // Entries per block: 8 warps x NT n8 tiles with NT = 64 / KS (B fragments in 128 registers), at most 8; 2 when
    // the rows' tiles of the larger size would leave SMs idle (decode). NT does not change a result (see the top).
    int nt = std::min(8, 64 / ks);
    if (nt > 2 && rows * ceil_div(entries, kWarps * nt * 8) < sms) nt = 2;
    const int64_t tiles = ceil_div(entries, kWarps * nt * 8);
    // Rows per block: a block stages its first row and its keys before its first products (~1.5 rows of its time),
    // and one block fits an SM, so the cost of a chunk of r rows is (r + 1.5) per wave of blocks. Ties: the larger
    // chunk (fewer key loads). Where the rows have key ranges of their own (a key table of about a range a row:
    // decode, each row its sequence's), every row of a chunk reloads its keys and pays the whole staging latency
    // again, so each row takes a block (H200, decode step at batch 32, rows of 1,024-1,025 entries: chunks of 4 rows
    // took 50 us a call, of 2 27 us, of 1 20 us).
    const bool own_keys = key_begin && key_rows > 0 && rows * entries < 2 * key_rows;
    int chunk = 1;
    double best = INFINITY;
    for (int r = 1; r <= kMaxChunk; r *= 2) {
        if (ceil_div(rows, r) > 65535) continue;  // the grid's y limit
        if (own_keys && best < INFINITY) break;   // the smallest chunk the grid allows
        const double waves = static_cast<double>(ceil_div(tiles * ceil_div(rows, r), sms));
        const double cost = waves * (static_cast<double>(std::min<int64_t>(r, rows)) + 1.5);
        if (cost <= best) best = cost, chunk = r;
    }
    const bool aligned = c % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
    const bool stage = aligned && smem_bytes(ks, hp, heads, c, true) <= kSmemLimit;
    const IdxTcParams p{scores,
                        q,
                        keys,
                        weights,
                        key_begin,
                        key_count,
                        entries,
                        static_cast<int>(rows),
                        static_cast<int>(heads),
                        static_cast<int>(c),
                        static_cast<int>(hp),
                        chunk,
                        stage,
                        c % 2 == 0 && reinterpret_cast<uintptr_t>(keys) % 8 == 0,
                        scale};
    const int smem = static_cast<int>(smem_bytes(ks, hp, heads, c, stage));
    const int64_t chunks = ceil_div(rows, chunk);
    if (nt == 2) {
        if (ks == 4)
            launch_tc<4, 2>(p, tiles, chunks, smem, stream);
        else if (ks == 8)
            launch_tc<8, 2>(p, tiles, chunks, smem, stream);
        else if (ks == 16)
            launch_tc<16, 2>(p, tiles, chunks, smem, stream);
        else
            launch_tc<32, 2>(p, tiles, chunks, smem, stream);
    } else if (ks == 4) {
        launch_tc<4, 8>(p, tiles, chunks, smem, stream);
    } else if (ks == 8) {
        launch_tc<8, 8>(p, tiles, chunks, smem, stream);
    } else {
        launch_tc<16, 4>(p, tiles, chunks, smem, stream);
    }
}

}  // namespace deepinfer::cuda
