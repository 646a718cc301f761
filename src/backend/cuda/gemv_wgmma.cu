// Products of 2..128 activation rows with FP8 weights (e4m3, 128 x 128 block scales, E8M0 or f32) on Hopper wgmma:
// the decode GEMV of the attention projections (and of the shared expert). out[t, n] = sum_k x[t, k] W[w_row0 + n, k],
// the numerics of gemv_tc.cu: x rounded to bf16 once (nearest even), each weight dequantized to bf16(fp8 * scale)
// (exact with E8M0 scales; f32 scales round as chunk_to_bf16 does), fp32 accumulation. Measured on an H200
// (bench/results/gemv_wgmma_run22, 8 / 32 rows): wq_a 11.1 / 12.4 us, wkv 10.9 / 12.4, wq_b 16.5 / 18.1, wo_b 20.6 /
// 23.7, wo_a 20.0 / 23.0: the large ones at 33-48% of the HBM rate, every call ~10 us above its bytes' time (the cost
// model below expected ~3 us). ncu inside a decode step (bench/results/gemv_wgmma_ncu_run26): the xb launch ~2.9 us,
// the rest inside the product kernel (0.6-2.0 TB/s); launches of several waves take longer than the model says.
// Now (bench/results/gemv_wgmma_plans_run27, 8 / 32 rows): wq_b 13.0 / 14.4 us, wo_b 16.3 / 19.4, wo_a 16.0 / 18.6
// (41-60% of the HBM rate). ncu (wo_b, 8 rows, source counters): the consumers are bound by their instructions (~600
// a warp per pair of stages, 256 of them the FP8 decode; ~30 GB/s an SM, so a launch needs every SM busy to approach
// the HBM rate), and the split launches' cluster barriers hold ~20% of the sampled warp time.
//
// Why: gemv_tc (mma.sync, activations as A) is bound by its instructions (~9 a weight per lane: activation fragment
// loads, moves, address math, a dequantizing FMUL and pack per weight) and streams the V4-Flash projections at
// 0.15-1.3 TB/s. Here the weights are the wgmma A operand (M = 64 weight rows a warpgroup), decoded from FP8 bytes in
// shared memory into bf16 fragments in registers with ~2 integer/bf16 instructions a weight, and the activations are
// B (N = 8, 16, 32 or 64 token rows, bf16 in shared memory through a descriptor; more than 64 rows take a launch per
// 64, each reading the weights again), so the tensor cores do the rest. At N = 64 the consumers' accumulators need more
// registers than 640 threads get, so the producer warpgroup hands some over (setmaxnreg). Above 32 rows this replaces
// the mma.sync GEMM and, at 128, cuBLAS on a dequantized copy (H200, 8-layer decode step, uniform routing: batch 48
// 12.8 -> 10.7 ms, 64 13.96 -> 11.8, 96 17.0 -> 14.6, 128 16.3 -> 15.2).
//
// Two launches on the stream:
//  0. xb [rows, K] bf16 per distinct x of the launch = x rounded to nearest even, k permuted inside each 128-block
//     (below), in stream-ordered scratch;
//  1. the products: CTAs of 640 threads, four consumer warpgroups and a producer warpgroup. The producer streams stages
//     of 128 k through an mbarrier ring (wgmma_common.cuh): the B tile (N token rows x 128 k bf16, K-major, 128-byte
//     swizzle, rows past `rows` zero-filled) and the A tile's FP8 bytes (kSlices slices of 64 weight rows x 128
//     bytes, each row's 16-byte chunk j stored at chunk j ^ (row % 8), so that a lane's 16-byte reads are free of bank
//     conflicts; rows past the job's n_out zero-filled). A tile is 64 kSlices weight rows: kSlices 4 (256 rows: each
//     consumer warpgroup one slice, all 8 k steps of a stage) or kSlices 2 (128 rows: warpgroup w takes slice w % 2
//     and the k steps 4 (w / 2) .. 4 (w / 2) + 3 of each stage, the two k halves added in a fixed order at the end).
//     Scales are read by the consumers from global memory (L1), one stage ahead.
//
// A fragments and the k permutation. In a stage, lane 4 g + c of a warp reads for its rows g and g + 8 the 32 bytes
// k 32 c .. 32 c + 31 (chunks 2 c and 2 c + 1; kSlices 2: only the chunk 2 c + w / 2 of its k half). Word u of them
// (k 32 c + 4 u .. + 3, bytes b0..b3) feeds wgmma step s = u: a0 / a1 = the pair (b0, b2) of rows g / g + 8, a2 / a3 =
// (b1, b3). The A fragment wants a0 = logical k 2c, 2c+1 and a2 = 2c+8, 2c+9 of the step, so logical k p (0..15) of
// step s is the real k kperm(16 s + p) (wgmma_common.cuh), and B is stored in that order: column q of each 128-block
// of xb holds x's column kperm(q).
//
// FP8 -> bf16 without conversion instructions (E8M0 scale byte e <= 134): a byte permute with sign replication puts
// the bytes b0, b2 (b1, b3) at the low ends of the two halves, sign-extended; << 4 and a mask leave the sign at bit
// 15 and the 7 low bits at bits 4..10, i.e. the bf16 bits of v 2^-120 exactly (e4m3 subnormals become bf16
// subnormals, also exact). One bf16x2 multiply by 2^(e - 7) gives v 2^(e - 127), exact in bf16. Other scales (f32,
// or E8M0 above 2^7 or NaN) take the conversion path of gemv_tc (cvt e4m3x2 -> f16x2 -> f32, FMUL, pack), warp by
// warp. The e4m3 NaN codes (0x7f, 0xff) decode on the fast path as +-480 times the scale, not NaN (FP8 quantizers
// saturate at +-448 and never write them).
//
// Work split: tiles = (job, 64 kSlices rows); splits S of K: CTA (split s, tile) reads k blocks s ceil(nkb / S) ..
// as one CTA of a thread-block cluster of S (S <= 8, portable). S = 1: persistent CTAs over tiles (blockIdx.y,
// + gridDim.y, ...), the ring and its barrier phases running on across tiles, results stored from the accumulators.
// S > 1: one tile a CTA; the partials go to shared memory (over the drained ring) and rank r of the cluster sums
// elements r, r + S, ... (in 512-element runs) over the ranks 0..S-1 (and k halves) in that order through
// distributed shared memory, then stores them: no atomics, the same order on every run. The host picks kSlices
// and S per launch (plan()): the fewest stage-slices on the busiest SM against the HBM-bound share, a cluster wave
// no larger than the device holds (cudaOccupancyMaxActiveClusters), ties to kSlices 4 (half the B bytes per weight
// byte of kSlices 2) and to fewer splits.
//
// Cost model, UNMEASURED (H200: 132 SMs, ~4.3 TB/s HBM, ~1.9 GHz; 1 CTA an SM):
//  - bytes: the weight once from HBM (plus 1/16384 of scales); B from L2: N x 256 bytes a stage against 8 KB a
//    weight slice (32 rows: 0.25 of the weight bytes at kSlices 4, 0.5 at kSlices 2); xb written and read once.
//  - in flight: a stage is 32 KB (kSlices 4) or 16 KB (2) of weights; the ring holds 5-6 resp. 8-12 stages (all of
//    227 KB but the k halves' reduction buffer), 128-192 KB an SM, 17-25 MB on 132 SMs against the 6-9 MB that
//    4.3 TB/s needs at a loaded latency of 1.5-2 us.
//  - issue: a consumer lane's stage (64 weights of 2 rows, kSlices 4) is 4 ld.shared.v4, 32 pairs x 4 instructions
//    (prmt, shl, and, mul.bf16x2), 8 wgmma m64nNk16 and ~30 of barrier, descriptor and scale work: ~2.7
//    instructions a weight (gemv_tc: ~9). 16 consumer warps an SM issue ~2900 warp instructions per 32 KB stage,
//    which the HBM delivers to an SM every ~1900 cycles at its fair share: ~1.5 of 4 issue slots a cycle.
//  - fixed: two launches (~1.5 us for the prologue and its gap), the ring's first fill (~1.5-2 us), the epilogue or
//    cluster reduction (32 rows: 33 KB of partials a CTA, ~0.5 us).
//  - plans and expected us at 8 / 32 rows (gemv_tc measured, bench/results/gemv_tc_run21: 8 / 32 rows):
//      wq_a [1024 x 4096]  kSlices 2, 8 tiles x S 8 = 64 CTAs of 4 stages      ~4.5 / ~5.5  (10.7 / 17.7)
//      wkv  [512 x 4096]   kSlices 2, 4 tiles x S 8 = 32 CTAs of 4 stages      ~4   / ~5    (8.5 / 14.0)
//      wq_b [32768 x 1024] kSlices 4, 128 tiles, S 1 = 128 CTAs of 8 stages    ~11  / ~12   (26.0 / 45.1)
//      wo_b [4096 x 8192]  kSlices 4, 16 tiles x S 8 = 128 CTAs of 8 stages    ~11  / ~12   (40.3 / 69.3)
//      wo_a 8 x [1024 x 4096] kSlices 4, 32 tiles x S 4 = 128 CTAs of 8 stages ~12  / ~13   (26.8 / 70.8)
//    the large ones at ~3.8 TB/s plus ~3 us fixed, the small ones mostly fixed cost.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/gemv_wgmma.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/wgmma_common.cuh"

