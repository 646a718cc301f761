// The routed experts at prefill with FP8 activations (DEEPINFER_FP8_ACTIVATIONS=1) on Hopper's FP8 tensor cores
// (wgmma e4m3 x e4m3, sm_90a): rows sorted into runs by expert, each run's output
// W2_e . q(swiglu(W1_e . q(x_run), W3_e . q(x_run))), q() the activations' FP8 quantization (e4m3 codes and a
// power-of-two scale per row and 128 columns: fake_quantize's kFp8Ue8m0), the weights FP4 (e2m1, E8M0 scale per 32).
//
// Four launches on the stream:
//  0. xq [R, D] e4m3 codes and sx [D / 128, R] f32 scales of x (k8perm order inside each 128-block, below);
//  1. gate/up: per tile (expert, 64 features of I, up to 128 rows of its run) h = swiglu(W1 q(x)^T, W3 q(x)^T) in f32,
//     written as f32 [R, I];
//  2. hq, sh: h quantized as in 0;
//  3. down: per tile (expert, 128 features of D, up to 128 rows) x = W2 q(h)^T in f32 (or at out_rows).
//
// Why this is exact. The tensor cores multiply e4m3 codes: q(x)'s as they are, and the weights' FP4 codes re-expressed
// in e4m3. A row's FP4 values v 2^(e - 127) (e its E8M0 byte per 32 k) equal (v 2^(e - ref)) 2^(ref - 127) with
// ref = (the row's largest e) - 6, and v 2^(e - ref) is an e4m3 value exactly when e - ref lies in [-8, 6] (|v| <= 6:
// at most 384 < 448; the smallest, 0.5 and 1.5 times 2^-8, are e4m3's subnormals 2^-9 and 3 2^-9): when every scale of
// the row lies within kSpan = 14 binades of its largest. experts_fp8_prepare checks that over every row and records
// each row's largest e; experts whose rows do not qualify keep the other paths. So each product is exact; a 128-k
// block's sum is the wgmma's (FP8 wgmma sums with reduced precision, hence a fresh accumulator per block, as DeepGEMM
// does), and the block sums are promoted into f32 accumulators times the tokens' activation scales (powers of two:
// exact); the row's 2^(ref - 127) multiplies once in the epilogue.
//
// A tile is out^T = W_tile . X_tile^T: M = weight rows, N = tokens, K = D or I. Persistent CTAs (one per SM) of 384
// threads: two consumer warpgroups (232 registers: an m64 x N block accumulator and the promoted one, 64 + 64 at
// N = 128) and a producer warpgroup (40). Consumer warpgroup w owns A slice w (64 weight rows). Gate/up slices
// interleave W1 and W3 rows so that a lane's fragment rows g and g + 8 are the gate and up rows of one feature: row r
// of slice s is feature f0 + 32 s + 8 (r / 16) + r % 8, of W1 where r % 16 < 8, else of W3. Down slice s: W2 rows
// f0 + 64 s + r. The producer streams 128-k stages through an 8-deep ring guarded by mbarriers (full: the 128 producer
// threads' cp.async arrivals and the bytes of one bulk tensor copy; empty: the 256 consumer threads): B (up to 128
// token rows x 128 e4m3 codes, K-major, 128-byte swizzle: 8-row x 128-byte atoms, SBO 1024; one TMA copy a stage,
// 3.6% faster for the op than the 128 threads' cp.async, which DEEPINFER_CUDA_FP8_EXPERTS_TMA=0 keeps), the A slices
// as raw FP4 bytes (2 x 64 rows x 64 bytes), their E8M0 bytes and the tokens' activation scales for the block.
//
// A fragments and the k order. The wgmma m64nNk32 A fragment of an 8-bit type holds for lane 4 g + c: a0 = row g,
// k 4c .. 4c + 3; a1 = row g + 8, same k; a2 = row g, k 16 + 4c ..; a3 = row g + 8, k 16 + 4c .. (one byte each, k
// ascending from the low byte). In a stage, lane c reads for its rows g and g + 8 the 16-byte chunk c: real k
// 32 c .. 32 c + 31, one E8M0 group, as 4 words of 8 codes; wgmma step s (k32) takes word s: its codes 0-3 as a0/a1
// and 4-7 as a2/a3. So the step's k position 4 c + j is real k 32 c + 8 s + j and 16 + 4 c + j is 32 c + 8 s + 4 + j:
// B's stored column p of a 128-block holds real column k8perm(p), written that way by the quantizer (launches 0, 2).
//
// FP4 -> e4m3 (chunks::fp4_word_to_e4m3, bf16_mma.cuh): a byte permute looks each code's magnitude up in an 8-byte row
// of a shared table (the e4m3 bytes of the 8 e2m1 magnitudes times 2^d, one row per d = e - ref in [-8, 6]); two more
// permutes move the codes' signs to bit 7 of their bytes. 9 instructions a word of 8 codes (the bf16 decode takes ~15).
//
// Work at D 4096, I 2048, 256 experts x 384 rows: 4.95 TFLOP a layer. Per stage and SM, the two warpgroups issue 8
// m64n128k32 (4.2 MFLOP, ~512 cycles of the tensor cores at FP8's dense rate) and each consumer warp ~200 other
// instructions (decode ~80, promotion 64 FMAs and 16 scale loads, barriers and descriptors), two such warps a
// scheduler.
//
// The decode of stage s + 1's A fragments runs while stage s's wgmmas do (two sets of A registers, 16 each, taking
// turns), which takes it out of the chain below; the tokens' scales are read during the promotion instead of held
// (32 registers). Measured on an H200 (CudaExpertsFp8.PrefillThroughput): 9.16-9.36 ms a layer, 529-540 TFLOP/s,
// 1.12x the bf16 wgmma kernels; 8.74 ms (566 TFLOP/s) once the epilogue stopped calling ldexpf. Promoting stage s - 1
// during stage s's products (a second block accumulator) was slower: 11.0 ms on the 96-row tiles it fits in. A design
// with no decode in the chain (the weights expanded to e4m3 smem tiles once a call, bulk copies, SS wgmma; branch
// wip/fp8-experts-expanded) took 11.3 ms: its products alone run no faster with their copies switched off, so the
// chain of wgmma, wait and promotion bounds both designs
// (bench/results/prefill_fp8_experts_expanded_runs1-7_2026-12-01.txt).
//
// The version that decoded in the chain, measured on an H200 (the whole op with both quantizations): 9.7 ms = 510
// TFLOP/s, 1.03-1.06x the bf16 wgmma kernels (experts_wgmma.cu) on the same weights; FP8's dense peak: ~3 ms. What
// bounds it is each stage's serial chain in a consumer warpgroup: wait for the stage, fence, decode A, 4 wgmmas, wait
// for them, promote. A stage holds a quarter of the bf16 kernel's tensor work per warpgroup, so the chain's fixed
// costs are not hidden: ncu (gate/up) shows the schedulers issuing 0.49 instructions a cycle with 3 warps each, 0.77
// of them eligible; taking the copies out altogether saves only ~7%, the promotion nothing. A micro-
// benchmark of the chain (2 warpgroups, no memory traffic): 1,940 TFLOP/s for the wgmmas and a wait alone, 1,290 with
// the A decode before them, 800 with the decode, the promotion, the mbarrier wait and the proxy fence. Tried and
// slower: the producer warpgroup decoding A into shared memory for SS wgmmas (17.5 ms: one warp a scheduler cannot hide
// the decode's latency) and each consumer warpgroup decoding the next stage into shared memory during its wgmmas
// (11.5 ms: the stores, the fence and the warpgroup barrier cost more than they hide). What should help: more tensor
// work per stage and warpgroup (256-k stages, or 3-4 warpgroups of narrower tiles, within the register file), TMA for
// the copies, and the quantizations fused into their producers (launches 0 and 2, ~1 ms of the 9.7).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/experts_fp8_common.cuh"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/tma.h"
#include "backend/cuda/wgmma_common.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;  // the mbarrier, fence and descriptor helpers (wgmma_common.cuh)
using fp8x::k8perm;     // the B order, slice rows and e4m3 table shared with the decode kernels
using fp8x::k8perm_inv;
using fp8x::kSpan;
using fp8x::kTableRows;
using fp8x::slice_row;

