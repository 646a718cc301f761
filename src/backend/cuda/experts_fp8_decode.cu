// Decode's routed experts on the FP8 tensor cores with the activations kept exact (DEEPINFER_CUDA_FP8_DECODE_EXPERTS):
// the products of experts_wgmma.cu's decode rings (the same device plan, tiles of up to kFp8DecodeTileTokens slots,
// 128 gate/up and 256 down features a tile), with the FP4 weights re-expressed as e4m3 (experts_fp8.cu's table: exact
// for rows whose scales span at most 14 binades) and each activation row split into two e4m3 rows.
//
// Why. ncu had put the bf16 decode rings' limit in their consumers' instructions, two thirds of them the FP4 -> bf16
// decode (~15 instructions a word of 8 codes; experts_wgmma.cu, "Decode"); FP4 -> e4m3 takes 9 (byte permutes into a
// shared table), and an e4m3 wgmma takes 32 k a step instead of 16. With 29% fewer instructions (ncu, gate/up at 32
// tokens) the first version was no faster, though: what bounded both was the E8M0 bytes' copies, 4 bytes a weight row
// a block, one single-sector request each (512 a stage beside the weights' 1,024 sectors). Copied 16 bytes a row a
// pair of stages here, the routed FFN takes 529 us at 32 tokens (80.5% of the HBM rate; 496 with the consumers doing
// nothing) against 650 on the bf16 rings, 189 against 235 at 8 (H200;
// bench/results/decode_fp8_experts_2026-12-03f.txt).
//
// The split. Activations (x, then h) are first rounded to bf16 as the bf16 kernels round them, so the products see the
// same inputs. Per row and 128-column block with the power-of-two scale s of fake_quantize's kFp8Ue8m0 (the block's
// largest magnitude over s within 448), v / s = hi + lo / 16 with hi = e4m3(v / s) and lo = e4m3(16 (v / s - hi)),
// both rounded to nearest: bf16's 8 significant bits are 4 in hi and at most 4 in the residual, so the sum is exact
// for every element whose v / s is at least 2^-6 (within ~2^-14.8 of the block's largest); smaller ones keep an error
// below 2^-14 s. B row 2 t is token t's hi codes, row 2 t + 1 its lo codes; their activation scales are s and s / 16,
// so that the per-block promotion (acc += block x scale, as experts_fp8.cu does it) sums both into two accumulator
// columns a lane holds side by side (wgmma's column 2 c and 2 c + 1), added in the epilogue.
//
// Numerics against the bf16 kernels: the same bf16 inputs and exact weights; an FP8 wgmma sums a 128-k block's
// products with reduced precision (promoted into fp32 every block, as DeepGEMM does), ~1e-4 relative, and the
// h roundings that noise tips (cuda_routed_experts_test bounds both).
//
// Layout. Persistent CTAs of 640 threads: 4 consumer warpgroups (112 registers), one A slice of 64 weight rows each,
// and a producer warpgroup (32). A stage is kUnits = 2 blocks of 128 k behind one full and one empty barrier, so that
// each weight row is read as one 128-byte run (bench/results/hbm_row_segments_*: 64-byte runs cap the HBM at ~59% of
// its rate); each block holds B (up to kMaxN split rows x 128 codes by one bulk tensor copy under the 128-byte
// swizzle), the 4 slices' FP4 bytes (64 a row) and the split rows' activation scales; the E8M0 bytes of a pair of
// stages sit in a small ring of their own (kScaleSlots). A consumer decodes block u + 1's A fragments while block u's
// 4 wgmmas run, then promotes block u.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/experts_fp8_common.cuh"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/tma.h"
#include "backend/cuda/wgmma_common.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;  // the mbarrier, fence and descriptor helpers (wgmma_common.cuh)
using fp8x::k8perm;
using fp8x::kSpan;
using fp8x::kTableRows;
using fp8x::slice_row;