namespace deepinfer::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace wgmma;  // mbarriers, fences, descriptors, Wgmma<N>

constexpr int kBK = 128;                                       // k per stage (one scale block)
constexpr int kSliceRows = 64;                                 // weight rows per A slice (wgmma M)
constexpr int kSliceBytes = kSliceRows * kBK;                  // 8192 FP8 bytes
constexpr int kConsumerGroups = 4;                             // consumer warpgroups
constexpr int kConsumerThreads = 128 * kConsumerGroups;        // 512
constexpr int kProducerThreads = 128;                          // one warpgroup
constexpr int kThreads = kConsumerThreads + kProducerThreads;  // 640: 96 registers a thread at most
// Registers a thread after setmaxnreg where an instantiation moves them (Geometry::kMoveRegs): 4 x 112 + 32 = 5 x 96,
// the 96 being what ptxas gives each of kThreads threads under __launch_bounds__(kThreads, 1).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kConsumerRegs = 112, kProducerRegs = 32;
static_assert(kConsumerGroups * kConsumerRegs + kProducerRegs <= (kConsumerGroups + 1) * kLaunchRegs, "register file");
constexpr int kMinRows = 2, kMaxRows = 128;
constexpr int kMaxWidth = 64;       // token rows a launch at most (wgmma N); more rows take a launch per 64
constexpr int kMaxJobs = 8;         // products per launch
constexpr int kMaxSplits = 8;       // K splits: a portable cluster
constexpr int kMaxStages = 12;      // ring stages at most
constexpr int kPad = 4;             // floats of padding per row of the reduction buffers (8 c + g: no bank conflicts)
constexpr int kFastScaleMax = 134;  // E8M0 bytes whose 2^(e - 7) is a normal bf16 (the fast decode)
// Named barriers of the 512 consumer threads (0 is __syncthreads): the k halves' reduction buffer holds warpgroup
// half 1's sums / may be written again; every consumer warpgroup is done with the ring.
constexpr int kBarRedFull = 1, kBarRedFree = 2, kBarDrained = 3;
constexpr int kSmemLimit = 227 * 1024;

