// Sparse shared-KV attention on the tensor cores: the bf16 modes' Backend::sparse_attention (attention.cu keeps
// the fp32 SIMT kernel for DEEPINFER_CUDA_GEMM=tiled and head dims above 512).
//
// For one query row every head attends over the same K=V rows, so with the heads as M the row is two GEMMs:
// S [heads, keys] = Q [heads, d] K^T, then O [heads, d] += P [heads, keys] K. A block takes one row and 64 heads
// (HT = 4 m16 tiles; 16 heads, HT = 1, when few rows must spread over the GPU) and walks the row's key list in
// tiles of 64 keys, gathered through the index list into shared memory as bf16 once and used by every head:
//  - Q is rounded to bf16 into shared memory once per block ([HB, d]);
//  - S: warp (sm, sn) computes S for 16 SMT heads x 8 SNT keys over d with mma.sync m16n8k16 (A = Q, B = the
//    key tile, both by ldmatrix); fp32 logits times scale, keys past the list masked to -inf;
//  - online softmax in fp32 per head: the warps exchange per-8-key-group maxima and sums through shared memory,
//    P = exp(s - m) is rounded to bf16 into shared memory, and the denominator adds the rounded P (so the
//    weights that multiply V are the ones that are normalised);
//  - PV: warp w owns output columns [8 NT w, 8 NT (w + 1)) of all the block's heads (fp32 accumulators in
//    registers: 128 per thread at HT = 4, d = 512), rescaled by exp(m_old - m_new) per tile; A = P, B = the
//    same key tile through ldmatrix.trans.
//  - the key tiles are double buffered: while tile t is computed, tile t + 1 is staged, either by cp.async from a
//    bf16 copy of the key table (made once per call when the table is small against the work: prefill, where
//    each key serves up to 128 + rows) or gathered from the fp32 rows (a table, or rows by address:
//    Backend::sparse_attention_rows, the addresses resolved when a tile's indices are read, a tile or two ahead)
//    in four register batches of 16 keys, each stored (rounded) into the other buffer a quarter of the tile's
//    MMAs later (decode, where most keys serve one row; blocks of 16 heads, which have the registers, load all
//    four at the tile's start and store them at its end). Both give the same bf16 values, so the choice never
//    changes a result.
// The sink joins at the end as in attention.cu. A block with the row's whole key list (prefill, batch-invariant
// mode) normalises and writes its accumulators directly; the blocks of a cluster (a row's key list split over up
// to 8 of them for decode; never in batch-invariant mode) write their unnormalised outputs and (m, l) per head to
// shared memory and merge them in rank order through distributed shared memory.
//
// Deterministic, and batch-invariant without splits: per logit the k16 steps run in order; the tile max is a
// max; each tile's sum of P adds eight 8-key group sums in key order, each summed over the same lane tree; the
// PV sums run over the key tiles in order. None of this depends on HT, the number of rows, or the staging path,
// so the head-tile choice may follow the row count even in batch-invariant mode.
// Numerics: q and keys rounded to bf16 (relative 2^-9 each), fp32 accumulation and softmax, P rounded to bf16
// (relative 2^-9 per weight, random in sign, so the output moves by ~2^-9 / sqrt(3) of its own size).
//
// Cost model (H200: 132 SMs at ~1.75 GHz under load; HBM ~4.3 TB/s; L2 ~7 TB/s; 128 B/clk of shared memory per
// SM; mma.sync m16n8k16 at ~2,500 FLOP/clk/SM, about 60% of the wgmma peak), V4-Flash shape (64 heads x 512):
//  - per key of a row: 4 * 64 * 512 = 131,072 FLOP (QK^T and PV); a 64-key tile is 2,048 MMAs per block.
//  - shared memory per tile at HT = 4: S 8 warps x 32 k16 x (2 A + 1 B ldmatrix.x4 of 512 B) = 384 KiB,
//    PV 8 x 4 x (4 A + 4 B x4) = 128 KiB, key tile and P stores 72 KiB: ~600 KB = 4,700 clk, against 3,400 clk
//    of MMA issue. So the kernel is bound by shared memory at ~8.4 MFLOP / 4,700 clk ~ 1,800 FLOP/clk/SM
//    (~410 TFLOP/s); with three block barriers per tile and one block (8 warps) per SM, ~2/3 of that is the
//    estimate: ~7,000 clk = 4 us per tile, ~270 TFLOP/s.
//  - per row the block also reads q (128 KiB fp32) before its first tile and writes the output (128 KiB):
//    ~4 us of its SM's share of HBM, exposed once per row.
//  - prefill, one 2048-token sequence (bench): 380 keys per row on average (window 128 + one entry per 4
//    positions up to 512): 2048 x 380 x 131,072 = 102 GFLOP -> 0.38 ms of tiles + ~15% for the q loads
//    = ~0.45 ms (SIMT kernel at 17.6 TFLOP/s: 5.8 ms). HBM: 2048 x 256 KiB = 0.54 GB = 0.13 ms; key gather from
//    the bf16 table (L2): 2048 x 380 x 1 KiB = 0.8 GB = 0.11 ms: both under the tiles.
//  - prefill 8 x 2048 in the 8-layer model: 500 GFLOP per call (28.4 ms at 17.6 TFLOP/s) -> ~1.9 ms of tiles,
//    ~2.2 ms with the q loads (HBM 16384 x 256 KiB = 4.3 GB = 1.0 ms, overlapped across blocks): 228 ms of
//    attention per step -> ~18 ms. Measured (H200, run 18): 45 ms a step, 5.6 ms a call; ncu (the sliding-window
//    layer, before the direct epilogue) put the kernel at IPC ~1 with 8 warps an SM: latency-bound, not
//    shared-memory-bound as modelled.
//  - decode, 640 keys per row, fp32 gather (2 KiB per key from L2, ~55 GB/s per SM when all SMs pull: 2.3 us per
//    tile, under the 4 us of MMAs): batch 128: HT = 4, no split, 128 blocks x 10 tiles = ~41 us + ~5 us for q
//    and the first tile = ~45 us (10.7 GFLOP, ~240 TFLOP/s; SIMT 340 us). Batch 32: HT = 4, 4-way split, 128
//    blocks x 160 keys = 2.5 tiles = ~10 us + ~5 us = ~15 us. Batch 1: HT = 1, 4 head groups x 8-way split =
//    32 blocks x 80 keys (16 heads): the first tile's gather (~1.5 us) + 2 small tiles (~3 us) + the merge and
//    launch (~3 us) = ~7 us.
//    Measured (H200, decode step profile at context 4096): 85 / 40 / 19 us a call at batch 32 / 8 / 1 with 4-way
//    splits at 32 and 8 rows, which asked for 32 clusters of 4 where the GPCs hold 30 (ncu: SMs active 47% of the
//    call, the last two clusters a second wave); split 3 ways (the largest split whose clusters all fit): 56 / 27
//    us. ncu (sliding-window layer, batch 32): the q loads before the first tile and the cluster merge were ~40% of
//    the stall samples (a block has half a tile there); q now has 8 loads in flight per thread instead of 4.
//    Later (CUPTI, 8-layer decode step, context 4096): 40 / 78 us a call (window or HCA layer / CSA layer) at batch
//    32, 17 / 37 at batch 8; the merge then read one element of one rank at a time (a dependent chain of
//    distributed-shared-memory loads, ~15 us). With float4 merges of 4 elements in flight, q at 16 loads in flight,
//    the first tile's four batches loaded at once and 16-head blocks gathering whole tiles at once: 28 / 64 us at
//    batch 32, 14.6 / 33 at batch 8 (bench/results/decode_attention_2026-12-03h.txt).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/attention_merge.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace deepinfer::cuda {