constexpr int kBK = 128;        // k per block: one activation scale block, one wgmma chain before its promotion
constexpr int kUnits = 2;       // blocks a stage: a weight row's 128-byte run
constexpr int kSliceRows = 64;  // weight rows per A slice (wgmma M)
constexpr int kWgs = 4;         // consumer warpgroups, one A slice each
constexpr int kMaxN = 2 * kFp8DecodeTileTokens;  // B rows a tile: each slot's hi and lo rows
constexpr int kStages = 5;
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 128 * kWgs;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegs = 32, kConsumerRegs = 112;  // 4 x 112 + 32 = 5 x 96 (launch bounds at 640 threads)
constexpr int kGateUpFeatures = 32 * kWgs;              // 128, as experts_wgmma.cu's decode plan cuts them
constexpr int kDownFeatures = kSliceRows * kWgs;        // 256

constexpr int kBBytes = kMaxN * kBK;                // split rows x 128 codes
constexpr int kSliceWBytes = kSliceRows * kBK / 2;  // 4096: 64 rows x 64 bytes of FP4
constexpr int kWBytes = kWgs * kSliceWBytes;
constexpr int kXsBytes = kMaxN * 4;  // the split rows' activation scales for the block
constexpr int kUnitBytes = (kBBytes + kWBytes + kXsBytes + 1023) / 1024 * 1024;
constexpr int kStageBytes = kUnits * kUnitBytes;
constexpr int kRingBytes = kStages * kStageBytes;
// The E8M0 bytes of two stages (16 a weight row: 4 blocks x 4 groups of 32) in a ring of their own, slot
// (stage / 2) % kScaleSlots, copied with the pair's first stage and covered by its full barrier. A slot is refilled
// when the pair kScaleSlots on begins, after the producer has waited for the release of the stage kStages before it:
// that is the old pair's second stage or later when 2 kScaleSlots >= kStages + 1.
constexpr int kScaleSlots = 3;
constexpr int kPairScaleBytes = kWgs * kSliceRows * 16;
static_assert(2 * kScaleSlots >= kStages + 1, "a scale slot outlives its pair's stages");
constexpr int kSmemBytes = 1024 + kRingBytes + kScaleSlots * kPairScaleBytes + kTableRows * 8 + 2 * kStages * 8;
static_assert(kSmemBytes <= 227 * 1024, "one CTA's shared memory");
static_assert(kWgs * kConsumerRegs + kProducerRegs <= (kWgs + 1) * (65536 / kThreads / 8 * 8), "register file");
static_assert(kMaxN == 32, "B tiles of 16 or 32 split rows (tile_width)");

using Tile = ExpertTile;  // rows: 1 .. kFp8DecodeTileTokens slots

struct Params {
    TileWidthMaps act_maps;  // B: 128-byte boxes over act [2 R, k] codes
    const Tile* tiles;
    const int* tile_count;  // the number of tiles, in device memory (the device plan's)
    const ExpertsFp8Ptrs* experts;
    const float* act_scale;  // [k / 128, 2 R] (+ kMaxN slack: a tile's scales are loaded whole)
    int64_t split_rows;      // 2 R
    float* h;                // gate/up: h [R, out_cols] f32, natural column order
    float* const* out_rows;  // down: slot r's output row
    int k, out_cols;
    float limit;  // SwiGLU clamp (gate/up; 0: none)
};