// Shared memory of an instantiation: [1024-byte alignment slack] [ring: kStages x (B | A slices)] [full[kStages]
// empty[kStages] mbarriers] [k halves' reduction buffer, kSlices 2 only]. The cluster partials overlay the ring.
template <int N, int Slices>
struct Geometry {
    static constexpr int kN = N, kSlices = Slices;
    static constexpr int kParts = kConsumerGroups / Slices;  // warpgroups sharing a slice, each a part of a stage's k
    static constexpr int kTileRows = kSliceRows * Slices;
    static constexpr int kColBlockBytes = N * 128;  // one 64-wide k column block of B: N rows of 128 bytes
    static constexpr int kBBytes = 2 * kColBlockBytes;
    static constexpr int kStageBytes = kBBytes + Slices * kSliceBytes;
    static constexpr int kRedStride = kTileRows + kPad;  // floats per token row of the reduction buffers
    static constexpr int kRedBytes = kParts > 1 ? 4 * N* kRedStride : 0;
    static constexpr int kFixedBytes = 1024 + 2 * kMaxStages * 8 + kRedBytes;
    static constexpr int kStages =
        (kSmemLimit - kFixedBytes) / kStageBytes < kMaxStages ? (kSmemLimit - kFixedBytes) / kStageBytes : kMaxStages;
    static constexpr int kRingBytes = kStages * kStageBytes;
    static constexpr int kSmemBytes = 1024 + kRingBytes + 2 * kStages * 8 + kRedBytes;
    static constexpr int kPartBytes = 4 * kParts * N * kRedStride;  // cluster partials [kParts][N][kRedStride]
    // N = 64: 32 accumulators a consumer thread, with its weight fragments and addresses, do not fit in the 96
    // registers a thread of 640 gets (ptxas spilled), so the producer warpgroup gives some of its to them (setmaxnreg).
    static constexpr bool kMoveRegs = N == 64;
    static_assert(N == 8 || N == 16 || N == 32 || N == 64, "a wgmma width of whole 8-row swizzle atoms");
    static_assert(kParts == 1 || kParts == 2, "a warpgroup reads one or two of a lane's 16-byte chunks a row");
    static_assert(kStageBytes % 1024 == 0, "stages keep the 128-byte swizzle atoms 1024-byte aligned");
    static_assert(kStages >= 4 && kSmemBytes <= kSmemLimit, "one CTA's shared memory");
    static_assert(kPartBytes <= kRingBytes, "the cluster partials fit over the drained ring");
};

struct WgJob {
    const uint8_t* data;   // FP8 [w rows, k]
    const uint8_t* scale;  // [ceil(w rows / 128), scale_cols] E8M0 bytes or f32
    const uint16_t* xb;    // [rows, k] bf16 bits, k permuted per 128-block
    float* out;            // [rows, ldc] f32
    int64_t ldc, w_row0, n_out;
    int tile0;  // the job's first tile of the launch
};
struct WgParams {
    WgJob jobs[kMaxJobs];
    int num_jobs, tiles, rows;
    int nkb;           // k blocks of 128
    int kb_per_split;  // k blocks a split (the last ones may have fewer, or none)
    int scale_f32;
    int64_t k, scale_cols;
};

// The consumer lane's place: slice, k part (kParts 2), g = lane / 4, c = lane % 4, its first row within the slice.
struct LanePos {
    int sl, q, g, c, r0;
};

// A stage's dequantization constants for the lane's two rows (g and g + 8), from their raw scale bits.
struct StageScales {
    uint32_t mul[2];  // fast: bf16 pairs of 2^(e - 7)
    uint32_t raw[2];  // the scale bits (the slow decode converts them)
    bool f32;         // raw holds f32 scales
    bool fast;        // the whole warp on the fast decode
    // The scale of row h as f32, for the slow decode only (the fast one never pays for the conversion).
    __device__ __forceinline__ float f(int h) const {
        return f32 ? __uint_as_float(raw[h]) : e8m0_to_f32(static_cast<uint8_t>(raw[h]));
    }
};

__device__ __forceinline__ uint32_t load_scale(const uint8_t* at, int scale_f32) {
    return scale_f32 ? __ldg(reinterpret_cast<const uint32_t*>(at)) : __ldg(at);
}

__device__ __forceinline__ StageScales stage_scales(const uint32_t (&raw)[2], int scale_f32) {
    StageScales s;
    const bool fast = !scale_f32 && raw[0] <= kFastScaleMax && raw[1] <= kFastScaleMax;
    s.fast = __all_sync(0xffffffffu, fast);
    s.f32 = scale_f32 != 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        s.mul[h] = (raw[h] + 120u) * 0x00800080u;  // bf16 exponent e - 7 + 127 in both halves
        s.raw[h] = raw[h];
    }
    return s;
}

// Word wd (e4m3 bytes b0..b3) as the bf16 pairs e = (b0, b2), o = (b1, b3), each times its scale. Fast: see the
// header comment (exact for E8M0 up to 2^7); slow: gemv_tc's chunk_to_bf16 arithmetic.
template <bool kFast>
__device__ __forceinline__ void decode_word(uint32_t wd, uint32_t mul, float f, uint32_t& e, uint32_t& o) {
    if constexpr (kFast) {
        constexpr uint32_t kMask = 0x87f087f0u;  // sign at bit 15, the 7 value bits at 4..10, of both halves
        e = chunks::mul_bf16x2((chunks::byte_perm(wd, 0u, 0xa280u) << 4) & kMask, mul);  // b0, sext, b2, sext
        o = chunks::mul_bf16x2((chunks::byte_perm(wd, 0u, 0xb391u) << 4) & kMask, mul);  // b1, sext, b3, sext
    } else {
        const float2 lo = chunks::e4m3x2_to_float2(wd), hi = chunks::e4m3x2_to_float2(wd >> 16);
        e = mma::pack_bf16(lo.x * f, hi.x * f);
        o = mma::pack_bf16(lo.y * f, hi.y * f);
    }
}

// The A fragments of words u and u + 1 (wgmma steps s0 + u, s0 + u + 1) of the lane's two rows.
template <bool kFast, int kChunks>
__device__ __forceinline__ void decode_steps(const uint4 (&raw)[2][kChunks], int u, const StageScales& sc,
                                             uint32_t (&a)[2][4]) {
#pragma unroll
    for (int t2 = 0; t2 < 2; ++t2) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4 v = raw[h][(u + t2) >> 2];
            const uint32_t words[4] = {v.x, v.y, v.z, v.w};
            decode_word<kFast>(words[(u + t2) & 3], sc.mul[h], kFast ? 0.0f : sc.f(h), a[t2][h], a[t2][2 + h]);
        }
    }
}