namespace {

using namespace mma;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kTileKeys = 64;              // keys per staged tile
constexpr int kBatchKeys = kTileKeys / 4;  // fp32 gather: keys per register batch
constexpr int kGroups = kTileKeys / 8;     // 8-key groups of a tile: the unit of the max and sum exchange
constexpr int kPld = kTileKeys + 8;        // bf16 row stride of P (144 bytes: ldmatrix rows hit distinct banks)
constexpr int kMaxSplits = 8;              // portable cluster size
constexpr int kMaxHeadDim = 512;


struct TcAttnParams {
    float* out;                  // [T, H, d] f32
    const float* q;              // [T, H, d] f32
    const float* keys;           // [Nk, d] f32, the shared K=V rows (null: key_rows)
    const float* const* key_rows;  // [Nk] their addresses instead (gather staging only), else null
    const __nv_bfloat16* table;  // [Nk, DP] bf16: keys rounded, zero past d (table staging), else null
    const int32_t* offsets;      // [T + 1] row t attends keys indices[offsets[t] .. offsets[t + 1])
    const int32_t* indices;      // [offsets[T]] rows of keys (of key_rows)
    const float* sinks;          // [H] per-head sink logits
    int heads, d;
    int splits;  // cluster size: blocks sharing one (row, head group)'s key list
    int vec;     // d % 4 == 0 and q, the key rows 16-byte aligned: float4 loads
    float scale;
};

// Dynamic shared memory of the kernel with HT m16 head tiles and NT n8 output tiles per warp, in bytes.
constexpr int tc_smem_bytes(int ht, int nt) {
    const int hb = 16 * ht, ld = 64 * nt + 8;
    return 2 * (hb * ld + 2 * kTileKeys * ld + hb * kPld) + 4 * (2 * kGroups * hb + 3 * hb + kMaxSplits * hb) +
           8 * 2 * kTileKeys;
}

// Grid: (rows * splits, ceil(H / 16 HT)), cluster (splits, 1, 1), 256 threads. d <= DP = 64 NT.
template <int HT, int NT, bool TABLE>
__global__ void __launch_bounds__(kThreads, 1) sparse_attention_tc_kernel(const __grid_constant__ TcAttnParams p) {
    pdl_prologue();  // see pdl.cuh
    constexpr int HB = 16 * HT;                     // heads of the block
    constexpr int DP = 64 * NT;                     // padded head dim: 8 warps x NT x 8 output columns
    constexpr int LD = DP + 8;                      // bf16 row stride of Q and the key tiles (16 B of padding)
    constexpr int KS = DP / 16;                     // k16 steps of a logit
    constexpr int CPL = DP / 4;                     // float4s per staged row
    constexpr int SMT = HT == 4 ? 2 : 1;            // S: m16 head tiles per warp
    constexpr int GM = HT / SMT, GN = kWarps / GM;  // S: warps along heads and along keys
    constexpr int SNT = kTileKeys / (8 * GN);       // S: n8 key tiles per warp
    static_assert(GM * GN == kWarps && SNT * 8 * GN == kTileKeys && (SNT == 1 || SNT == 2), "S warp layout");
    static_assert(NT % 2 == 0, "PV B fragments are loaded for two n8 tiles at once");
    constexpr uint32_t kBufBytes = kTileKeys * LD * 2;

    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [HB][LD] the block's queries
    __nv_bfloat16* ks = qs + HB * LD;                            // [2][kTileKeys][LD] key tiles
    __nv_bfloat16* ps = ks + 2 * kTileKeys * LD;                 // [HB][kPld] P of the current tile
    float* red_max = reinterpret_cast<float*>(ps + HB * kPld);   // [kGroups][HB] per-group logit maxima
    float* red_sum = red_max + kGroups * HB;                     // [kGroups][HB] per-group sums of P
    float* alpha_s = red_sum + kGroups * HB;                     // [HB] this tile's rescale of O
    float* ml = alpha_s + HB;                                    // [2][HB] final running max and denominator
    float* wts = ml + 2 * HB;                                    // [kMaxSplits][HB] each rank's merge weight
    static_assert(
        (2 * (HB * LD + 2 * kTileKeys * LD + HB * kPld) + 4 * (2 * kGroups * HB + 3 * HB + kMaxSplits * HB)) % 8 == 0,
        "idx_s 8-byte aligned");
    // [2][kTileKeys] the keys of tiles by parity: table staging their rows, gather staging their addresses (0: none).
    long long* idx_s = reinterpret_cast<long long*>(wts + kMaxSplits * HB);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int splits = p.splits, rank = blockIdx.x % splits, row = blockIdx.x / splits;
    const int h0 = blockIdx.y * HB, nh = min(HB, p.heads - h0), d = p.d;
    const int begin = p.offsets[row], len = p.offsets[row + 1] - begin;
    const int chunk = (len + splits - 1) / splits;
    const int kb = begin + min(len, rank * chunk), ke = begin + min(len, (rank + 1) * chunk);
    const int tiles = (ke - kb + kTileKeys - 1) / kTileKeys;

    // Thread tid < kTileKeys: key tid of tile t: its row (table staging; -1 past the list) or its address (gather
    // staging, read here a tile or two ahead of its use; 0 past the list).
    auto tile_index = [&](int t) -> long long {
        const int k = kb + t * kTileKeys + tid;
        const int r = tid < kTileKeys && k < ke ? __ldg(p.indices + k) : -1;
        if constexpr (TABLE) return r;
        if (r < 0) return 0;
        if (p.key_rows) return __ldg(reinterpret_cast<const long long*>(p.key_rows) + r);
        return static_cast<long long>(reinterpret_cast<uintptr_t>(p.keys + static_cast<int64_t>(r) * p.d));
    };
    // Floats col .. col + 3 of a row of d floats (zeros past d, or for a null row).
    auto load4 = [&](const float* src, int col) {
        if (!src || col >= d) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (p.vec) return __ldg(reinterpret_cast<const float4*>(src + col));
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = col + e < d ? __ldg(src + col + e) : 0.0f;
        return make_float4(v[0], v[1], v[2], v[3]);
    };
    auto store4 = [](__nv_bfloat16* dst, float4 v) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    };