// The producer: fixed roles per thread pt across stages. B: thread 0, one bulk tensor copy a block (rows past 2 R are
// zeros, other tiles' rows are never stored), counted on the full barrier beside the cp.async arrivals. W: 16-byte
// chunk ch = pt % 8 of the 128-byte run (block ch / 4, chunk ch % 4 of its 64 bytes) of rows rr + 16 j (rr = pt / 8,
// j = 0..3) of every slice, 8 consecutive threads one row's run; those rows are one matrix a thread (slice_row:
// gate/up rows 8 j apart, 32 a slice; down 16 j apart, 64 a slice). E8M0 bytes, with a pair's first stage: the 16 of
// row pt % 64 of slices pt / 64 and pt / 64 + 2. (Four bytes a row a block, one copy each, were the op's limit:
// 512 requests of one 32-byte sector a stage beside the weights' 1,024 sectors; H200, 32 tokens: 677 us with them,
// 513 with the scale copies left out.) Activation scales: split row pt of the tile (pt < kMaxN).
template <bool kGateUp>
__device__ __forceinline__ void produce(const Params& p, const Tile& t, uint32_t ring, uint32_t bars, unsigned it) {
    const int pt = threadIdx.x - kConsumerThreads;
    const ExpertsFp8Ptrs& e = p.experts[t.expert];
    const int k = p.k, ns = k / (kUnits * kBK);
    const int n_load = tile_width(2 * t.rows), b_row0 = 2 * t.row0;
    const int ch = pt & 7, rr = pt >> 3;
    int which, row;
    slice_row<kGateUp>(t.feature0, 0, rr, which, row);
    const int64_t row_bytes = k / 2;
    const uint8_t* wd = e.data[which] + row * row_bytes + ch * 16;
    const int64_t j_step = (kGateUp ? 8 : 16) * row_bytes, sl_step = (kGateUp ? 32 : 64) * row_bytes;
    const uint32_t w_dst = static_cast<uint32_t>((ch >> 2) * kUnitBytes + kBBytes + rr * 64 + (ch & 3) * 16);
    const int s_row = pt & 63, s_sl = pt >> 6;
    int s_which, s_r;
    slice_row<kGateUp>(t.feature0, s_sl, s_row, s_which, s_r);
    const uint8_t* s_src = e.scale[s_which] + static_cast<int64_t>(s_r) * (k / 32);
    const int64_t s_far = (kGateUp ? 64 : 128) * (k / 32);  // slice s_sl + 2's row: 64 or 128 rows on, one matrix
    const uint32_t s_dst = static_cast<uint32_t>(kRingBytes + (s_sl * kSliceRows + s_row) * 16);
    const float* x_src = p.act_scale + b_row0 + pt;
    const uint32_t x_dst = static_cast<uint32_t>(kBBytes + kWBytes + pt * 4);
    const CUtensorMap* map = &p.act_maps.map[tma::tile_width_map(n_load)];
#pragma unroll 1
    for (int kb = 0; kb < ns; ++kb) {
        const unsigned s = it + kb, st = s % kStages;
        mbar_wait(bars + 8 * (kStages + st), ((s / kStages) & 1) ^ 1);  // the first round passes at once
        const uint32_t sb = ring + st * kStageBytes;
        if (pt == 0) {
            tma::mbar_expect_tx(bars + 8 * st, static_cast<uint32_t>(kUnits * n_load * kBK));
#pragma unroll
            for (int u = 0; u < kUnits; ++u)
                tma::load_2d(sb + u * kUnitBytes, map, (kUnits * kb + u) * kBK, b_row0, bars + 8 * st);
        }
        const uint8_t* src = wd;
#pragma unroll
        for (int sl = 0; sl < kWgs; ++sl, src += sl_step - 4 * j_step)
#pragma unroll
            for (int j = 0; j < 4; ++j, src += j_step)
                mma::cp_async16(sb + w_dst + sl * kSliceWBytes + j * 16 * 64, src, 16);
        if (kb % 2 == 0) {  // the pair's scales (it is even: tiles have an even number of stages)
            const uint32_t slot = ring + ((s / 2) % kScaleSlots) * kPairScaleBytes;
            mma::cp_async16(slot + s_dst, s_src, 16);
            mma::cp_async16(slot + s_dst + 2 * kSliceRows * 16, s_src + s_far, 16);
            s_src += 2 * kUnits * kBK / 32;
        }
        if (pt < kMaxN) {
#pragma unroll
            for (int u = 0; u < kUnits; ++u)
                mma::cp_async4(sb + u * kUnitBytes + x_dst, x_src + (kUnits * kb + u) * p.split_rows);
        }
        wd += kUnits * kBK / 2;
        cp_async_arrive_noinc(bars + 8 * st);
    }
}

// A consumer lane's A fragments of block u (the CTA's block count), decoded once its stage has landed (the first block
// of a stage waits for it): rows arow and arow + 8 of slice wg, FP4 chunk c. ref_idx[h] = kSpan - the largest E8M0
// byte of row arow + 8 h, so that table row e + ref_idx[h] is the row of d = e - ref.
__device__ __forceinline__ void decode_a(unsigned u, uint32_t (&a)[4][4], const uint8_t* ring_ptr, uint32_t bars,
                                         const uint2* table, int wg, int arow, int c, const int (&ref_idx)[2]) {
    const unsigned s = u / kUnits, st = s % kStages;
    if (u % kUnits == 0) mbar_wait(bars + 8 * st, (s / kStages) & 1);  // B by TMA: no proxy fence
    const uint8_t* ub = ring_ptr + st * kStageBytes + (u % kUnits) * kUnitBytes;
    const uint8_t* sw = ub + kBBytes + wg * kSliceWBytes;
    // the pair's scale slot, this slice's rows (16 bytes each), this block's 4 groups
    const uint8_t* ss = ring_ptr + kRingBytes + (u / (2 * kUnits)) % kScaleSlots * kPairScaleBytes +
                        wg * kSliceRows * 16 + (u % (2 * kUnits)) * 4;
    fp8x::decode_fragments(sw, ss, 16, table, arow, c, ref_idx, a);
}