// One 128-k stage of a consumer warpgroup: groups of 2 wgmmas (2 k steps), each group's A decoded while the previous
// group runs. kAfterOpen: the previous stage left its last group in flight (its buffers are handed back once that
// group is done); kClose: drain the pipeline and hand this stage back at the end (as experts_wgmma.cu's stage()).
template <class G, bool kAfterOpen, bool kClose>
__device__ __forceinline__ void stage(int it, float (&acc)[G::kN / 2], const LanePos& lp, const StageScales& sc,
                                      const uint8_t* ring_ptr, uint32_t ring, uint32_t bars) {
    constexpr int kChunks = 2 / G::kParts;  // 16-byte chunks a lane reads per row
    constexpr int kSteps = 8 / G::kParts;   // k steps of this warpgroup in the stage
    const int st = it % G::kStages;         // it: the CTA's stage count so far (tiles before this one included)
    mbar_wait(bars + 8 * st, (it / G::kStages) & 1);
    __syncwarp();
    fence_proxy_async();
    const uint8_t* w = ring_ptr + st * G::kStageBytes + G::kBBytes + lp.sl * kSliceBytes;
    uint4 raw[2][kChunks];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int cc = 0; cc < kChunks; ++cc) {
            const int j = G::kParts == 1 ? 2 * lp.c + cc : 2 * lp.c + lp.q;  // chunk of the row (k 16 j ..)
            raw[h][cc] = *reinterpret_cast<const uint4*>(w + (lp.r0 + 8 * h) * 128 + ((j ^ lp.g) << 4));
        }
    }
    // The stage's B descriptor once; a k step's is the same plus its offset in 16-byte units (the start address
    // field holds any shared address: < 2^18 bytes), so no step recomputes the address masks.
    const uint64_t d0 = b_desc(ring + st * G::kStageBytes);
    const uint32_t d0_lo = static_cast<uint32_t>(d0), d0_hi = static_cast<uint32_t>(d0 >> 32);
    const int s0 = lp.q * kSteps;
#pragma unroll
    for (int w2 = 0; w2 < kSteps / 2; ++w2) {
        uint32_t a[2][4];
        if (sc.fast)
            decode_steps<true>(raw, 2 * w2, sc, a);
        else
            decode_steps<false>(raw, 2 * w2, sc, a);
        __syncwarp();  // the warp's lanes agree on sc.fast; converged before the aligned wgmma instructions
        uint64_t desc[2];
#pragma unroll
        for (int t2 = 0; t2 < 2; ++t2) {
#pragma unroll
            for (int i = 0; i < 4; ++i) pin(a[t2][i]);  // defined before the fence, not sunk past it
            const int s = s0 + 2 * w2 + t2;
            const uint32_t step_lo = d0_lo + static_cast<uint32_t>(((s >> 2) * G::kColBlockBytes + (s & 3) * 32) >> 4);
            desc[t2] = (static_cast<uint64_t>(d0_hi) << 32) | step_lo;
            pin(desc[t2]);
        }
        wgmma_fence();
#pragma unroll
        for (int t2 = 0; t2 < 2; ++t2) Wgmma<G::kN>::mma(acc, a[t2][0], a[t2][1], a[t2][2], a[t2][3], desc[t2]);
        wgmma_commit();
        if (kClose && w2 == kSteps / 2 - 1) {
            wgmma_wait<0>();
            mbar_arrive(bars + 8 * (G::kStages + st));  // stage `it` read: hand it back to the producer
        } else {
            wgmma_wait<1>();  // the previous group is done: its A registers are free
            if (kAfterOpen && w2 == 0) mbar_arrive(bars + 8 * (G::kStages + (it - 1) % G::kStages));  // it - 1 read
        }
    }
}