constexpr int kBK = 128;        // k per stage: one activation scale block
constexpr int kSliceRows = 64;  // weight rows per A slice (wgmma M)
constexpr int kWgs = 2;         // consumer warpgroups, one A slice each
constexpr int kMaxN = 128;      // token rows per tile
constexpr int kStages = 8;
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 128 * kWgs;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 2 x 232 + 40 = 3 x 168 (launch bounds at 384 threads)
constexpr int kGateUpFeatures = 32 * kWgs;              // I features per gate/up tile (W1 and W3 rows of each)
constexpr int kDownFeatures = kSliceRows * kWgs;        // D features per down tile

constexpr int kBBytes = kMaxN * kBK;                // 16384: token rows x 128 codes
constexpr int kSliceWBytes = kSliceRows * kBK / 2;  // 4096: 64 rows x 64 bytes of FP4
constexpr int kWBytes = kWgs * kSliceWBytes;
constexpr int kSliceSBytes = kSliceRows * kBK / 32;  // 256: 64 rows x 4 scale bytes
constexpr int kSBytes = kWgs * kSliceSBytes;
constexpr int kXsBytes = kMaxN * 4;  // the tokens' activation scales for the stage's block
constexpr int kStageBytes = kBBytes + kWBytes + kSBytes + kXsBytes;
constexpr int kRingBytes = kStages * kStageBytes;
constexpr int kSmemBytes = 1024 + kRingBytes + kTableRows * 8 + 2 * kStages * 8;
static_assert(kStageBytes % 1024 == 0, "stages keep the swizzle atoms 1024-byte aligned");
static_assert(kSmemBytes <= 227 * 1024, "one CTA's shared memory");
static_assert(kWgs * kConsumerRegs + kProducerRegs <= (kWgs + 1) * (65536 / kThreads / 8 * 8), "register file");