    // fp32 gather: batch j (keys 16 j .. 16 j + 15 of a tile) in registers; this thread's float4 i is key
    // 16 j + f / CPL, columns 4 (f % CPL), f = tid + 256 i (a warp reads 512 contiguous bytes of one key).
    // kInFlight batches are loaded at once: all four where the registers allow (16 heads a block: a quarter of the
    // MMAs a tile, so the gather's latency, not the products, sets the tile time), else one, a quarter tile ahead.
    constexpr int kInFlight = HT == 1 ? 4 : 1;
    float4 batch[kInFlight][NT];
    auto gather_load = [&](const long long* idx, int j, float4* dst) {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int f = tid + kThreads * i;
            const auto* src = reinterpret_cast<const float*>(static_cast<uintptr_t>(idx[kBatchKeys * j + f / CPL]));
            dst[i] = load4(src, 4 * (f % CPL));
        }
    };
    auto gather_store = [&](__nv_bfloat16* buf, int j, const float4* src) {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int f = tid + kThreads * i;
            store4(buf + (kBatchKeys * j + f / CPL) * LD + 4 * (f % CPL), src[i]);
        }
    };
    // A whole tile: its four batches' loads all issued before any is stored.
    auto gather_tile_load = [&](const long long* idx, float4(&regs)[4][NT]) {
#pragma unroll
        for (int j = 0; j < 4; ++j) gather_load(idx, j, regs[j]);
    };
    auto gather_tile_store = [&](__nv_bfloat16* buf, const float4(&regs)[4][NT]) {
#pragma unroll
        for (int j = 0; j < 4; ++j) gather_store(buf, j, regs[j]);
    };
    // bf16 table: the whole tile by cp.async, 16 bytes each; rows past the list are zero filled.
    auto table_issue = [&](const long long* idx, __nv_bfloat16* buf) {
        constexpr int kPieces = DP / 8;  // 16-byte pieces per key
#pragma unroll
        for (int i = 0; i < kTileKeys * kPieces / kThreads; ++i) {
            const int f = tid + kThreads * i, key = f / kPieces, piece = f % kPieces, r = static_cast<int>(idx[key]);
            const __nv_bfloat16* src = r >= 0 ? p.table + static_cast<int64_t>(r) * DP + 8 * piece : p.table;
            cp_async16(buf + key * LD + 8 * piece, src, r >= 0 ? 16 : 0);
        }
    };
    // The staging of tile t + 1 into buffer (t + 1) % 2 while tile t is computed, at points 0 (tile start),
    // 1 (half of S), 2 (end of S), 3 (half of PV) and 4 (end of PV, before the tile's last barrier).
    auto stage_next = [&](int point, int t) {
        if (t + 1 >= tiles) return;
        const long long* idx = idx_s + ((t + 1) % 2) * kTileKeys;
        __nv_bfloat16* buf = ks + ((t + 1) % 2) * kTileKeys * LD;
        if constexpr (TABLE) {
            if (point == 0) table_issue(idx, buf);
            if (point == 4) cp_async_wait_all();
        } else if constexpr (kInFlight == 4) {
            if (point == 0) gather_tile_load(idx, batch);
            if (point == 4) gather_tile_store(buf, batch);
        } else {
            if (point > 0) gather_store(buf, point - 1, batch[0]);
            if (point < 4) gather_load(idx, point, batch[0]);
        }
    };

    // Prologue: the first two tiles' keys (read before the queries, stored after them: gather staging resolves each
    // key's address with a second dependent load), the queries, the first tile.
    const long long first_keys[2] = {tile_index(0), tile_index(1)};
    const float* qrow = p.q + (static_cast<int64_t>(row) * p.heads + h0) * d;