// A stage with its scales: the constants from `raw` (this stage's scale bits), then the next stage's bits loaded
// into `raw` (one stage ahead of their use), then the products.
template <class G, bool kAfterOpen, bool kClose>
__device__ __forceinline__ void scaled_stage(int it, int kb, int kb_end, float (&acc)[G::kN / 2], const LanePos& lp,
                                             uint32_t (&raw)[2], const uint8_t* const (&srow)[2], int es,
                                             const uint8_t* ring_ptr, uint32_t ring, uint32_t bars) {
    const StageScales sc = stage_scales(raw, es == 4);
    if (kb + 1 < kb_end) {
#pragma unroll
        for (int h = 0; h < 2; ++h) raw[h] = load_scale(srow[h] + (kb + 1) * es, es == 4);
    }
    stage<G, kAfterOpen, kClose>(it, acc, lp, sc, ring_ptr, ring, bars);
}

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The shared::cluster address of `addr` (this CTA's shared memory) in cluster rank `rank`'s, and a load from one.
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ float ld_cluster(uint32_t addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

// The job of launch tile `tile` (tiles laid end to end in job order).
__device__ __forceinline__ const WgJob& job_of(const WgParams& p, int tile) {
    int j = 0;
    while (j + 1 < p.num_jobs && p.jobs[j + 1].tile0 <= tile) ++j;
    return p.jobs[j];
}

// The producer warpgroup: every tile's stages [kb0, kb0 + nk) into the ring. Fixed roles (pt = producer thread):
// W chunk ch = pt % 8 of tile rows pt / 8 + 16 i (a warp copies 4 whole 128-byte rows an instruction); B chunk kc =
// pt % 16 (8 stored columns) of token rows pt / 16 + 8 j, to column block kc / 8, atom row n, chunk (kc % 8) ^ (n % 8)
// (as experts_wgmma.cu's produce()). Rows past n_out (W) or `rows` (B) are zero-filled from a valid address.
template <class G>
__device__ __forceinline__ void produce(const WgParams& p, uint32_t ring, uint32_t bars, int kb0, int nk) {
    const int pt = threadIdx.x - kConsumerThreads;
    const int ch = pt & 7, wr = pt >> 3, kc = pt & 15, n0 = pt >> 4;
    const uint32_t w_dst = static_cast<uint32_t>(G::kBBytes + wr * 128 + ((ch ^ (wr & 7)) << 4));
    const uint32_t b_dst = static_cast<uint32_t>((kc >> 3) * G::kColBlockBytes + n0 * 128 + (((kc & 7) ^ n0) << 4));
    const int64_t k = p.k;
    int it = 0;
    for (int tile = blockIdx.y; tile < p.tiles; tile += gridDim.y, it += nk) {
        const WgJob& job = job_of(p, tile);
        const int64_t f0 = static_cast<int64_t>(tile - job.tile0) * G::kTileRows;
        const int64_t valid_rows = job.n_out - f0;  // tile rows below this are the job's
        const uint8_t* w_src = job.data + (job.w_row0 + f0 + wr) * k + kb0 * kBK + ch * 16;
        const uint16_t* b_src = job.xb + n0 * k + kb0 * kBK + kc * 8;
#pragma unroll 1
        for (int i = 0; i < nk; ++i) {
            const int st = (it + i) % G::kStages;
            mbar_wait(bars + 8 * (G::kStages + st), (((it + i) / G::kStages) & 1) ^ 1);  // round 0 passes at once
            const uint32_t sb = ring + st * G::kStageBytes;
#pragma unroll
            for (int j = 0; j < G::kN / 8; ++j) {
                const bool valid = n0 + 8 * j < p.rows;
                mma::cp_async16(sb + b_dst + 1024 * j, valid ? b_src + 8 * j * k : job.xb, valid ? 16 : 0);
            }
#pragma unroll
            for (int r = 0; r < 4 * G::kSlices; ++r) {
                const bool valid = wr + 16 * r < valid_rows;
                mma::cp_async16(sb + w_dst + 2048 * r, valid ? w_src + 16 * r * k : job.data, valid ? 16 : 0);
            }
            cp_async_arrive_noinc(bars + 8 * st);
            w_src += kBK;
            b_src += kBK;
        }
    }
}

// Stores the lane's sums of its tile: acc[4 j + v] is feature row r0 + 8 (v >> 1) of its slice, token 8 j + 2 c +
// (v & 1).
template <class G>
__device__ __forceinline__ void store_tile(const WgParams& p, const WgJob& job, int64_t f0, const LanePos& lp,
                                           const float (&acc)[G::kN / 2]) {
#pragma unroll
    for (int j = 0; j < G::kN / 8; ++j) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int t = 8 * j + 2 * lp.c + (v & 1);
            const int64_t f = f0 + kSliceRows * lp.sl + lp.r0 + 8 * (v >> 1);
            if (t < p.rows && f < job.n_out) job.out[t * job.ldc + f] = acc[4 * j + v];
        }
    }
}

// acc into buf[t][kRedStride] at the lane's tile rows (t: all N token rows).
template <class G>
__device__ __forceinline__ void acc_to_smem(float* buf, const LanePos& lp, const float (&acc)[G::kN / 2]) {
#pragma unroll
    for (int j = 0; j < G::kN / 8; ++j) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int t = 8 * j + 2 * lp.c + (v & 1), fl = kSliceRows * lp.sl + lp.r0 + 8 * (v >> 1);
            buf[t * G::kRedStride + fl] = acc[4 * j + v];
        }
    }
}

// The consumer warpgroups: every tile's stages, then its epilogue (see the header comment).
template <class G>
__device__ __forceinline__ void consume(const WgParams& p, uint8_t* ring_ptr, uint32_t ring, uint32_t bars, float* red,
                                        int kb0, int nk) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cw = warp >> 2;
    const LanePos lp{cw % G::kSlices, cw / G::kSlices, lane >> 2, lane & 3, 16 * (warp & 3) + (lane >> 2)};
    const int es = p.scale_f32 ? 4 : 1;  // bytes per scale
    const int splits = gridDim.x;
    int it = 0;
    for (int tile = blockIdx.y; tile < p.tiles; tile += gridDim.y, it += nk) {
        const WgJob& job = job_of(p, tile);
        const int64_t f0 = static_cast<int64_t>(tile - job.tile0) * G::kTileRows;
        // The scale rows of the lane's two weight rows (rows past n_out: the last one's, never stored).
        const uint8_t* srow[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t f = min(f0 + kSliceRows * lp.sl + lp.r0 + 8 * h, job.n_out - 1);
            srow[h] = job.scale + ((job.w_row0 + f) / kBK) * p.scale_cols * es;
        }
        float acc[G::kN / 2];
#pragma unroll
        for (int i = 0; i < G::kN / 2; ++i) {
            acc[i] = 0.0f;
            pin(acc[i]);
        }
        uint32_t raw[2] = {0u, 0u};
        if (nk > 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) raw[h] = load_scale(srow[h] + kb0 * es, es == 4);
        }
        // Stages in pairs: the second one drains the wgmma pipeline, so no group is in flight across the loop's back
        // edge (see experts_wgmma.cu's consume()).
        const int kb_end = kb0 + nk;
        int i = 0;
        for (; i + 1 < nk; i += 2) {
            scaled_stage<G, false, false>(it + i, kb0 + i, kb_end, acc, lp, raw, srow, es, ring_ptr, ring, bars);
            scaled_stage<G, true, true>(it + i + 1, kb0 + i + 1, kb_end, acc, lp, raw, srow, es, ring_ptr, ring, bars);
        }
        if (i < nk) scaled_stage<G, false, true>(it + i, kb0 + i, kb_end, acc, lp, raw, srow, es, ring_ptr, ring, bars);