using Tile = ExpertTile;  // rows 1..kMaxN
using PlanHeader = ExpertTilesHeader;
struct Params {
    TileWidthMaps act_maps;  // B's codes by the bulk tensor copy (when tma): 128-byte boxes of act
    bool tma;
    const Tile* tiles;
    int num_tiles;
    const ExpertsFp8Ptrs* experts;
    const uint8_t* act;      // B codes [R, k], k8perm order per 128-block
    const float* act_scale;  // [k / 128, R] (+ kMaxN slack: a tile's scales are loaded whole)
    int64_t rows;            // R
    void* out;               // gate/up: h [R, out_cols] f32; down: x [R, out_cols] f32
    float* const* out_rows;  // down: row r of the output at out_rows[r] instead (null: in x)
    int k, out_cols;
    float limit;  // SwiGLU clamp (gate/up; 0: none)
};

// The producer: fixed roles per thread pt across stages. B: with p.tma, thread 0 copies the tile's n_load rows with
// one bulk tensor copy (the map's 128-byte swizzle is the operand's; rows past the run are the next runs' rows or, past
// R, zeros: their output columns are never stored), counted on the stage's full barrier beside the cp.async arrivals;
// else each thread 16-byte chunk kc = pt % 8 of rows n0 + 16 j (n0 = pt / 8), stored under the 128-byte swizzle (chunk
// kc ^ (n % 8), where n % 8 = n0 % 8 for every j), rows past the run zero-filled from a valid address. A: chunk
// ch = pt % 4 of rows r0 = pt / 4 and r0 + 32 of both slices (r0 + 32 is 16 features, or 32 rows, past r0 in the same
// matrix). E8M0 bytes: row pt % 64 of slice pt / 64. Activation scales: the tile's token pt.
template <bool kGateUp>
__device__ __forceinline__ void produce(const Params& p, const Tile& t, int n_load, uint32_t ring, uint32_t bars,
                                        unsigned it) {
    const int pt = threadIdx.x - kConsumerThreads;
    const ExpertsFp8Ptrs& e = p.experts[t.expert];
    const int k = p.k, nk = k / kBK;
    const int kc = pt & 7, n0 = pt >> 3, ch = pt & 3, r0 = pt >> 2;
    const uint32_t b_dst = static_cast<uint32_t>(n0 * 128 + ((kc ^ (n0 & 7)) << 4));
    const uint8_t* b_src = p.act + static_cast<int64_t>(t.row0) * k + kc * 16;
    const uint8_t* wd[kWgs];
#pragma unroll
    for (int s = 0; s < kWgs; ++s) {
        int which, row;
        slice_row<kGateUp>(t.feature0, s, r0, which, row);
        wd[s] = e.data[which] + static_cast<int64_t>(row) * (k / 2) + ch * 16;
    }
    const int64_t w_half = static_cast<int64_t>(kGateUp ? 16 : 32) * (k / 2);
    const uint32_t w_dst = static_cast<uint32_t>(kBBytes + r0 * 64 + ch * 16);
    int s_which, s_row;
    slice_row<kGateUp>(t.feature0, pt >> 6, pt & 63, s_which, s_row);
    const uint8_t* s_src = e.scale[s_which] + static_cast<int64_t>(s_row) * (k / 32);
    const uint32_t s_dst = static_cast<uint32_t>(kBBytes + kWBytes + (pt >> 6) * kSliceSBytes + (pt & 63) * 4);
    const float* x_src = p.act_scale + t.row0 + pt;
    const uint32_t x_dst = static_cast<uint32_t>(kBBytes + kWBytes + kSBytes + pt * 4);
#pragma unroll 1
    for (int kb = 0; kb < nk; ++kb) {
        const unsigned s = it + kb, st = s % kStages;
        mbar_wait(bars + 8 * (kStages + st), ((s / kStages) & 1) ^ 1);  // the first round passes at once
        const uint32_t sb = ring + st * kStageBytes;
        if (p.tma) {
            if (pt == 0) {
                tma::mbar_expect_tx(bars + 8 * st, static_cast<uint32_t>(n_load) * kBK);
                tma::load_2d(sb, &p.act_maps.map[tma::tile_width_map(n_load)], kb * kBK, t.row0, bars + 8 * st);
            }
        } else {
#pragma unroll 1
            for (int n = n0; n < n_load; n += 16) {
                const bool valid = n < t.rows;
                mma::cp_async16(sb + b_dst + (n - n0) * 128, b_src + (valid ? static_cast<int64_t>(n) * k : 0),
                                valid ? 16 : 0);
            }
        }
#pragma unroll
        for (int sl = 0; sl < kWgs; ++sl) {
            mma::cp_async16(sb + w_dst + sl * kSliceWBytes, wd[sl], 16);
            mma::cp_async16(sb + w_dst + sl * kSliceWBytes + 32 * 64, wd[sl] + w_half, 16);
            wd[sl] += kBK / 2;
        }
        mma::cp_async4(sb + s_dst, s_src);
        mma::cp_async4(sb + x_dst, x_src);
        s_src += kBK / 32;
        x_src += p.rows;
        b_src += kBK;
        cp_async_arrive_noinc(bars + 8 * st);
    }
}