// Block u of a consumer warpgroup, its A fragments decoded (a): 4 wgmma steps into the block accumulator; while they
// run, block u + 1's A decoded into a_next (when `next`); then the promotion into acc times the split rows' scales,
// and the stage handed back after its last block.
template <int N>
__device__ __forceinline__ void mma_block(unsigned u, bool next, float (&acc)[N / 2], float (&blk)[N / 2],
                                          uint32_t (&a)[4][4], uint32_t (&a_next)[4][4], const uint8_t* ring_ptr,
                                          uint32_t ring, uint32_t bars, const uint2* table, int wg, int arow, int c,
                                          const int (&ref_idx)[2]) {
    const unsigned st = (u / kUnits) % kStages;
    const uint32_t ub_off = st * kStageBytes + (u % kUnits) * kUnitBytes;
    // the scales of split rows 8 j + 2 c (hi) and 8 j + 2 c + 1 (lo): one token's
    fp8x::block_products<N>(acc, blk, a, ring + ub_off,
                            reinterpret_cast<const float*>(ring_ptr + ub_off + kBBytes + kWBytes), c, [&] {
                                if (next) decode_a(u + 1, a_next, ring_ptr, bars, table, wg, arow, c, ref_idx);
                            });
    if (u % kUnits == kUnits - 1) mbar_arrive(bars + 8 * (kStages + st));  // the stage is read
}

// One tile of a consumer warpgroup; `it`: the CTA's stages before this tile. d[4 j + v] is weight row g + 8 (v >> 1) of
// the warp's 16 and split row 8 j + 2 c + (v & 1), i.e. token 4 j + c's hi (v even) or lo part. Gate/up: rows g and
// g + 8 are the gate and up rows of the lane's feature f0 + 32 wg + 8 wl + g; down: rows f0 + 64 wg + arow, + 8.
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
    float acc[N / 2], blk[N / 2];
    fp8x::clear_accumulators<N>(acc, blk);
    const unsigned nu = static_cast<unsigned>(p.k / kBK), u0 = it * kUnits;  // nu even (k % 256 == 0)
    // Two sets of A fragments taking turns (see experts_fp8.cu's consume).
    uint32_t a0[4][4], a1[4][4];
    decode_a(u0, a0, ring_ptr, bars, table, wg, arow, c, ref_idx);
#pragma unroll 1
    for (unsigned ub = 0; ub < nu; ub += 2) {
        mma_block<N>(u0 + ub, true, acc, blk, a0, a1, ring_ptr, ring, bars, table, wg, arow, c, ref_idx);
        mma_block<N>(u0 + ub + 1, ub + 2 < nu, acc, blk, a1, a0, ring_ptr, ring, bars, table, wg, arow, c, ref_idx);
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const int n = 4 * j + c;  // the token (slot) within the tile
        if (n >= t.rows) continue;
        // weight rows arow and arow + 8 (gate/up: the feature's gate and up), hi + lo parts
        const float row_g = __fmul_rn(acc[4 * j + 0] + acc[4 * j + 1], post[0]);
        const float row_g8 = __fmul_rn(acc[4 * j + 2] + acc[4 * j + 3], post[1]);
        if constexpr (kGateUp) {
            p.h[static_cast<int64_t>(t.row0 + n) * p.out_cols + t.feature0 + 32 * wg + 8 * wl + g] =
                swiglu_value(row_g, row_g8, p.limit);
        } else {
            float* out = p.out_rows[t.row0 + n] + t.feature0 + 64 * wg + arow;
            out[0] = row_g;
            out[8] = row_g8;
        }
    }
}