#pragma unroll 16  // loads in flight per thread: the q rows come from L2 or HBM once per block
    for (int i = tid; i < HB * CPL; i += kThreads) {
        const int h = i / CPL, c4 = i % CPL;
        store4(qs + h * LD + 4 * c4, load4(h < nh ? qrow + static_cast<int64_t>(h) * d : nullptr, 4 * c4));
    }
    if (tid < kTileKeys) {
        idx_s[tid] = first_keys[0];
        idx_s[kTileKeys + tid] = first_keys[1];
    }
    __syncthreads();
    if (tiles > 0) {
        if constexpr (TABLE) {
            table_issue(idx_s, ks);
        } else {
            // All four batches' loads in flight before the first store (the accumulators are not live yet, so the
            // registers are free): one gather latency for the first tile instead of four.
            float4 first[4][NT];
            gather_tile_load(idx_s, first);
            gather_tile_store(ks, first);
        }
    }
    cp_async_wait_all();
    __syncthreads();

    // S: this warp's heads srow0 .. + 16 SMT and keys skey0 .. + 8 SNT of each tile. ldmatrix lane addresses
    // as in gemm_tc.cu: A matrices (rows 0-7, k 0-7), (8-15, k 0-7), (0-7, k 8-15), (8-15, k 8-15); B (keys as
    // n) (0-7, k 0-7), (0-7, k 8-15), (8-15, k 0-7), (8-15, k 8-15).
    const int sm = warp / GN, sn = warp % GN, srow0 = sm * SMT * 16, skey0 = sn * SNT * 8;
    const uint32_t q_lane = smem_addr(qs + (srow0 + lane % 16) * LD + (lane / 16) * 8);
    const uint32_t k_lane =
        smem_addr(ks + (skey0 + lane % 8 + (SNT == 2 ? (lane / 16) * 8 : 0)) * LD + ((lane / 8) % 2) * 8);
    // PV: output columns ocol0 .. + 8 NT of every head of the block. A = P as above; B by ldmatrix.trans of the
    // [key][column] tile: matrices (keys 0-7, columns 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
    const int ocol0 = warp * NT * 8;
    const uint32_t p_lane = smem_addr(ps + (lane % 16) * kPld + (lane / 16) * 8);
    const uint32_t v_lane = smem_addr(ks + (((lane / 8) % 2) * 8 + lane % 8) * LD + ocol0 + (lane / 16) * 8);

    float acc[HT][NT][4] = {};  // O rows mt * 16 + g (+ 8), columns ocol0 + nt * 8 + 2c (+ 1)
    // This thread's S rows: i = 2 mt + hr (m16 tile mt, fragment half hr) is head srow(i) of the block.
    auto srow = [&](int i) { return srow0 + (i / 2) * 16 + g + 8 * (i % 2); };
    float m_run[2 * SMT], l_run[2 * SMT];  // running max and denominator of each