#pragma unroll
        for (int v = 0; v < G::kN / 2; ++v) pin(acc[v]);

        if (splits == 1) {
            if constexpr (G::kParts == 2) {
                // Add the k halves (half 0 + half 1) through red; half 1 waits for red to be read before rewriting it.
                const bool first = tile == static_cast<int>(blockIdx.y);
                const bool last = tile + static_cast<int>(gridDim.y) >= p.tiles;
                if (lp.q == 1) {
                    if (!first) named_sync(kBarRedFree, kConsumerThreads);
                    acc_to_smem<G>(red, lp, acc);
                    named_arrive(kBarRedFull, kConsumerThreads);
                    continue;
                }
                named_sync(kBarRedFull, kConsumerThreads);
#pragma unroll
                for (int j = 0; j < G::kN / 8; ++j) {
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        const int t = 8 * j + 2 * lp.c + (v & 1), fl = kSliceRows * lp.sl + lp.r0 + 8 * (v >> 1);
                        acc[4 * j + v] += red[t * G::kRedStride + fl];
                    }
                }
                if (!last) named_arrive(kBarRedFree, kConsumerThreads);
            }
            store_tile<G>(p, job, f0, lp, acc);
            continue;
        }
        // Split K (one tile a CTA): the partials [kParts][N][kRedStride] over the ring once every warpgroup is done
        // with it, then the cluster's ranks sum them in rank order, rank r taking elements r * 512 .. of every 512 * S.
        named_sync(kBarDrained, kConsumerThreads);
        float* part = reinterpret_cast<float*>(ring_ptr);
        const uint32_t part_addr = mma::smem_addr(part);
        acc_to_smem<G>(part + lp.q * G::kN * G::kRedStride, lp, acc);
        cg::cluster_group cluster = cg::this_cluster();
        cluster.sync();
        const int total = p.rows * G::kTileRows;
        for (int e = static_cast<int>(threadIdx.x + kConsumerThreads * cluster.block_rank()); e < total;
             e += kConsumerThreads * splits) {
            const int t = e / G::kTileRows, fl = e % G::kTileRows;
            if (f0 + fl >= job.n_out) continue;
            // The ranks' partials loaded 4 ranks at a time (one remote latency per 4, not per rank), added in rank
            // order.
            const uint32_t at = part_addr + 4u * static_cast<uint32_t>(t * G::kRedStride + fl);
            float s = 0.0f;
            for (int r0 = 0; r0 < splits; r0 += 4) {
                float v[4][G::kParts];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    if (r0 + r >= splits) break;
                    const uint32_t rp = map_rank(at, r0 + r);
#pragma unroll
                    for (int q = 0; q < G::kParts; ++q) v[r][q] = ld_cluster(rp + 4u * q * G::kN * G::kRedStride);
                }
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    if (r0 + r >= splits) break;
#pragma unroll
                    for (int q = 0; q < G::kParts; ++q) s += v[r][q];
                }
            }
            job.out[t * job.ldc + f0 + fl] = s;
        }
        cluster.sync();  // the other ranks' reads of this CTA's partials are done before it exits
    }
}

// Grid (S, tile slots), clusters of (S, 1, 1): blockIdx.x is the K split (the cluster rank), blockIdx.y the first
// tile (S = 1: persistent over tiles; S > 1: the grid has one CTA a (split, tile)).
template <int N, int Slices>
__global__ void __launch_bounds__(kThreads, 1) gemv_wgmma_kernel(const __grid_constant__ WgParams p) {
    pdl_prologue();  // see pdl.cuh
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // built for another architecture: gemv_wgmma_applies() keeps callers away
#else
    using G = Geometry<N, Slices>;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* ring_ptr = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t ring = mma::smem_addr(ring_ptr), bars = ring + G::kRingBytes;  // full[kStages], empty[kStages]
    float* red = reinterpret_cast<float*>(ring_ptr + G::kRingBytes + 2 * G::kStages * 8);
    if (threadIdx.x == 0) {
        for (int s = 0; s < G::kStages; ++s) {
            mbar_init(bars + 8 * s, kProducerThreads);                 // the producer threads' cp.async arrivals
            mbar_init(bars + 8 * (G::kStages + s), kConsumerThreads);  // every consumer thread
        }
    }
    __syncthreads();
    const int kb0 = static_cast<int>(blockIdx.x) * p.kb_per_split;
    const int nk = max(0, min(p.nkb - kb0, p.kb_per_split));
    if (threadIdx.x >= kConsumerThreads) {
        if constexpr (G::kMoveRegs) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
        produce<G>(p, ring, bars, kb0, nk);
        mma::cp_async_wait_all();
        if (gridDim.x > 1) {  // the consumers' two cluster barriers (split K)
            cg::cluster_group cluster = cg::this_cluster();
            cluster.sync();
            cluster.sync();
        }
        return;
    }
    if constexpr (G::kMoveRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    consume<G>(p, ring_ptr, ring, bars, red, kb0, nk);
#endif
}

// xb[i] [rows, k] bf16 bits = x[i] (row stride lda[i]) rounded to nearest even, stored column q of each 128-block =
// real column kperm(q); blockIdx.y = i. One thread per 8 stored columns q = 8 m .. 8 m + 7 (real columns kperm(8 m)
// + 32 (j / 2) + 2 (j % 2)).
struct PrologueParams {
    const float* x[kMaxJobs];
    int64_t lda[kMaxJobs];
    uint16_t* xb[kMaxJobs];
    int64_t rows, k;
};
__global__ void gemv_wgmma_x_kernel(const __grid_constant__ PrologueParams a) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t per_row = a.k / 8;
    if (i >= a.rows * per_row) return;
    const int64_t r = i / per_row;
    const int ch = static_cast<int>(i % per_row), m = ch & 15;
    const float* src = a.x[blockIdx.y] + r * a.lda[blockIdx.y] + (ch >> 4) * kBK + kperm(8 * m);
    *reinterpret_cast<uint4*>(a.xb[blockIdx.y] + r * a.k + 8 * ch) = bf16_chunk_of(src);
}

// ---- host ----