// Persistent: CTA b takes tiles b, b + gridDim.x, ...; the ring and its barrier phases run on across tiles.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1) experts_fp8_decode_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // built for another architecture: experts_fp8_shapes_ok() keeps callers away
#else
    pdl_prologue();  // see pdl.cuh
    extern __shared__ uint8_t smem_raw[];
    uint8_t* ring_ptr = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);
    uint2* table = reinterpret_cast<uint2*>(ring_ptr + kRingBytes + kScaleSlots * kPairScaleBytes);
    const uint32_t ring = mma::smem_addr(ring_ptr);
    const uint32_t bars = ring + kRingBytes + kScaleSlots * kPairScaleBytes + kTableRows * 8;
    // full: the producer threads' cp.async arrivals (and the bulk copies' bytes); empty: every consumer thread
    if (threadIdx.x == 0) mbar_init_ring(bars, kStages, kProducerThreads, kConsumerThreads);
    fp8x::fill_e4m3_table(reinterpret_cast<uint8_t*>(table), threadIdx.x);
    __syncthreads();
    const unsigned ns = static_cast<unsigned>(p.k / (kUnits * kBK));
    const int num_tiles = *p.tile_count;
    if (threadIdx.x >= kConsumerThreads) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        unsigned it = 0;
        for (int i = blockIdx.x; i < num_tiles; i += gridDim.x, it += ns)
            produce<kGateUp>(p, p.tiles[i], ring, bars, it);
        mma::cp_async_wait_all();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    unsigned it = 0;
    for (int i = blockIdx.x; i < num_tiles; i += gridDim.x, it += ns) {
        const Tile t = p.tiles[i];
        if (2 * t.rows > 16)
            consume<32, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
        else
            consume<16, kGateUp>(p, t, ring_ptr, ring, bars, table, it);
    }
#endif
}

// One warp per (slot row r, 128-column block b): the lane's 4 consecutive real columns k8perm(4 l) .. (in_rows[r] if
// set, else x + r k) rounded to bf16, split as the header says into split rows 2 r (hi) and 2 r + 1 (lo) of q
// [2 rows, k] (stored positions 4 l .. 4 l + 3), their scales s and s / 16 at s_out[b * 2 rows + 2 r (+ 1)]. A block
// holding a NaN or an infinity gets a NaN scale (its products, like the bf16 kernels', NaN). Warp 0 also zeroes the
// kMaxN floats of slack past s_out's end (read by the last block's tiles, never used).
__global__ void split_k8perm_kernel(uint8_t* __restrict__ q, float* __restrict__ s_out, const float* __restrict__ x,
                                    const float* const* __restrict__ in_rows, int64_t rows, int k) {
    pdl_prologue();  // see pdl.cuh
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, blocks = k / kBK;
    if (warp == 0) s_out[blocks * 2 * rows + lane] = 0.0f;
    static_assert(kMaxN == 32, "one slack float a lane");
    if (warp >= rows * blocks) return;
    const int64_t r = warp / blocks;
    const int b = static_cast<int>(warp % blocks);
    const float* row = in_rows ? in_rows[r] : x + r * k;
    const float4 v4 = __ldg(reinterpret_cast<const float4*>(row + b * kBK + k8perm(4 * lane)));
    float v[4] = {v4.x, v4.y, v4.z, v4.w};
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
        amax = fmaxf(amax, fabsf(v[i]));
        finite = finite && isfinite(v[i]);
    }
    const float s = fp8_block_scale(warp_max(amax));
    const float inv = pow2_reciprocal(s);
    float y[4];  // within +-448: s is the block's scale
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = finite ? v[i] * inv : 0.0f;
    const E4m3Split split = split_e4m3_quad(y);
    reinterpret_cast<uint32_t*>(q + (2 * r) * k + b * kBK)[lane] = split.hi;
    reinterpret_cast<uint32_t*>(q + (2 * r + 1) * k + b * kBK)[lane] = split.lo;
    const bool all_finite = __all_sync(0xffffffffu, finite);
    if (lane == 0) {
        const float scale = all_finite ? s : __int_as_float(0x7fc00000);
        s_out[b * 2 * rows + 2 * r] = scale;
        s_out[b * 2 * rows + 2 * r + 1] = scale * 0.0625f;
    }
}