#pragma unroll
    for (int i = 0; i < 2 * SMT; ++i) m_run[i] = -INFINITY, l_run[i] = 0.0f;

#pragma unroll 1
    for (int t = 0; t < tiles; ++t) {
        const int n = min(kTileKeys, ke - kb - t * kTileKeys);  // keys of this tile
        const uint32_t buf = (t % 2) * kBufBytes;
        const long long next_index = tile_index(t + 2);  // stored for tile t + 2 at the end of this one
        stage_next(0, t);

        // S = Q K^T over the warp's keys (warps whose keys are all past the list skip the products).
        float s[SMT][SNT][4] = {};
        const bool s_active = skey0 < n;
        auto s_steps = [&](int k0, int k1) {
            if (!s_active) return;
#pragma unroll
            for (int kk = k0; kk < k1; ++kk) {
                uint32_t a[SMT][4], b[SNT][2];
#pragma unroll
                for (int mt = 0; mt < SMT; ++mt) ldmatrix_x4(a[mt], q_lane + (mt * 16 * LD + kk * 16) * 2);
                if constexpr (SNT == 2) {
                    uint32_t r[4];
                    ldmatrix_x4(r, k_lane + buf + kk * 32);
                    b[0][0] = r[0], b[0][1] = r[1], b[SNT - 1][0] = r[2], b[SNT - 1][1] = r[3];
                } else {
                    uint32_t r[2];
                    ldmatrix_x2(r, k_lane + buf + kk * 32);
                    b[0][0] = r[0], b[0][1] = r[1];
                }
#pragma unroll
                for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < SNT; ++nt) mma_bf16(s[mt][nt], a[mt], b[nt][0], b[nt][1]);
            }
        };
        s_steps(0, KS / 2);
        stage_next(1, t);
        s_steps(KS / 2, KS);
        stage_next(2, t);

        // Scaled logits (-inf past the list) and their maxima per 8-key group.