// CTAs of an instantiation the current device holds at once in clusters of `splits`.
template <int N, int Slices>
int64_t resident_ctas(int splits) {
    if (splits == 1) return device_sm_count();  // 640 threads and ~220 KB: one CTA an SM
    static ClusterFit fit;
    return static_cast<int64_t>(fit.max_active(gemv_wgmma_kernel<N, Slices>, splits, kThreads,
                                               Geometry<N, Slices>::kSmemBytes)) *
           splits;
}

template <int N, int Slices>
void configure() {
    static std::atomic<uint64_t> configured{0};
    allow_smem(gemv_wgmma_kernel<N, Slices>, Geometry<N, Slices>::kSmemBytes, configured);
}

struct Plan {
    int slices = 4, splits = 1;
    int64_t tiles = 0, cost = -1;
};

// A plan forced by set_gemv_wgmma_plan (gemv_bench's plan sweep): slices and splits, 0 when none.
std::atomic<int> forced_slices{0}, forced_splits{0};

// Tile height and K splits (see the header comment). Cost in 8 KB stage-slices on the busiest SM: waves x stages
// a split x slices, at least the launch's total over all SMs (the HBM's share), plus ~2 for a cluster reduction and
// ~8 for each wave after the first of a split launch.
template <int N>
Plan plan(const GemvJob* jobs, int count, int64_t nkb) {
    const int64_t sms = device_sm_count();
    const int only_slices = forced_slices.load(std::memory_order_relaxed);
    const int only_splits = forced_splits.load(std::memory_order_relaxed);
    Plan best;
    for (int slices : {4, 2}) {
        if (only_slices && slices != only_slices) continue;
        int64_t tiles = 0;
        for (int i = 0; i < count; ++i) tiles += ceil_div(jobs[i].n_out, int64_t{kSliceRows} * slices);
        for (int s = 1; s <= std::min<int64_t>(kMaxSplits, nkb); ++s) {
            if (only_splits && s != only_splits) continue;
            const int64_t per = ceil_div(nkb, s);
            if ((s - 1) * per >= nkb) continue;    // a split without k blocks
            if (s > 1 && tiles > 65535) continue;  // one CTA a tile: the grid's y dimension holds 65535
            const int64_t resident = slices == 4 ? resident_ctas<N, 4>(s) : resident_ctas<N, 2>(s);
            if (resident <= 0) continue;
            const int64_t waves = s == 1 ? ceil_div(tiles, resident) : ceil_div(tiles * s, resident);
            // One tile a CTA (s > 1): each further wave pays a ring fill and a cluster reduction again, ~2 us or
            // ~8 stage-slices (gemv_bench --wgmma-plans: wq_b + the indexer's wq_b at 8 rows took 32 us as 640 CTAs in
            // 5 waves of 2 splits, 23 us persistent with no split).
            const int64_t rewaves = s > 1 ? 8 * (waves - 1) : 0;
            const int64_t cost =
                std::max(waves * per * slices, ceil_div(tiles * nkb * slices, sms)) + (s > 1 ? 2 : 0) + rewaves;
            if (best.cost < 0 || cost < best.cost) best = Plan{slices, s, tiles, cost};
        }
    }
    DI_CHECK(best.cost >= 0, "gemv_wgmma: no launch plan for ", count, " products");
    return best;
}

template <int N, int Slices>
void launch_kernel(const WgParams& p, const Plan& plan, cudaStream_t stream) {
    configure<N, Slices>();
    const int64_t slots = plan.splits > 1 ? plan.tiles : std::min(plan.tiles, resident_ctas<N, Slices>(1));
    DI_CHECK(slots <= 65535, "gemv_wgmma: ", slots, " tile slots");
    launch_clustered_pdl(gemv_wgmma_kernel<N, Slices>, dim3(plan.splits, static_cast<unsigned>(slots)), plan.splits,
                     kThreads, Geometry<N, Slices>::kSmemBytes, stream, p);
}

// plan<N> after both tile heights' shared-memory attribute is set (their occupancy queries need it).
template <int N>
Plan configured_plan(const GemvJob* jobs, int count, int64_t nkb) {
    configure<N, 4>();
    configure<N, 2>();
    return plan<N>(jobs, count, nkb);
}

// f(std::integral_constant<int, N>{}) for the narrowest wgmma width N that holds `rows` (at most kMaxWidth).
template <class F>
auto with_width(int64_t rows, F&& f) {
    if (rows <= 8) return f(std::integral_constant<int, 8>{});
    if (rows <= 16) return f(std::integral_constant<int, 16>{});
    if (rows <= 32) return f(std::integral_constant<int, 32>{});
    return f(std::integral_constant<int, 64>{});
}

template <int N>
void launch_width(const GemvJob* jobs, int count, WgParams& p, cudaStream_t stream) {
    const Plan pl = configured_plan<N>(jobs, count, p.nkb);
    p.kb_per_split = static_cast<int>(ceil_div(p.nkb, pl.splits));
    p.tiles = static_cast<int>(pl.tiles);
    const int64_t rows_per_tile = int64_t{kSliceRows} * pl.slices;
    for (int i = 0, t = 0; i < count; ++i) {
        p.jobs[i].tile0 = t;
        t += static_cast<int>(ceil_div(jobs[i].n_out, rows_per_tile));
    }
    if (pl.slices == 4)
        launch_kernel<N, 4>(p, pl, stream);
    else
        launch_kernel<N, 2>(p, pl, stream);
}

// Jobs one launch can share: K and the scale kind (the block shape is gemv_wgmma_applies()'s).
bool same_launch(const GemvJob& a, const GemvJob& b) { return a.w.cols == b.w.cols && a.w.scale_f32 == b.w.scale_f32; }