// A consumer lane's A fragments of stage s, decoded from the slot once its copies have landed (waits for them):
// rows arow and arow + 8 of slice wg, FP4 chunk c. ref_idx[h] = kSpan - the largest E8M0 byte of row arow + 8 h, so
// that table row e + ref_idx[h] is the row of d = e - ref.
__device__ __forceinline__ void decode_a(unsigned s, uint32_t (&a)[4][4], const uint8_t* ring_ptr, uint32_t bars,
                                         const uint2* table, int wg, int arow, int c, const int (&ref_idx)[2]) {
    const unsigned st = s % kStages;
    mbar_wait(bars + 8 * st, (s / kStages) & 1);
    __syncwarp();
    fence_proxy_async();  // the copies, for the wgmmas that read B
    const uint8_t* sb = ring_ptr + st * kStageBytes;
    const uint8_t* sw = sb + kBBytes + wg * kSliceWBytes;
    const uint8_t* ss = sb + kBBytes + kWBytes + wg * kSliceSBytes;
    fp8x::decode_fragments(sw, ss, 4, table, arow, c, ref_idx, a);
}

// One 128-k stage of a consumer warpgroup (slice wg), its A fragments decoded (a): 4 wgmma steps into the block
// accumulator; while they run, the next stage's A decoded into a_next (when `next`); then the promotion into acc
// times the tokens' scales (read from the slot before it is handed back). s: the CTA's stage count.
template <int N>
__device__ __forceinline__ void stage(unsigned s, bool next, float (&acc)[N / 2], float (&block)[N / 2],
                                      uint32_t (&a)[4][4], uint32_t (&a_next)[4][4], const uint8_t* ring_ptr,
                                      uint32_t ring, uint32_t bars, const uint2* table, int wg, int arow, int c,
                                      const int (&ref_idx)[2]) {
    const unsigned st = s % kStages;
    // the scales of the lane's tokens 8 j + 2 c and 8 j + 2 c + 1
    fp8x::block_products<N>(acc, block, a, ring + st * kStageBytes,
                            reinterpret_cast<const float*>(ring_ptr + st * kStageBytes + kBBytes + kWBytes + kSBytes),
                            c, [&] {
                                if (next) decode_a(s + 1, a_next, ring_ptr, bars, table, wg, arow, c, ref_idx);
                            });
    mbar_arrive(bars + 8 * (kStages + st));  // the stage is read
}