#pragma unroll
        for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SNT; ++nt) {
                const int key = skey0 + nt * 8 + 2 * c;
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = key + e % 2 < n ? s[mt][nt][e] * p.scale : -INFINITY;
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    float mx = fmaxf(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]);
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    if (c == 0) red_max[(sn * SNT + nt) * HB + srow(2 * mt + hr)] = mx;
                }
            }
        __syncthreads();

        // Online softmax of the warp's rows: the tile max over the 8 groups, P = exp(s - m) rounded to bf16,
        // group sums of the rounded P. Every warp of a row computes the same m and l.
        float alpha[2 * SMT];
#pragma unroll
        for (int i = 0; i < 2 * SMT; ++i) {
            float tmax = red_max[srow(i)];
#pragma unroll
            for (int grp = 1; grp < kGroups; ++grp) tmax = fmaxf(tmax, red_max[grp * HB + srow(i)]);
            const float m_new = fmaxf(m_run[i], tmax);
            alpha[i] = expf(m_run[i] - m_new);  // 0 on the first tile (m_run = -inf)
            m_run[i] = m_new;
        }
#pragma unroll
        for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SNT; ++nt) {
                const int key = skey0 + nt * 8 + 2 * c;
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int h = srow(2 * mt + hr);
                    const float m = m_run[2 * mt + hr];
                    const float p0 = key < n ? expf(s[mt][nt][2 * hr] - m) : 0.0f;
                    const float p1 = key + 1 < n ? expf(s[mt][nt][2 * hr + 1] - m) : 0.0f;
                    const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
                    *reinterpret_cast<__nv_bfloat162*>(ps + h * kPld + key) = pb;
                    float sum = __low2float(pb) + __high2float(pb);
                    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                    if (c == 0) red_sum[(sn * SNT + nt) * HB + h] = sum;
                }
            }
        if (sn == 0 && c == 0) {
#pragma unroll
            for (int i = 0; i < 2 * SMT; ++i) alpha_s[srow(i)] = alpha[i];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2 * SMT; ++i) {
            float sum = red_sum[srow(i)];
#pragma unroll
            for (int grp = 1; grp < kGroups; ++grp) sum += red_sum[grp * HB + srow(i)];
            l_run[i] = l_run[i] * alpha[i] + sum;
        }

        // O = O * alpha + P V over the tile's k16 steps that hold keys.