void launch_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    const WeightDesc& w = jobs[0].w;
    const int64_t k = w.cols;
    WgParams p{};
    p.num_jobs = count;
    p.rows = static_cast<int>(rows);
    p.nkb = static_cast<int>(k / kBK);
    p.scale_f32 = w.scale_f32;
    p.k = k;
    p.scale_cols = w.scale_cols;
    // One bf16 copy per distinct input.
    PrologueParams pro{};
    int input_of[kMaxJobs];
    const int inputs = distinct_inputs(jobs, count, pro.x, pro.lda, input_of);
    pro.rows = rows;
    pro.k = k;
    uint16_t* xb = nullptr;
    const size_t xb_elems = static_cast<size_t>(rows * k);
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&xb), xb_elems * inputs * 2, stream));
    for (int i = 0; i < inputs; ++i) pro.xb[i] = xb + xb_elems * i;
    launch_pdl(gemv_wgmma_x_kernel, dim3(static_cast<unsigned>(ceil_div(rows * k / 8, 256)), inputs), 256, 0, stream,
               pro);
    DI_CUDA_LAUNCH_CHECK();
    for (int i = 0; i < count; ++i) {
        const GemvJob& j = jobs[i];
        p.jobs[i] = WgJob{j.w.data, j.w.scale, pro.xb[input_of[i]], j.out, j.ldc, j.w_row0, j.n_out, 0};
    }
    with_width(rows, [&](auto width) { launch_width<decltype(width)::value>(jobs, count, p, stream); });
    DI_CUDA_LAUNCH_CHECK();
    DI_CUDA_CHECK(cudaFreeAsync(xb, stream));
}

}  // namespace

bool fp8_block_weight_streams(const WeightDesc& w) {
    // FP8 in 128 x 128 scale blocks, whole 128-blocks of K (int k block and tile indices), 16-byte aligned rows.
    if (w.format != 1 || w.block_rows != kBK || w.block_cols != kBK) return false;
    if (w.cols <= 0 || w.cols % kBK != 0 || w.cols > (int64_t{1} << 24) || w.scale_cols != w.cols / kBK) return false;
    if (!w.data || !w.scale || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
    return !w.scale_f32 || reinterpret_cast<uintptr_t>(w.scale) % 4 == 0;
}

bool gemv_wgmma_applies(int64_t rows, const WeightDesc& w) {
    if (rows < kMinRows || rows > kMaxRows || !fp8_block_weight_streams(w)) return false;
    // wgmma is sm_90a's: a compute capability 9.0 device (cached; the build must include 90a, which the kernel checks).
    return device_compute_capability() == 90;
}

void launch_gemv_wgmma_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    for (int i = 0; i < count; ++i)
        DI_ICHECK(gemv_wgmma_applies(rows, jobs[i].w) && jobs[i].n_out >= 0 && jobs[i].n_out <= (int64_t{1} << 30) &&
                      jobs[i].w_row0 >= 0,
                  "gemv_wgmma: product ", i, " of ", count, " at ", rows, " rows is not one the kernel takes");
    // Jobs in their given order, consecutive compatible ones in one launch; above kMaxWidth rows, a launch per
    // kMaxWidth rows (each reads the weights again).
    std::vector<GemvJob> part;  // the jobs moved to rows r0.. (only above kMaxWidth rows)
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxWidth) {
        const int64_t n = std::min<int64_t>(kMaxWidth, rows - r0);
        const GemvJob* at = jobs;
        if (r0 > 0) {
            part.assign(jobs, jobs + count);
            for (GemvJob& j : part) {
                j.x += r0 * j.lda;
                j.out += r0 * j.ldc;
            }
            at = part.data();
        }
        for_each_shared_launch(at, count, kMaxJobs, same_launch,
                               [&](const GemvJob* first, int m) { launch_jobs(first, m, n, stream); });
    }
}

bool gemv_wgmma_device() { return device_compute_capability() == 90; }

bool set_gemv_wgmma_plan(int slices, int splits) {
    if (!((slices == 0 && splits == 0) || ((slices == 2 || slices == 4) && splits >= 1 && splits <= kMaxSplits)))
        return false;
    forced_slices.store(slices, std::memory_order_relaxed);
    forced_splits.store(splits, std::memory_order_relaxed);
    return true;
}

GemvWgmmaPlan gemv_wgmma_plan_of(const GemvJob* jobs, int count, int64_t rows) {
    const int64_t nkb = jobs[0].w.cols / kBK;
    const Plan pl = with_width(std::min<int64_t>(rows, kMaxWidth),
                               [&](auto width) { return configured_plan<decltype(width)::value>(jobs, count, nkb); });
    return {pl.slices, pl.splits, pl.tiles};
}

bool gemv_wgmma_applies(int64_t rows, const LinearWeight& w) { return gemv_wgmma_applies(rows, describe_weight(w)); }
bool gemv_fp8_mma_applies(int64_t rows, const LinearWeight& w) {
    return gemv_fp8_mma_applies(rows, describe_weight(w));
}

void run_decode_gemv_sync(DecodeGemv kernel, const std::vector<GemvProduct>& products, int64_t rows,
                          cudaStream_t stream) {
    std::vector<GemvJob> jobs;
    for (const GemvProduct& pr : products) {
        const WeightDesc d = describe_weight(*pr.w);
        const bool applies = kernel == DecodeGemv::kTc      ? gemv_tc_applies(rows, d)
                             : kernel == DecodeGemv::kWgmma ? gemv_wgmma_applies(rows, d)
                                                            : gemv_fp8_mma_applies(rows, d);
        DI_CHECK(applies, "run_decode_gemv_sync: weight ", pr.w->name, " at ", rows,
                 " rows is not one the kernel takes");
        jobs.push_back({pr.out, pr.ldc, pr.x, pr.lda, d, pr.w_row0, pr.n_out});
    }
    const int n = static_cast<int>(jobs.size());
    if (kernel == DecodeGemv::kTc)
        launch_gemv_tc_jobs(jobs.data(), n, rows, stream);
    else if (kernel == DecodeGemv::kWgmma)
        launch_gemv_wgmma_jobs(jobs.data(), n, rows, stream);
    else
        launch_gemv_fp8_mma_jobs(jobs.data(), n, rows, stream);
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace deepinfer::cuda