// One tile of a consumer warpgroup; `it`: the CTA's stages before this tile. The epilogue stores straight from the
// accumulators: d[4 j + v] is row g + 8 (v >> 1) of the warp's 16, token 8 j + 2 c + (v & 1). Gate/up: rows g and
// g + 8 are the gate and up rows of the lane's feature f0 + 32 wg + 8 wl + g, and h is written for it (8 lanes: 32
// contiguous bytes of a row of h); down: rows f0 + 64 wg + arow and arow + 8.
template <int N, bool kGateUp>
__device__ __forceinline__ void consume(const Params& p, const Tile& t, const uint8_t* ring_ptr, uint32_t ring,
                                        uint32_t bars, const uint2* table, unsigned it) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c = lane & 3;
    const int arow = 16 * wl + g;
    const ExpertsFp8Ptrs& e = p.experts[t.expert];
    int ref_idx[2];
    float post[2];
    fp8x::row_refs<kGateUp>(e, t.feature0, wg, arow, ref_idx, post);
    float acc[N / 2], block[N / 2];
    fp8x::clear_accumulators<N>(acc, block);
    const unsigned nk = static_cast<unsigned>(p.k / kBK);
    // Two sets of A fragments taking turns (no copy between them, which ptxas could merge into a wgmma input that is
    // still being read: wgmma_chain_bench's copy-based version drew C7513, every wgmma serialized).
    uint32_t a0[4][4], a1[4][4];
    decode_a(it, a0, ring_ptr, bars, table, wg, arow, c, ref_idx);  // the tile's first stage
    unsigned kb = 0;
#pragma unroll 1
    for (; kb + 1 < nk; kb += 2) {
        stage<N>(it + kb, true, acc, block, a0, a1, ring_ptr, ring, bars, table, wg, arow, c, ref_idx);
        stage<N>(it + kb + 1, kb + 2 < nk, acc, block, a1, a0, ring_ptr, ring, bars, table, wg, arow, c, ref_idx);
    }
    if (kb < nk) stage<N>(it + kb, false, acc, block, a0, a1, ring_ptr, ring, bars, table, wg, arow, c, ref_idx);
    if constexpr (kGateUp) {
        float* h =
            static_cast<float*>(p.out) + static_cast<int64_t>(t.row0) * p.out_cols + t.feature0 + 32 * wg + 8 * wl + g;
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const int n = 8 * j + 2 * c + v;
                if (n < t.rows)
                    h[static_cast<int64_t>(n) * p.out_cols] = swiglu_value(
                        __fmul_rn(acc[4 * j + v], post[0]), __fmul_rn(acc[4 * j + v + 2], post[1]), p.limit);
            }
    } else {
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int n = 8 * j + 2 * c + (v & 1);
                if (n < t.rows) {
                    const int64_t r = t.row0 + n;
                    float* row = p.out_rows ? p.out_rows[r] : static_cast<float*>(p.out) + r * p.out_cols;
                    row[t.feature0 + 64 * wg + arow + 8 * (v >> 1)] = __fmul_rn(acc[4 * j + v], post[v >> 1]);
                }
            }
    }
}