#pragma unroll
        for (int mt = 0; mt < HT; ++mt) {
            const float lo = alpha_s[mt * 16 + g], hi = alpha_s[mt * 16 + g + 8];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                acc[mt][nt][0] *= lo, acc[mt][nt][1] *= lo;
                acc[mt][nt][2] *= hi, acc[mt][nt][3] *= hi;
            }
        }
        const int pv_steps = (n + 15) / 16;
        auto pv = [&](int k0, int k1) {
#pragma unroll 1
            for (int kk = k0; kk < k1; ++kk) {
                uint32_t b[NT][2];
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t r[4];
                    ldmatrix_x4_trans(r, v_lane + buf + (kk * 16 * LD + np * 16) * 2);
                    b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
                }
#pragma unroll
                for (int mt = 0; mt < HT; ++mt) {
                    uint32_t a[4];
                    ldmatrix_x4(a, p_lane + (mt * 16 * kPld + kk * 16) * 2);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a, b[nt][0], b[nt][1]);
                }
            }
        };
        pv(0, min(2, pv_steps));
        stage_next(3, t);
        pv(2, pv_steps);
        stage_next(4, t);
        if (tid < kTileKeys) idx_s[(t % 2) * kTileKeys + tid] = next_index;
        __syncthreads();  // tile t + 1 staged; this tile's buffer, P and sums free
    }

    float* orow = p.out + (static_cast<int64_t>(row) * p.heads + h0) * d;
    if (sn == 0 && c == 0) {  // every head's running max and denominator, for either ending below
#pragma unroll
        for (int i = 0; i < 2 * SMT; ++i) ml[srow(i)] = m_run[i], ml[HB + srow(i)] = l_run[i];
    }
    if (splits == 1) {
        // One block per (row, head group) (prefill, batch-invariant mode): out = O exp(m - M) / L with the sink
        // joining M and L, written straight from the accumulators. The merge below costs ~5,000 instructions a
        // thread (a division, a rank loop and a distributed-shared-memory load per element), more than two key
        // tiles of MMAs: it dominated the sliding-window layers' prefill.
        __syncthreads();
        const bool pairs = d % 2 == 0 && reinterpret_cast<uintptr_t>(orow) % 8 == 0;
#pragma unroll
        for (int mt = 0; mt < HT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int h = mt * 16 + g + 8 * hr;
                if (h >= nh) continue;
                const float sink = p.sinks[h0 + h], m = ml[h];
                const float mx = fmaxf(sink, m);
                const float l = __fadd_rn(expf(sink - mx), __fmul_rn(ml[HB + h], expf(m - mx)));
                const float w = __fdiv_rn(expf(m - mx), l);
                float* o = orow + static_cast<int64_t>(h) * d;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int col = ocol0 + nt * 8 + 2 * c;
                    const float v0 = __fmul_rn(w, acc[mt][nt][2 * hr]), v1 = __fmul_rn(w, acc[mt][nt][2 * hr + 1]);
                    if (pairs && col < d) {
                        *reinterpret_cast<float2*>(o + col) = make_float2(v0, v1);
                    } else {
                        if (col < d) o[col] = v0;
                        if (col + 1 < d) o[col + 1] = v1;
                    }
                }
            }
        return;
    }

    // Merge the cluster's partial states: out = sum_r exp(m_r - M) O_r / L, with the sink joining M and L.
    constexpr int PLD = DP + 8;  // float row stride of the partial output
    static_assert(HB * PLD * 4 <= 2 * kTileKeys * LD * 2, "the partial output fits in the key tiles");
    float* part = reinterpret_cast<float*>(ks);  // [HB][PLD]
#pragma unroll
    for (int mt = 0; mt < HT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float* at = part + (mt * 16 + g) * PLD + ocol0 + nt * 8 + 2 * c;
            *reinterpret_cast<float2*>(at) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
            *reinterpret_cast<float2*>(at + 8 * PLD) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    merge_cluster_outputs<HB, kThreads>(orow, part, PLD, ml, wts, p.sinks + h0, nh, d, splits, rank);
}

template <int HT, int NT, bool TABLE>
void launch_tc(TcAttnParams p, int64_t rows, cudaStream_t stream) {
    auto kernel = sparse_attention_tc_kernel<HT, NT, TABLE>;
    static std::atomic<uint64_t> configured{0};
    constexpr int smem = tc_smem_bytes(HT, NT);
    static_assert(smem <= 227 * 1024, "shared memory of the tensor-core attention");
    allow_smem(kernel, smem, configured);
    // The planned split fills the SMs, but clusters must each fit in a GPC: where the device holds fewer clusters of
    // that size at once than the grid has, the rest would run as a second wave (H200, batch 32: 32 clusters of 4
    // against 30, which doubled the call). Take the largest split whose clusters all run at once (at most the
    // planned one; any size: the merge takes any rank count). Splits never change which keys a row attends.
    static ClusterFit fit;
    const int64_t groups = ceil_div(p.heads, 16 * HT);
    while (p.splits > 1 && rows * groups > fit.max_active(kernel, p.splits, kThreads, smem)) --p.splits;
    launch_clustered_pdl(kernel, dim3(static_cast<unsigned>(rows * p.splits), static_cast<unsigned>(groups)), p.splits,
                         kThreads, smem, stream, p);
}