void launch_split(uint8_t* q, float* s, const float* x, const float* const* in_rows, int64_t rows, int64_t k,
                  cudaStream_t stream) {
    const int64_t threads = std::max<int64_t>(rows * (k / kBK), 1) * 32;
    launch_pdl(split_k8perm_kernel, static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream, q, s, x, in_rows,
               rows, static_cast<int>(k));
    DI_CUDA_LAUNCH_CHECK();
}

template <bool kGateUp>
void launch_tiles(const Params& p, int64_t max_tiles, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};
    allow_smem(experts_fp8_decode_kernel<kGateUp>, kSmemBytes, configured);
    if (max_tiles == 0) return;
    const int grid = static_cast<int>(std::min<int64_t>(max_tiles, device_sm_count()));
    launch_pdl(experts_fp8_decode_kernel<kGateUp>, grid, kThreads, kSmemBytes, stream, p);
    DI_CUDA_LAUNCH_CHECK();
}

// k a multiple of 512: a row's scales are 16-byte chunks of two stages.
bool shapes_ok(int64_t d, int64_t inter) {
    return d % kDownFeatures == 0 && inter % kGateUpFeatures == 0 && d % (2 * kUnits * kBK) == 0 &&
           inter % (2 * kUnits * kBK) == 0;
}

}  // namespace

bool experts_fp8_decode_applies(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts) {
    if (num_experts <= 0 || !shapes_ok(w1[0].cols, w1[0].rows)) return false;
    for (const WeightDesc* list : {w1, w3, w2})
        for (int e = 0; e < num_experts; ++e)
            if (reinterpret_cast<uintptr_t>(list[e].scale) % 16 != 0) return false;
    return true;
}

void launch_experts_fp8_decode(const Fp8DecodePlan& plan, int64_t rows, const void* fp8_table, int64_t d, int64_t inter,
                               float swiglu_limit, cudaStream_t stream) {
    DI_ICHECK(shapes_ok(d, inter) && rows > 0 && rows < (int64_t{1} << 29), "experts_fp8_decode: D ", d, ", I ", inter,
              ", ", rows, " slots");
    // One stream-ordered scratch: [xq: 2R x D codes] [hq: 2R x I] [h: R x I f32] [sx: (D / 128) 2R + kMaxN f32] [sh]
    const auto up16 = [](int64_t b) { return ceil_div(b, 16) * 16; };
    const int64_t at_hq = up16(2 * rows * d), at_h = at_hq + up16(2 * rows * inter), at_sx = at_h + rows * inter * 4;
    const int64_t at_sh = at_sx + up16((d / kBK * 2 * rows + kMaxN) * 4);
    const int64_t end = at_sh + (inter / kBK * 2 * rows + kMaxN) * 4;
    uint8_t* ws = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), static_cast<size_t>(end), stream));
    uint8_t *xq = ws, *hq = ws + at_hq;
    float* h = reinterpret_cast<float*>(ws + at_h);
    float* sx = reinterpret_cast<float*>(ws + at_sx);
    float* sh = reinterpret_cast<float*>(ws + at_sh);
    launch_split(xq, sx, nullptr, plan.in_rows, rows, d, stream);

    Params p{};
    p.experts = static_cast<const ExpertsFp8Ptrs*>(fp8_table);
    p.act_maps = tma_tile_width_maps(xq, static_cast<uint64_t>(2 * rows), static_cast<uint64_t>(d), kBK);
    p.tiles = plan.tiles1;
    p.tile_count = plan.tile_count;
    p.act_scale = sx;
    p.split_rows = 2 * rows;
    p.h = h;
    p.k = static_cast<int>(d);
    p.out_cols = static_cast<int>(inter);
    p.limit = swiglu_limit;
    launch_tiles<true>(p, plan.max_tiles1, stream);

    launch_split(hq, sh, h, nullptr, rows, inter, stream);
    p.act_maps = tma_tile_width_maps(hq, static_cast<uint64_t>(2 * rows), static_cast<uint64_t>(inter), kBK);
    p.tiles = plan.tiles2;
    p.tile_count = plan.tile_count + 1;
    p.act_scale = sh;
    p.h = nullptr;
    p.out_rows = plan.out_rows;
    p.k = static_cast<int>(inter);
    p.out_cols = static_cast<int>(d);
    launch_tiles<false>(p, plan.max_tiles2, stream);
    DI_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace deepinfer::cuda