// Persistent: CTA b takes tiles b, b + gridDim.x, ...; the ring and its barrier phases run on across tiles.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) experts_fp8_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // built for another architecture: experts_fp8_shapes_ok() keeps callers away
#else
    pdl_prologue();  // see pdl.cuh
    extern __shared__ uint8_t smem_raw[];
    uint8_t* ring_ptr = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);
    uint2* table = reinterpret_cast<uint2*>(ring_ptr + kRingBytes);
    const uint32_t ring = mma::smem_addr(ring_ptr), bars = ring + kRingBytes + kTableRows * 8;
    // full: the producer threads' cp.async arrivals; empty: every consumer thread
    if (threadIdx.x == 0) mbar_init_ring(bars, kStages, kProducerThreads, kConsumerThreads);
    fp8x::fill_e4m3_table(reinterpret_cast<uint8_t*>(table), threadIdx.x);
    __syncthreads();
    const unsigned nk = static_cast<unsigned>(p.k / kBK);
    if (threadIdx.x >= kConsumerThreads) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        unsigned it = 0;
        for (int i = blockIdx.x; i < p.num_tiles; i += gridDim.x, it += nk) {
            const Tile t = p.tiles[i];
            produce<kGateUp>(p, t, tile_width(t.rows), ring, bars, it);
        }
        mma::cp_async_wait_all();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    unsigned it = 0;
    for (int i = blockIdx.x; i < p.num_tiles; i += gridDim.x, it += nk) {
        const Tile t = p.tiles[i];
        switch (tile_width(t.rows)) {
            case 128:
                consume<128, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
                break;
            case 64:
                consume<64, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
                break;
            case 32:
                consume<32, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
                break;
            default:
                consume<16, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
                break;
        }
    }
#endif
}

// One warp per (row, 128-column block), fp8_quantize_quad over 4 consecutive real columns a lane: the codes stored at
// k8perm_inv of their columns (lane l's 4 real columns are the stored positions 4 l .. 4 l + 3), the scale at
// s[b * rows + r]. in_rows (non-null): row r of x is at in_rows[r] (the slots' token rows).
__global__ void quantize_k8perm_kernel(uint8_t* __restrict__ q, float* __restrict__ s, const float* __restrict__ x,
                                       const float* const* __restrict__ in_rows, int64_t rows, int k) {
    pdl_prologue();  // see pdl.cuh
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, blocks = k / kBK;
    if (warp >= rows * blocks) return;
    const int64_t r = warp / blocks;
    const int b = static_cast<int>(warp % blocks);
    const float* row = in_rows ? in_rows[r] : x + r * k;
    const Fp8Quad quad = fp8_quantize_quad(row + b * kBK + k8perm(4 * lane));
    reinterpret_cast<uint32_t*>(q + r * k + b * kBK)[lane] = quad.codes;
    if (lane == 0) s[b * rows + r] = quad.scale;
}

// Each weight row's largest E8M0 byte; *bad = 1 where a row's bytes span more than kSpan binades or hold 255 (NaN).
__global__ void row_max_kernel(uint8_t* __restrict__ top, int* __restrict__ bad, const uint8_t* __restrict__ scale,
                               int64_t rows, int groups) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const uint8_t* s = scale + r * groups;
    int hi = 0, lo = 255;
    for (int i = 0; i < groups; ++i) {
        const int v = s[i];
        hi = max(hi, v);
        lo = min(lo, v);
    }
    top[r] = static_cast<uint8_t>(hi);
    if (hi == 255 || hi - lo > kSpan) atomicOr(bad, 1);
}

template <bool kGateUp>
void launch_tiles(const Params& p, int64_t tiles, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    allow_smem(experts_fp8_kernel<kGateUp>, kSmemBytes, configured);
    if (tiles == 0) return;
    Params q = p;
    q.num_tiles = static_cast<int>(tiles);
    const int grid = static_cast<int>(std::min<int64_t>(tiles, device_sm_count()));
    launch_pdl(experts_fp8_kernel<kGateUp>, grid, kThreads, kSmemBytes, stream, q);
    DI_CUDA_LAUNCH_CHECK();
}

// B's bulk tensor copies over act [rows, k] codes (when p.tma).
void set_act_maps(Params& p, const uint8_t* act, int64_t rows, int64_t k) {
    if (p.tma) p.act_maps = tma_tile_width_maps(act, static_cast<uint64_t>(rows), static_cast<uint64_t>(k), kBK);
}