template <int HT, int NT>
void launch_tc_staging(const TcAttnParams& p, int64_t rows, cudaStream_t stream) {
    if (p.table)
        launch_tc<HT, NT, true>(p, rows, stream);
    else
        launch_tc<HT, NT, false>(p, rows, stream);
}

}  // namespace

bool sparse_attention_tc_applies(int64_t d) { return d <= kMaxHeadDim; }

// The bf16 copy of the key table costs a pass over it (6 bytes per element) and saves 2 bytes per element of
// every gathered key plus the conversions: worth it once the rows gather many times the table (prefill: every
// key serves up to 128 + rows), not when most keys serve one row (decode: the table holds every entry of every
// sequence, the rows only their picks).
bool sparse_attention_tc_copies_table(int64_t nkeys, int64_t rows) { return nkeys > 0 && nkeys <= 32 * rows; }

void launch_sparse_attention_tc(void* out, const void* q, const float* keys, int64_t nkeys, const int32_t* offsets,
                                const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, int64_t d,
                                float scale, bool batch_invariant, cudaStream_t stream, AttnKeyStaging staging,
                                const float* const* key_rows, const AttnRope* rope) {
    DI_ICHECK(sparse_attention_tc_applies(d), "head_dim ", d, " is too large for the tensor-core attention kernel");
    DI_ICHECK(!key_rows || (!keys && staging != AttnKeyStaging::kTable),
              "sparse_attention_tc: keys by address are gathered, never copied to a table");
    if (rows * heads * d == 0) return;
    const int64_t sms = device_sm_count();
    // 64 heads per block (a staged key serves all of them) unless even the largest split leaves SMs idle
    // (decode of up to 16 rows): then 16, which quadruples the blocks. One block per SM (~210 KB of shared
    // memory at 64 heads), so splits fill one wave: the largest power of two <= 8 with rows x groups x splits
    // <= SMs. Batch-invariant mode never splits; the head tiles do not change results (see the top).
    const int ht = heads > 16 && rows * ceil_div(heads, 64) * kMaxSplits >= sms ? 4 : 1;
    const int64_t groups = ceil_div(heads, 16 * ht);
    int splits = 1;
    while (!batch_invariant && splits < kMaxSplits && rows * groups * splits * 2 <= sms) splits *= 2;
    const int nt = d <= 128 ? 2 : 8;
    const int64_t dp = 64 * nt;
    const bool table = !key_rows && nkeys > 0 &&
                       (staging == AttnKeyStaging::kTable ||
                        (staging == AttnKeyStaging::kAuto && sparse_attention_tc_copies_table(nkeys, rows)));
    const bool wgmma =
        table && splits == 1 && sparse_attention_wgmma_applies(rows, heads, d, batch_invariant, true, q, out);
    DI_ICHECK(!rope || wgmma, "sparse_attention_tc: only the wgmma form norms and rotates the queries");
    uint16_t* tab = nullptr;
    if (table) {
        DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&tab), nkeys * dp * 2, stream));
        launch_to_bf16(tab, dp, keys, d, nkeys, d, stream);
        if (wgmma) {
            launch_sparse_attention_wgmma(out, q, tab, offsets, indices, sinks, rows, heads, scale, stream, rope);
            DI_CUDA_CHECK(cudaFreeAsync(tab, stream));
            return;
        }
    }
    // Rows by address are 16-byte aligned (the caller's contract: Backend::sparse_attention_rows).
    const bool vec =
        d % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(keys) % 16 == 0;
    const TcAttnParams p{static_cast<float*>(out),
                         static_cast<const float*>(q),
                         keys,
                         key_rows,
                         reinterpret_cast<const __nv_bfloat16*>(tab),
                         offsets,
                         indices,
                         sinks,
                         static_cast<int>(heads),
                         static_cast<int>(d),
                         splits,
                         vec,
                         scale};
    if (ht == 4) {
        if (nt == 2)
            launch_tc_staging<4, 2>(p, rows, stream);
        else
            launch_tc_staging<4, 8>(p, rows, stream);
    } else {
        if (nt == 2)
            launch_tc_staging<1, 2>(p, rows, stream);
        else
            launch_tc_staging<1, 8>(p, rows, stream);
    }
    if (tab) DI_CUDA_CHECK(cudaFreeAsync(tab, stream));
}

}  // namespace deepinfer::cuda