void launch_quantize(uint8_t* q, float* s, const float* x, const float* const* in_rows, int64_t rows, int64_t k,
                     cudaStream_t stream) {
    const int64_t threads = rows * (k / kBK) * 32;
    launch_pdl(quantize_k8perm_kernel, static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream, q, s, x, in_rows,
               rows, static_cast<int>(k));
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool experts_fp8_shapes_ok(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts) {
    return fp4_expert_lists_ok(w1, w3, w2, num_experts, kDownFeatures, kDownFeatures);
}

bool experts_fp8_prepare(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts,
                         uint8_t* row_max, cudaStream_t stream) {
    DI_ICHECK(experts_fp8_shapes_ok(w1, w3, w2, num_experts), "experts_fp8: experts the kernels do not take");
    int* bad = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&bad), sizeof(int), stream));
    DI_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), stream));
    const int64_t inter = w1[0].rows, d = w1[0].cols;
    uint8_t* at = row_max;
    for (const WeightDesc* list : {w1, w3, w2})
        for (int e = 0; e < num_experts; ++e) {
            const WeightDesc& w = list[e];
            row_max_kernel<<<static_cast<unsigned>(ceil_div(w.rows, 256)), 256, 0, stream>>>(
                at, bad, w.scale, w.rows, static_cast<int>(w.cols / 32));
            DI_CUDA_LAUNCH_CHECK();
            at += w.rows;
        }
    DI_ICHECK(at == row_max + experts_fp8_row_bytes(num_experts, d, inter), "experts_fp8: row exponents");
    int flag = 0;
    DI_CUDA_CHECK(cudaMemcpyAsync(&flag, bad, sizeof(int), cudaMemcpyDeviceToHost, stream));
    DI_CUDA_CHECK(cudaFreeAsync(bad, stream));
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
    return flag == 0;
}

std::vector<uint8_t> experts_fp8_table(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2,
                                       int num_experts, const uint8_t* row_max) {
    std::vector<ExpertsFp8Ptrs> experts(num_experts);
    const int64_t inter = w1[0].rows, d = w1[0].cols;
    for (int e = 0; e < num_experts; ++e) {  // row_max: w1's rows, w3's, w2's, each expert after expert
        experts[e] = {
            {w1[e].data, w3[e].data, w2[e].data},
            {w1[e].scale, w3[e].scale, w2[e].scale},
            {row_max + e * inter, row_max + (num_experts + e) * inter, row_max + 2 * num_experts * inter + e * d}};
    }
    std::vector<uint8_t> bytes(experts.size() * sizeof(ExpertsFp8Ptrs));
    std::memcpy(bytes.data(), experts.data(), bytes.size());
    return bytes;
}

std::vector<uint8_t> experts_fp8_plan(const int64_t* run_starts, int num_experts, int64_t d, int64_t inter) {
    DI_ICHECK(d % kDownFeatures == 0 && inter % kDownFeatures == 0, "experts_fp8: D ", d, ", I ", inter);
    return expert_tile_plan(run_starts, num_experts, d, inter, kGateUpFeatures, kDownFeatures, kMaxN, "experts_fp8");
}

void launch_grouped_experts_fp8(float* x, int64_t rows, const std::vector<uint8_t>& plan, const void* device_plan,
                                const void* device_table, int64_t d, int64_t inter, float swiglu_limit,
                                cudaStream_t stream, const float* const* in_rows, float* const* out_rows,
                                float* h_out) {
    PlanHeader header;
    DI_ICHECK(plan.size() >= sizeof header, "experts_fp8: no plan");
    std::memcpy(&header, plan.data(), sizeof header);
    if (rows == 0) return;
    const uint8_t* tiles = static_cast<const uint8_t*>(device_plan) + sizeof header;
    // One stream-ordered scratch: [xq: R x D codes] [hq: R x I] [h: R x I f32] [sx: (D / 128) R + kMaxN f32] [sh]
    const auto up16 = [](int64_t b) { return ceil_div(b, 16) * 16; };
    const int64_t at_hq = up16(rows * d), at_h = at_hq + up16(rows * inter), at_sx = at_h + rows * inter * 4;
    const int64_t at_sh = at_sx + up16((d / kBK * rows + kMaxN) * 4), end = at_sh + (inter / kBK * rows + kMaxN) * 4;
    uint8_t* ws = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), static_cast<size_t>(end), stream));
    uint8_t *xq = ws, *hq = ws + at_hq;
    float* h = h_out ? h_out : reinterpret_cast<float*>(ws + at_h);
    float* sx = reinterpret_cast<float*>(ws + at_sx);
    float* sh = reinterpret_cast<float*>(ws + at_sh);
    // A tile loads its 128 token scales whole: the slack past each scale array is read, never used. Zeroed all the
    // same, so that no NaN or Inf lands even in the unused columns.
    DI_CUDA_CHECK(cudaMemsetAsync(sx + d / kBK * rows, 0, kMaxN * 4, stream));
    DI_CUDA_CHECK(cudaMemsetAsync(sh + inter / kBK * rows, 0, kMaxN * 4, stream));
    launch_quantize(xq, sx, x, in_rows, rows, d, stream);

    Params p{};
    p.experts = static_cast<const ExpertsFp8Ptrs*>(device_table);
    p.tiles = reinterpret_cast<const Tile*>(tiles);
    p.tma = tma_switch_on("DEEPINFER_CUDA_FP8_EXPERTS_TMA");  // 0: B on the producer threads' cp.async
    set_act_maps(p, xq, rows, d);
    p.act = xq;
    p.act_scale = sx;
    p.rows = rows;
    p.out = h;
    p.k = static_cast<int>(d);
    p.out_cols = static_cast<int>(inter);
    p.limit = swiglu_limit;
    launch_tiles<true>(p, header.tiles1, stream);

    launch_quantize(hq, sh, h, nullptr, rows, inter, stream);
    p.tiles = reinterpret_cast<const Tile*>(tiles + header.tiles1 * sizeof(Tile));
    set_act_maps(p, hq, rows, inter);
    p.act = hq;
    p.act_scale = sh;
    p.out = x;
    p.out_rows = out_rows;
    p.k = static_cast<int>(inter);
    p.out_cols = static_cast<int>(d);
    launch_tiles<false>(p, header.tiles2, stream);
    DI_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

bool experts_fp8_shapes_ok(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                           const std::vector<LinearWeight>& w2) {
    if (w1.empty() || w3.size() != w1.size() || w2.size() != w1.size()) return false;
    const ExpertDescs d(w1, w3, w2);
    return experts_fp8_shapes_ok(d.w1.data(), d.w3.data(), d.w2.data(), static_cast<int>(w1.size()));
}

bool experts_fp8_prepare(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                         const std::vector<LinearWeight>& w2, uint8_t* row_max) {
    DI_ICHECK(experts_fp8_shapes_ok(w1, w3, w2), "experts_fp8_prepare: experts the kernels do not take");
    const ExpertDescs d(w1, w3, w2);
    return experts_fp8_prepare(d.w1.data(), d.w3.data(), d.w2.data(), static_cast<int>(w1.size()), row_max, nullptr);
}

void run_grouped_experts_fp8_sync(float* x, const std::vector<int64_t>& run_starts, const std::vector<LinearWeight>& w1,
                                  const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                  float swiglu_limit, float* h_out) {
    DI_ICHECK(experts_fp8_shapes_ok(w1, w3, w2) && run_starts.size() == w1.size() + 1,
              "run_grouped_experts_fp8_sync: ", w1.size(), " experts the kernels do not take");
    const int n = static_cast<int>(w1.size());
    const ExpertDescs descs(w1, w3, w2);
    const std::vector<WeightDesc>&d1 = descs.w1, &d3 = descs.w3, &d2 = descs.w2;
    const int64_t d = w1[0].cols, inter = w1[0].rows;
    uint8_t* row_max = nullptr;
    DI_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&row_max), experts_fp8_row_bytes(n, d, inter)));
    DI_ICHECK(experts_fp8_prepare(d1.data(), d3.data(), d2.data(), n, row_max, nullptr),
              "run_grouped_experts_fp8_sync: scales the kernels do not multiply exactly");
    const std::vector<uint8_t> table = experts_fp8_table(d1.data(), d3.data(), d2.data(), n, row_max);
    const std::vector<uint8_t> plan = experts_fp8_plan(run_starts.data(), n, d, inter);
    void *device_table = nullptr, *device_plan = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&device_table, table.size()));
    DI_CUDA_CHECK(cudaMalloc(&device_plan, plan.size()));
    DI_CUDA_CHECK(cudaMemcpy(device_table, table.data(), table.size(), cudaMemcpyHostToDevice));
    DI_CUDA_CHECK(cudaMemcpy(device_plan, plan.data(), plan.size(), cudaMemcpyHostToDevice));
    launch_grouped_experts_fp8(x, run_starts.back(), plan, device_plan, device_table, d, inter, swiglu_limit, nullptr,
                               nullptr, nullptr, h_out);
    DI_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    DI_CUDA_CHECK(cudaFree(device_plan));
    DI_CUDA_CHECK(cudaFree(device_table));
    DI_CUDA_CHECK(cudaFree(row_max));
}

}  // namespace deepinfer::cuda
