// The routed experts on Hopper wgmma (sm_90a). Prefill: x [R, D] f32, rows sorted into runs by expert, in place
// x_run = W2_e . swiglu(W1_e . x_run, W3_e . x_run), with FP4 weights (e2m1, E8M0 scale per 32) decoded straight
// into the A fragments of wgmma.mma_async and never written out as bf16.
//
// Three launches on the stream:
//  0. xb [R, D] bf16 = x rounded to nearest even once, k permuted inside each block of 128 columns (below);
//  1. gate/up: per tile (expert e, 128 features f0 of I, up to 128 rows of e's run) G = W1 X^T and U = W3 X^T
//     on wgmma, h = swiglu(G, U) in fp32 in the epilogue, h [R, I] written as bf16 (same k permutation: h is
//     the down product's B operand);
//  2. down: per tile (e, 256 features of D, up to 128 rows) x = W2 h^T in f32 (x was only read by launch 0).
//
// A tile is out^T = W_tile . X_tile^T: M = weight rows (features), N = tokens, K = D or I. Persistent CTAs (one
// per SM) of 384 threads: two consumer warpgroups (232 registers) and a producer warpgroup (40, setmaxnreg); the
// default at prefill is 640 threads, four consumer warpgroups of one A slice each (PrefillRing4, below).
// Each consumer warpgroup owns two 64-row A slices (gate/up: W1 and W3 rows of the same 64 features, so the
// epilogue pairs them; down: two slices of 64 W2 rows) and one f32 accumulator of m64 x N per slice (2 x 64
// registers at N = 128), and stores its results straight from them (no staging, no block barrier), so one
// warpgroup's epilogue overlaps the other's products and the producer's loads of the next tile (the ring and its
// barrier phases run on across a CTA's tiles: +7% over one CTA a tile). The producer streams stages of 128 k through a
// 4-deep ring guarded by mbarriers (full: cp.async.mbarrier.arrive.noinc of the 128 producer threads; empty:
// the 256 consumer threads): the B tile (N rows x 128 k bf16, K-major, 128-byte swizzle: two 64-wide column
// blocks of 8-row x 128-byte atoms, SBO 1024; two bulk tensor copies (TMA) by one producer thread, at prefill and on
// the default decode ring, whose bytes the full barrier also counts, unless DEEPINFER_CUDA_EXPERTS_TMA=0; B written
// by TMA needs no proxy fence before the wgmmas read it, B by cp.async does) and the A slices as raw FP4 bytes (4 x 64
// rows x 64 bytes) plus their E8M0 bytes. Why FP4 through shared memory rather than straight from global into
// registers: the stage ring then hides the L2/HBM latency of both operands with no register prefetch buffers (the
// consumers already hold 128 accumulators), the weight bytes per stage are a third of the activation bytes (16 KB vs 32
// KB) and each consumer lane reads its 16-byte chunk once (conflict-free ld.shared.v4) and decodes it once.
//
// A fragments and the k permutation. In a 128-k stage, lane 4 g + c of a warp reads for its rows g and g + 8
// the 16-byte chunk c (k 32 c .. 32 c + 31: one whole scale group) and decodes it one 32-bit word (8 codes) at a
// time with fp4_word_to_a (below), which yields the pairs (0, 2), (1, 3), (4, 6), (5, 7) of the word's codes. wgmma
// step s = 2 w + t (16 k each, 8 steps a stage) uses word w: a0 = pair 2 t (row g), a2 = pair 2 t + 1 (row g),
// a1/a3 the same for row g + 8: the four codes 4 t .. 4 t + 3 of word w as (b0, b2), (b1, b3), the k order kperm of
// wgmma_common.cuh (the FP8 GEMV's). B is stored in that order: column q of each 128-block of xb (and of h) holds
// real column kperm(q). Launch 0 gathers x that way; launch 1's epilogue scatters h that way (a gate/up feature tile
// is exactly one 128-block of the down K).
//
// FP4 -> bf16 (fp4_word_to_a): byte permutes look up 2|v| (0, 1, 2, 3, 4, 6, 8, 12) for the 8 magnitudes and put
// each under a byte holding only the code's sign, the bf16 bits of v 2^-132 (a subnormal, exact); one bf16x2
// multiply by 2^e (E8M0 byte e <= 127) gives v 2^(e - 132) = v 2^S 2^-5, exact in bf16, and the epilogue multiplies
// the f32 accumulators by 2^5 (exact: every partial sum of the products is scaled by the same power of two). Other
// scales (e >= 128: 2^S >= 2, never in a checkpoint) multiply by 2^127 and then by 2^S, warp by warp. ~15
// instructions a word; the earlier decode (bias and FMA, then the signs ORed in) took ~20 (ncu, decode batch 32:
// the consumers issue-bound, the decode two thirds of their instructions).
//
// Tiles: rows of a run in tiles of 128 (decode: 32), the last one rounded up to a wgmma width of 16, 32, 64 or 128
// (rows past the run's end are zero-filled B rows and never written); a run of 0 rows makes no tile. The tile list is
// ordered expert-major, then feature tile, then token tile, and CTA b takes tiles b, b + #SMs, ..., so the CTAs
// running at once share one expert's weight tile (its token tiles are adjacent) and its activations (its feature
// tiles follow) through L2.
//
// Work at D = 4096, I = 2048, 256 experts x 384 rows (16,384 tokens x top-6): 2 R D (2 I) + 2 R I D = 6 R D I
// = 4.95 TFLOP. Bytes: weights 3.3 GB FP4 + 0.1 GB scales, read once from HBM per expert and ~3x (token tiles)
// from L2; x read 1.6 GB + xb written 0.8 GB (launch 0); xb read 16x (feature tiles of I) from L2, 12.9 GB;
// h 0.4 GB written, read 16x (feature tiles of D) from L2; x written 1.6 GB. At 450 TFLOP/s the op is 11 ms
// and its HBM traffic (~8 GB) about 2 ms of it. Decode: ~3 instructions a weight per token tile, one issue
// slot per ~20 tensor-core cycles of the m64n128 products it feeds, so it overlaps the MMAs.
// Measured on an H200 (256 x 384 rows, D 4096, I 2048): 10.3 ms = 480 TFLOP/s for the op (launch 0 0.56 ms,
// gate/up 6.6 ms = 500 TFLOP/s, down 2.9 ms = 574 TFLOP/s); the backend's dequantize + cuBLAS path 21 ms.
//
// Decode (launch_routed_experts_wgmma, Backend::routed_experts; also prefill-sized calls, below): the slots (tokens x
// top-k, each reading its token's row) come with their expert ids in device memory, so one more launch builds the
// plan on the device
// (routed_plan_kernel: a stable counting sort of the slots by expert, their row addresses, both tile lists and their
// counts, NaN rows for ids outside [0, E)); launch 0 gathers the slots' token rows by address; the gate/up and down
// launches run one CTA per SM (at most the bound on their tiles) and read their tile count from device memory; the
// down epilogue writes each slot's output row by address. Nothing waits for the host, so a CUDA graph could hold it.
// All four launch with programmatic dependent launch (pdl.cuh), so each one's CTAs are resident when the one before
// ends (H200, 8-layer decode step: -0.02 / -0.03 ms at batches 8 / 32).
// Decode tiles hold at most 32 token rows (the decode rings): B is 8 KB a stage instead of 32 KB, and 8 stages fit
// where prefill has 4; the consumers there are 2 or 4 warpgroups (below). Calls of more than kRoutedDecodeMaxSlots
// slots (moe_forward's prefill steps, Backend::routed_experts_take_prefill) plan prefill's 128-row tiles the same way
// and run prefill's rings: bitwise grouped_experts_rows on the host's plan, with no wait for the ids on the host.
// Measured on an H200 (8-layer prefill 8 x 2048, three runs of new / base / new / base): 187.8 against 189.0 ms, the
// same within the runs' spread (the host's wait had been hidden behind the queued work), while the op itself takes
// ~0.3 ms a layer more (the plan kernel's; see routed_plan_kernel).
// Cost model, UNMEASURED (V4-Flash: D 4096, I 2048, 256 FP4 experts; H200: ~4.3 TB/s, 132 SMs at ~1.9 GHz):
//  - bytes: an expert is 3 x 4 MiB of FP4 + 3 x 256 KiB of scales = 13.4 MB, read from HBM once a call (its token
//    tiles are adjacent in the list and share it through L2). Top-6 of 256 touches ~6 / 44 / 136 / 244 experts at
//    1 / 8 / 32 / 128 tokens: 0.08 / 0.59 / 1.82 / 3.26 GB, floors of 19 / 139 / 427 / 765 us.
//  - in flight: a stage is 17 KB of weights and scales (B: 1-32 token rows from L2); 8 stages are 136 KB per SM,
//    18 MB on 132 SMs, against the 6-9 MB that 4.3 TB/s needs at a loaded latency of 1.5-2 us (4 stages: 9 MB).
//    Decode leaves SMs idle (1 token: 96 gate/up and 96 down tiles) and a persistent CTA's last round partial
//    (8 tokens: 707 tiles, 5.4 a CTA): the ring's depth is what lets 50-100 busy SMs still pull the bandwidth.
//  - issue: a consumer warp decodes 16 FP4 words and issues 16 m64n16k16 wgmmas a stage (~220 instructions; two
//    warps per SM sub-partition: ~450 issue slots), while HBM delivers a stage to an SM every ~1000 cycles; the
//    tensor cores need ~260. Neither limits (expert_linear's fp32 kernel, at one FMA per weight and row on top of
//    the decode, is bound by issue). Measured (below): ~595 instructions a warp a stage, and the consumers do limit.
//  - fixed: 4 launches (the one-block plan, a few us at 2048 slots; launch 0; each product's ramp and partial last
//    round). Expected ~30 / ~180 / ~500 / ~850 us a call at 1 / 8 / 32 / 128 tokens, against ~65 / ~310 / ~620 us
//    for expert_linear x 3 + swiglu at 1 / 8 / 32 (their measured per-call times x 3): 1.2-2x. gemv_bench measures it.
//  - tiles narrower than 16 tokens: wgmma has n8, but a decode tile costs its weight bytes, the same at n8; n8 would
//    only halve B's bytes (one more stage) and the idle tensor work, neither a limit, for a fifth compiled width.
// Four consumer warpgroups (DEEPINFER_CUDA_EXPERTS_DECODE_WGS = 4, the default; 2: the layout above). Measured on an
// H200 with 2 (ncu, decode batch 32, ~136 experts, gate/up): 1.5-1.9 of the ~4.3 TB/s, the producer waiting on empty
// slots, the consumers at IPC 2.45 (issue slots 58% busy, no eligible warp in 39% of cycles): each consumer warp
// decodes 16 FP4 words a stage (~20 dependent instructions each; ~595 instructions a stage in all) with only 2
// consumer warps per scheduler to hide the chains. At N <= 32 an accumulator is 16 registers, so the decode rings
// also come with 4 consumer warpgroups (112 registers) + the producer (32; 640 threads, launched at 96: the
// consumers take only what the producer gives up), each owning ONE slice: a warp decodes 8 words and issues 8 wgmmas
// a stage, and each scheduler holds 4 consumer warps instead of 2. Gate/up slices interleave W1 and W3 rows so that
// a lane's fragment rows g and g + 8 are the gate and up rows of one feature (slice_row: row r of slice sl is feature
// f0 + 32 sl + 8 (r / 16) + r % 8, of W1 where r % 16 < 8, else of W3), and the epilogue pairs them in registers as
// before; down slice sl is W2 rows f0 + 64 sl ... The empty barriers count 512 consumer threads. Every accumulator
// sums the same k steps in the same order as with 2 warpgroups (only which warp holds which rows changes), so the
// outputs are bitwise equal. Cost: the work a stage proportional to the slices (the FP4 decode, the scale loads, the
// wgmmas) halves per warp, the rest (barrier wait, fences, descriptors, commits) does not: ~330 instructions a warp,
// ~1,320 a scheduler against ~1,190 (+11%), repaid by the issue slots busy more of the time with twice the warps to
// pick from. Batch (G) groups a batch put 2 G independent word decodes in flight per warp (2-warpgroup: 4 G).
// Measured (H200, gemv_bench --experts-only, 32 tokens, ~132 experts, the whole op): 2 warpgroups at G = 2 901 us
// (46% of the HBM rate), 4 at G = 2 813 us, 4 at G = 4 (the default) 792 us (52%); the step at batch 32 with every
// MoE layer hash-routed 11.12 -> 10.22 ms. Still issue-bound: the FP4 -> bf16 decode is ~20 instructions a word of 8
// codes, about two thirds of a consumer warp's instructions a stage.
// Now (paired stages, FP4 as subnormals, the fast scale path a multiply-add and an OR a scale and one warp test a
// stage, unsigned ring arithmetic): ~205 instructions a consumer warp a stage at N = 16 (cuobjdump: 49 byte permutes,
// 32 bf16x2 multiplies, 25 LOP3, 16 constant re-materializations, ~34 uniform-datapath descriptor moves, 8 wgmmas); 655
// us at 32 tokens (63% of the HBM rate; 681 before the scale path and ring arithmetic changes). ncu: the producer waits
// on empty slots ~45% of its time, the consumers issue ~2.8 instructions a cycle an SM: the consumers' issue limits.
// Tried and slower (gemv_bench, same run): a deeper ring (16-row tiles, 10 stages: 756 us; the ring arithmetic is no
// longer a power of two) and L2 prefetch by the producer of the slots 1-6 ahead (743-888 us; 740 with the code
// present but off, the producer then spilling registers).
// B by TMA on the default decode ring (as at prefill): ncu (gate/up, batch 32) had the proxy fence that cp.async's B
// needs, with its memory barrier, at ~5.6% of a consumer stage's stalls. Measured on an H200 against cp.async, the
// same binaries alternated: the op at 8 tokens 235 against 245 us (-4%), at 1 / 32 / 128 tokens within 1%; the
// 8-layer decode step 3.57-3.61 against 3.66 ms at batch 8 and 7.34-7.39 against 7.64-7.67 at batch 32 (-4%), the
// same at batch 1. Tried with it, no gain (within 1%): mbarrier waits with a suspend-time hint (the consumers' spin
// on the full barrier was 12% of their instructions). With the consumers' decode and MMAs skipped (a diagnostic
// build, not kept) the op streams 32 tokens' experts in 474 us (87.5% of the HBM rate; 8 tokens: 175 us) against
// ~645 us whole: the consumers' issue still sets its time (ncu, gate/up: DRAM 55% busy, IPC 2.56, ~268
// instructions a consumer warp a stage). Later measurements say otherwise: the FP8 products (experts_fp8_decode.cu,
// the backend's default at decode), with half these consumer instructions, ran no faster until their E8M0 bytes,
// copied as here (4 bytes a row a stage, one single-sector request each), were copied 16 bytes a row a pair of
// stages: then 529 against ~650 us at 32 tokens. The same change here is untried.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/block_scan.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/fp4_subnormal.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/tma.h"
#include "backend/cuda/wgmma_common.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;  // the mbarrier, fence, descriptor and Wgmma<N> helpers (wgmma_common.cuh)

constexpr int kBK = 128;        // k per stage
constexpr int kSliceRows = 64;  // weight rows per A slice (wgmma M)
constexpr int kSlices = 4;      // per stage: two per consumer warpgroup, or one (Ring's Wgs)
constexpr int kProducerThreads = 128;  // one warpgroup (setmaxnreg works on warpgroups)
constexpr int kGateUpFeatures = 128;   // I features per gate/up tile (W1 and W3 rows of each)
constexpr int kDownFeatures = 256;    // D features per down tile

constexpr int kSliceWBytes = kSliceRows * kBK / 2;   // 4096: 64 rows x 64 bytes of FP4
constexpr int kWBytes = kSlices * kSliceWBytes;      // 16384
constexpr int kSliceSBytes = kSliceRows * kBK / 32;  // 256: 64 rows x 4 scale bytes
constexpr int kSBytes = kSlices * kSliceSBytes;      // 1024

// The stage ring of a kernel variant: kStages stages of (B: up to kMaxN token rows x 128 k of bf16, the 4 A slices'
// FP4 bytes, their scales), then a full and an empty mbarrier per stage. Prefill takes tiles of up to 128 tokens
// and 4 stages; decode (routed_experts) tiles of up to 32 tokens, whose smaller B (8 KB a stage, not 32 KB) leaves
// room for 8 stages: twice the weight bytes in flight per SM (see "Decode" in the header comment).
// Batch: wgmma groups per commit batch for tiles of up to 32 tokens (see stage()). Wgs: consumer warpgroups, each
// owning kSlices / Wgs slices (4: see "Decode" in the header comment, and PrefillRing4). kPair (the 4-warpgroup
// decode rings):
// the stages go in pairs, each pair one slot of the ring with one full and one empty barrier, loaded together so
// that each weight row is read as one 128-byte run (bench/results/hbm_row_segments_*: 64-byte runs, one a stage,
// cap the HBM at ~59% of its rate; 128-byte runs reach ~96%). A tile takes a whole number of slots (an odd last
// stage leaves its slot's second half unused). Prefill's 4-warpgroup ring (PrefillRing4) is not paired: its B is four
// times the weight bytes a stage, so the weight runs' length matters less than the ring's depth in slots.
template <int MaxN, int Stages, int Batch = 1, int Wgs = 2>
struct Ring {
    static constexpr int kMaxN = MaxN, kStages = Stages, kBatch = Batch, kWgs = Wgs;
    static constexpr bool kPair = Wgs == 4 && MaxN <= 32;
    static constexpr int kBars = kPair ? kStages / 2 : kStages;  // full (and empty) barriers: one a slot
    // The ring's stage count at the end of a tile of nk stages that began at `it`.
    static __host__ __device__ constexpr int stages_after(int it, int nk) { return it + (kPair ? (nk + 1) & ~1 : nk); }
    // The barrier of stage s (the CTA's stage count): its slot in the ring.
    static __device__ __forceinline__ int bar_of(int s) {
        // unsigned: masks and shifts where kStages is a power of two
        return static_cast<int>(static_cast<unsigned>(s) % kStages / (kPair ? 2 : 1));
    }
    static constexpr int kWgSlices = kSlices / kWgs;  // A slices, and accumulators, per consumer warpgroup
    static constexpr int kConsumerThreads = 128 * kWgs;
    static constexpr int kThreads = kConsumerThreads + kProducerThreads;
    // setmaxnreg moves registers between the warpgroups of the CTA's launch allocation (ptxas gives the kernel the
    // most its launch bounds allow: 168 at 384 threads, 96 at 640), so the consumers take at most what the producer
    // gives up: Wgs C + P <= (Wgs + 1) x that, C and P multiples of 8.
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = kWgs == 2 ? 40 : 32, kConsumerRegs = kWgs == 2 ? 232 : 112;
    static_assert(kWgs * kConsumerRegs + kProducerRegs <= (kWgs + 1) * kLaunchRegs, "register file");
    static constexpr int kColBlockBytes = kMaxN * 128;  // one 64-wide k column block of B: kMaxN rows of 128 bytes
    static constexpr int kBBytes = 2 * kColBlockBytes;
    static constexpr int kStageBytes = kBBytes + kWBytes + kSBytes;
    static constexpr int kRingBytes = kStages * kStageBytes;
    static constexpr int kSmemBytes = 1024 + kRingBytes + 2 * kStages * 8;  // alignment slack, ring, barriers
    static_assert(kMaxN == 32 || kMaxN == 64 || kMaxN == 128, "a wgmma width holding whole 8-row swizzle atoms");
    static_assert(kWgs == 2 || kWgs == 4, "2 or 4 consumer warpgroups");
    static_assert(kStageBytes % 1024 == 0, "stages keep the 128-byte swizzle atoms 1024-byte aligned");
    static_assert(kSmemBytes <= 227 * 1024, "one CTA's shared memory");
    static_assert(!kPair || kStages % 2 == 0, "whole slots of two stages");
};
using PrefillRing = Ring<128, 4>;  // 50176-byte stages
// The same stages on 4 consumer warpgroups of one A slice each (DEEPINFER_CUDA_EXPERTS_PREFILL_WGS=4, the default;
// 2: PrefillRing): twice the consumer warps a scheduler to hide the decode and wgmma chains (ncu, run 3 of
// 2026-12-02: under one eligible warp of three), each m64 x N accumulator on 112 registers instead of two on 232.
// ptxas spills 20-48 bytes a thread (tile fields kept across the stage loop, stored near the kernel's start).
// Measured on an H200 (CudaExpertsWgmma.PrefillThroughput, 256 x 384 rows, D 4096, I 2048, same process): 9.63 ms a
// layer (514 TFLOP/s) against 10.45 (473) on 2; the 8-layer prefill 8 x 2048 -3.5% and -6.7% in two runs.
using PrefillRing4 = Ring<128, 4, 1, 4>;
// The decode rings (25600-byte stages): DEEPINFER_CUDA_EXPERTS_DECODE_BATCH = 1, 2 or 4 (default) picks the batch and
// DEEPINFER_CUDA_EXPERTS_DECODE_WGS = 2 or 4 (default) the consumer warpgroups. Measured on an H200 (gemv_bench
// --experts-only, 32 tokens, ~132 experts): WGS 2 / 4 at BATCH 1 913 / 834 us, BATCH 2 901 / 813, BATCH 4 878 / 792.
template <int Batch, int Wgs>
using DecodeRingOf = Ring<32, 8, Batch, Wgs>;
using DecodeRing = DecodeRingOf<4, 4>;  // the defaults (the plan's tiles hold DecodeRing::kMaxN rows, as every one's)

using Tile = ExpertTile;  // rows 1..kMaxN of the ring it runs on
using PlanHeader = ExpertTilesHeader;
struct Params {
    const Tile* tiles;
    int num_tiles;          // a persistent CTA takes tiles blockIdx.x, + gridDim.x, ...
    const int* tile_count;  // non-null: the number of tiles, in device memory (a plan built on the device)
    const ExpertPtrs* experts;
    const uint16_t* act;  // B source [R, k] bf16 bits, k permuted per 128-block
    void* out;            // gate/up: h [R, out_cols] bf16 bits (permuted); down: x [R, out_cols] f32
    float* const* out_rows;  // down: row r of the output at out_rows[r] instead (null: in x)
    int k;                // the product's K
    int out_cols;
    float limit;  // SwiGLU clamp (gate/up; 0: none)
    bool h_f32;   // gate/up: h written as f32 [R, out_cols] in natural column order, for quantize_h_kernel
};

// Prefill's B by the bulk tensor copy: TileWidthMaps (tma.h) of 128-byte boxes over Params::act seen as bytes [R, 2 k]
// (a copy a 64-wide column block of a stage). A kernel parameter of its own (experts_wgmma_tma_kernel), so that the
// kernels without it keep their parameters and registers.

// ---- the kernels ----------------------------------------------------------------------------------------------

// FP4 -> bf16 (fp4_word_to_a, SubnormalScale, kAccScale): fp4_subnormal.cuh.

// Weight row and scale pointers of row r of A slice `sl` (see the header). Gate/up on 2 consumer warpgroups: slices
// W1, W3 of features f0 .. f0 + 63, then W1, W3 of f0 + 64 .. f0 + 127; on 4: row r of slice sl is feature
// f0 + 32 sl + 8 (r / 16) + r % 8 of W1 if r % 16 < 8, else of W3 (so a lane's fragment rows g and g + 8 are the gate
// and up rows of one feature). Down slices W2 rows f0 + 64 sl + r.
template <bool kGateUp, int kWgs>
__device__ __forceinline__ void slice_row(const ExpertPtrs& e, int f0, int sl, int r, int k, const uint8_t*& data,
                                          const uint8_t*& scale) {
    const int which = !kGateUp ? 2 : kWgs == 2 ? (sl & 1) : ((r >> 3) & 1);
    const int64_t row = !kGateUp    ? f0 + 64 * sl + r
                        : kWgs == 2 ? f0 + 64 * (sl >> 1) + r
                                    : f0 + 32 * sl + 8 * (r >> 4) + (r & 7);
    data = e.data[which] + row * (k / 2);
    scale = e.scale[which] + row * (k / 32);
}

// A producer thread's roles for the scales and B (both produce functions). Scales: row s_row = pt % 64 of slices
// s_sl = pt / 64 and s_sl + 2 (4 bytes a stage), stored at s_dst of a stage. B: rows n = n0 + 8 j, 16-byte chunk kc
// (8 stored columns) -> column block kc / 8, atom row n, chunk (kc % 8) ^ (n % 8), where n % 8 = n0 % 8 for every j,
// stored at b_dst + 1024 j; read from b_src + n k. Rows past the run are zero-filled from a valid address.
struct StageRoles {
    int s_row, s_sl, n0;
    uint32_t s_dst, b_dst;
    const uint16_t* b_src;
};
template <class R>
__device__ __forceinline__ StageRoles stage_roles(const Params& p, const Tile& t, int pt) {
    StageRoles r;
    r.s_row = pt & 63;
    r.s_sl = pt >> 6;
    r.s_dst = static_cast<uint32_t>(R::kBBytes + kWBytes + r.s_sl * kSliceSBytes + r.s_row * 4);
    const int kc = pt & 15;
    r.n0 = pt >> 4;
    r.b_dst = static_cast<uint32_t>((kc >> 3) * R::kColBlockBytes + r.n0 * 128 + (((kc & 7) ^ (r.n0 & 7)) << 4));
    r.b_src = p.act + static_cast<int64_t>(t.row0) * p.k + kc * 8;
    return r;
}

// The producer of the unpaired rings (prefill's, on 2 or 4 consumer warpgroups; produce_pairs takes the paired decode
// rings). Each producer thread keeps fixed roles across stages (few registers: it runs on kProducerRegs): B and the
// scales as stage_roles says; W chunk ch = pt % 4 of rows r0 = pt / 4 and r0 + 32 of every slice (slice_row: row
// r0 + 32 is 32 rows past r0 of the same matrix, or 16 in a 4-warpgroup gate/up slice). Pointers advance with the
// stage instead of being recomputed (and hoisted) per copy.
template <bool kGateUp, class R>
__device__ __forceinline__ void produce(const Params& p, const CUtensorMap* maps, const Tile& t, int n_load,
                                        uint32_t ring, uint32_t bars, int it) {
    static_assert(!R::kPair && kProducerThreads == 128 && kSlices == 4 && kSliceRows == 64, "roles");
    const int pt = threadIdx.x - R::kConsumerThreads;  // 0 .. kProducerThreads - 1
    const ExpertPtrs& e = p.experts[t.expert];
    const int k = p.k, nk = k / kBK;
    // W: rows r0 and r0 + 32, chunk ch, of each slice (sources: wd[sl] (+ w_half); wd advances 64 a stage). On 2
    // consumer warpgroups a pointer a slice (gate/up slices alternate W1 and W3); on 4 the slices are 32 (gate/up) or
    // 64 (down) rows apart in one matrix: one pointer and that stride (the producer has 32 registers there).
    constexpr bool kStrided = R::kWgs == 4;
    constexpr int kPtrs = kStrided ? 1 : kSlices;
    const int ch = pt & 3, r0 = pt >> 2;
    const uint8_t *wd[kPtrs], *unused;
#pragma unroll
    for (int sl = 0; sl < kPtrs; ++sl) {
        slice_row<kGateUp, R::kWgs>(e, t.feature0, sl, r0, k, wd[sl], unused);
        wd[sl] += ch * 16;
    }
    const uint32_t sl_step = static_cast<uint32_t>((kGateUp ? 32 : 64) * (k / 2));
    const int half_rows = kGateUp && kStrided ? 16 : 32;  // row r0 + 32 of a slice, rows past r0
    const uint32_t w_half = static_cast<uint32_t>(half_rows * (k / 2));
    const uint32_t w_dst = static_cast<uint32_t>(R::kBBytes + r0 * 64 + ch * 16);
    const StageRoles roles = stage_roles<R>(p, t, pt);
    const int n0 = roles.n0;
    const uint32_t s_dst = roles.s_dst, b_dst = roles.b_dst;
    const uint16_t* b_src = roles.b_src;
    const uint8_t *s_src0, *s_src1 = nullptr;  // advance 4 bytes a stage
    slice_row<kGateUp, R::kWgs>(e, t.feature0, roles.s_sl, roles.s_row, k, unused, s_src0);
    if constexpr (!kStrided) slice_row<kGateUp, R::kWgs>(e, t.feature0, roles.s_sl + 2, roles.s_row, k, unused, s_src1);
    // strided: slice s_sl + 2's row is 64 (gate/up) or 128 (down) rows past s_sl's in the same matrix
    const uint32_t s_far = static_cast<uint32_t>((kGateUp ? 64 : 128) * (k / 32));
#pragma unroll 1
    for (int kb = 0; kb < nk; ++kb) {
        const int st = (it + kb) % R::kStages;
        mbar_wait(bars + 8 * (R::kBars + st), (((it + kb) / R::kStages) & 1) ^ 1);  // the first round passes at once
        const uint32_t sb = ring + st * R::kStageBytes;
        if (maps) {  // thread 0: both column blocks, counted on the full barrier beside the cp.async arrivals
            if (pt == 0) {
                const CUtensorMap* map = &maps[tma::tile_width_map(n_load)];
                tma::mbar_expect_tx(bars + 8 * st, static_cast<uint32_t>(n_load) * 256);
                tma::load_2d(sb, map, kb * 256, t.row0, bars + 8 * st);
                tma::load_2d(sb + R::kColBlockBytes, map, kb * 256 + 128, t.row0, bars + 8 * st);
            }
        } else {
#pragma unroll 1
            for (int n = n0; n < n_load; n += 8) {
                const bool valid = n < t.rows;
                mma::cp_async16(sb + b_dst + (n - n0) * 128, b_src + (valid ? n * k : 0), valid ? 16 : 0);
            }
        }
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl) {
            const uint8_t* src = kStrided ? wd[0] + sl * sl_step : wd[sl];
            mma::cp_async16(sb + w_dst + sl * kSliceWBytes, src, 16);
            mma::cp_async16(sb + w_dst + sl * kSliceWBytes + 32 * 64, src + w_half, 16);
        }
#pragma unroll
        for (int sl = 0; sl < kPtrs; ++sl) wd[sl] += kBK / 2;
        mma::cp_async4(sb + s_dst, s_src0);
        mma::cp_async4(sb + s_dst + 2 * kSliceSBytes, kStrided ? s_src0 + s_far : s_src1);
        s_src0 += kBK / 32;
        if constexpr (!kStrided) s_src1 += kBK / 32;
        b_src += kBK;
        cp_async_arrive_noinc(bars + 8 * st);
    }
}

// produce() for the paired rings (R::kPair, 4 consumer warpgroups): slot q of the tile holds stages 2 q and 2 q + 1
// (k 256 q .. 256 q + 255) in two consecutive stage buffers of the usual layout, behind one full barrier. Roles: W
// 16-byte chunk ch = pt % 8 of the row's 128-byte run (stage half ch / 4, chunk ch % 4 of its 64 bytes) of rows
// rr = pt / 8 + 16 j (j = 0..3) of every slice, so 8 consecutive threads read one row's 128 bytes with one
// instruction. Those rows are one matrix a thread (gate/up: rows 8 j + rr % 8 of W1 or W3 as rr < 8 or not, 32 a
// slice apart; down: W2 rows rr + 16 j, 64 a slice apart; see slice_row). B and the scales as in produce(), per half.
template <bool kGateUp, class R>
__device__ __forceinline__ void produce_pairs(const Params& p, const CUtensorMap* maps, const Tile& t, int n_load,
                                              uint32_t ring, uint32_t bars, int it) {
    static_assert(R::kPair && R::kWgs == 4 && kProducerThreads == 128 && kSlices == 4 && kSliceRows == 64, "roles");
    const int pt = threadIdx.x - R::kConsumerThreads;  // 0 .. kProducerThreads - 1
    const ExpertPtrs& e = p.experts[t.expert];
    const int k = p.k, nk = k / kBK;
    const int ch = pt & 7, half = ch >> 2, rr = pt >> 3;
    const uint8_t *wd, *unused;
    slice_row<kGateUp, 4>(e, t.feature0, 0, rr, k, wd, unused);  // row rr of slice 0 (j = 0)
    wd += ch * 16;
    const uint32_t row_bytes = static_cast<uint32_t>(k / 2);
    const uint32_t j_step = (kGateUp ? 8 : 16) * row_bytes, sl_step = (kGateUp ? 32 : 64) * row_bytes;
    const uint32_t w_dst = static_cast<uint32_t>(half * R::kStageBytes + R::kBBytes + rr * 64 + (ch & 3) * 16);
    const StageRoles roles = stage_roles<R>(p, t, pt);
    const int n0 = roles.n0;
    const uint32_t s_dst = roles.s_dst, b_dst = roles.b_dst;
    const uint16_t* b_src = roles.b_src;
    const uint8_t* s_src;  // row s_row of slice s_sl; of slice s_sl + 2 at + s_far (2 slices: 64 or 128 rows on)
    slice_row<kGateUp, 4>(e, t.feature0, roles.s_sl, roles.s_row, k, unused, s_src);
    const uint32_t s_far = static_cast<uint32_t>((kGateUp ? 64 : 128) * (k / 32));
#pragma unroll 1
    for (int kb = 0; kb < nk; kb += 2) {
        const int s = it + kb, st = s % R::kStages, bar = R::bar_of(s);
        mbar_wait(bars + 8 * (R::kBars + bar), ((s / R::kStages) & 1) ^ 1);  // the first round passes at once
        const uint32_t sb = ring + st * R::kStageBytes;  // stage kb; stage kb + 1 follows at + kStageBytes
        const int halves = kb + 1 < nk ? 2 : 1;
        if (maps) {  // thread 0: both stages' column blocks, counted on the full barrier beside the cp.async arrivals
            if (pt == 0) {
                const CUtensorMap* map = &maps[tma::tile_width_map(n_load)];
                tma::mbar_expect_tx(bars + 8 * bar, static_cast<uint32_t>(halves * n_load) * 256);
                for (int h = 0; h < halves; ++h) {
                    const uint32_t dst = sb + h * R::kStageBytes;
                    tma::load_2d(dst, map, (kb + h) * 256, t.row0, bars + 8 * bar);
                    tma::load_2d(dst + R::kColBlockBytes, map, (kb + h) * 256 + 128, t.row0, bars + 8 * bar);
                }
            }
        } else {
#pragma unroll 1
            for (int h = 0; h < halves; ++h)
#pragma unroll 1
                for (int n = n0; n < n_load; n += 8) {
                    const bool valid = n < t.rows;
                    mma::cp_async16(sb + h * R::kStageBytes + b_dst + (n - n0) * 128,
                                    b_src + h * kBK + (valid ? n * k : 0), valid ? 16 : 0);
                }
        }
        if (half < halves) {
            const uint8_t* src = wd;  // stepped rather than 16 pointers live: the producer runs on 32 registers
#pragma unroll
            for (int sl = 0; sl < kSlices; ++sl, src += sl_step - 4 * j_step)
#pragma unroll
                for (int j = 0; j < 4; ++j, src += j_step)
                    mma::cp_async16(sb + w_dst + sl * kSliceWBytes + j * 16 * 64, src, 16);
        }
        for (int h = 0; h < halves; ++h) {
            mma::cp_async4(sb + h * R::kStageBytes + s_dst, s_src + 4 * h);
            mma::cp_async4(sb + h * R::kStageBytes + s_dst + 2 * kSliceSBytes, s_src + s_far + 4 * h);
        }
        wd += kBK;  // two stages' 64 bytes
        s_src += 2 * (kBK / 32);
        b_src += 2 * kBK;
        cp_async_arrive_noinc(bars + 8 * bar);
    }
}

// f(v, m, h) for every A fragment register v = a[g][m][h][i] of a wgmma batch (slice m, fragment row half h).
template <int G, int M, class F>
__device__ __forceinline__ void for_each_fragment(uint32_t (&a)[G][M][2][4], F&& f) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) f(a[g][m][h][i], m, h);
}

// One 128-k stage of a consumer warpgroup: 4 groups of 2 M wgmmas (2 k steps x its M slices, 2 or 1), issued in
// batches of G groups (one commit group each), each batch's A decoded while the previous batch runs: 2 M G independent
// FP4 word decodes in flight. G = 1 at prefill, where a group's m64n128 products take about as long as decoding the
// next group's A; G = R::kBatch at decode (N <= 32), where the products are short and the decode is what the consumers
// spend their time on: at M = 2, G = 2 puts 8 independent word decodes in flight instead of 4, to hide more of the
// decode chain's latency (ncu, decode batch 32: IPC 2.45 with 2 consumer warps a scheduler, the producer waiting on
// empty slots). kAfterOpen: the previous stage left its last batch in flight (its buffers are handed back once that
// batch is done); kClose: drain the pipeline and hand this stage back at the end.
template <int N, int G, bool kAfterOpen, bool kClose, class R, bool kTma>
__device__ __forceinline__ void stage(int kb, float (&acc)[R::kWgSlices][N / 2], int wg, int arow, int c,
                                      const uint8_t* ring_ptr, uint32_t ring, uint32_t bars) {
    static_assert(G == 1 || G == 2 || G == 4, "groups per batch divide the stage's 4 groups");
    constexpr int kBatches = 4 / G, M = R::kWgSlices;  // M: this warpgroup's slices M wg .. M wg + M - 1
    // kb: the CTA's stage count so far (tiles before this one included); unsigned, so that the ring arithmetic is
    // masks and shifts (signed division by a power of two takes rounding fix-ups, ~8 instructions a stage).
    const unsigned ukb = static_cast<unsigned>(kb);
    const int st = static_cast<int>(ukb % R::kStages);
    const int bar = R::bar_of(kb);  // paired stages: the slot's barriers (the first stage of a slot waits)
    if (!R::kPair || ukb % 2 == 0) mbar_wait(bars + 8 * bar, (ukb / R::kStages) & 1);
    // B written by cp.async (generic proxy) and read by wgmma (async proxy) takes a proxy fence; by TMA (async proxy
    // both ways) it does not (ncu, decode batch 32: the fence, with its memory barrier, ~5.6% of a stage's stalls).
    if constexpr (!kTma) {
        __syncwarp();
        fence_proxy_async();
    }
    const uint8_t* sw = ring_ptr + st * R::kStageBytes + R::kBBytes;
    const uint8_t* ss = sw + kWBytes;
    // The scale byte of the lane's row arow + 8 h of its slice m (read again on the slow path rather than kept live:
    // the default ring's consumers are at their register limit).
    const auto scale_byte = [&](int m, int h) -> uint32_t {
        return ss[(M * wg + m) * kSliceSBytes + (arow + 8 * h) * 4 + c];
    };
    uint4 raw[M][2];
    uint32_t alpha[M][2], any_e = 0;
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int sl = M * wg + m, r = arow + 8 * h;
            raw[m][h] = *reinterpret_cast<const uint4*>(sw + sl * kSliceWBytes + r * 64 + c * 16);
            const uint32_t e = scale_byte(m, h);
            alpha[m][h] = subnormal_alpha(e);
            any_e |= e;
        }
    }
    // Scales outside the fast range (2^S >= 2: never in a checkpoint) take subnormal_scale's alpha and then its post,
    // the whole warp together (the consumers are issue-bound: the fast path is a multiply-add and an OR a scale and one
    // compare and vote a stage; ~20 instructions a stage when every scale took subnormal_scale's selects).
    const bool any_slow = __any_sync(0xffffffffu, !subnormal_fast_scale(any_e));
    if (any_slow) {
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) alpha[m][h] = subnormal_scale(scale_byte(m, h)).alpha;
    }
    const uint32_t sb = ring + st * R::kStageBytes;
    // The stage's B descriptors differ only in the address field (bits 0-13, address / 16; shared memory is below
    // 256 KB, so adding a step's offset never carries out of it): one 32-bit add a step instead of rebuilding each
    // (ncu: ~4 uniform-datapath instructions per wgmma).
    const uint64_t desc0 = b_desc(sb);
    const uint32_t desc0_lo = static_cast<uint32_t>(desc0), desc_hi = static_cast<uint32_t>(desc0 >> 32);
#pragma unroll
    for (int bt = 0; bt < kBatches; ++bt) {
        uint32_t a[G][M][2][4];  // group g of the batch is the stage's group w = G bt + g (word w of each chunk)
        uint64_t desc[G][2];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) fp4_word_to_a(word_of(raw[m][h], G * bt + g), alpha[m][h], a[g][m][h]);
        // Two passes rather than a test per element in one (that grows the fast path's PTX by 15%).
        if (any_slow)
            for_each_fragment(a, [&](uint32_t& v, int m, int h) {
                v = chunks::mul_bf16x2(v, subnormal_scale(scale_byte(m, h)).post);
            });
        for_each_fragment(a, [](uint32_t& v, int, int) { pin(v); });  // defined before the fence, not sunk past it
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int t2 = 0; t2 < 2; ++t2) {
                const int s = 2 * (G * bt + g) + t2;
                const uint32_t off = ((s >> 2) * R::kColBlockBytes + (s & 3) * 32) / 16;
                desc[g][t2] = (uint64_t{desc_hi} << 32) | (desc0_lo + off);
                pin(desc[g][t2]);
            }
        wgmma_fence();
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int t2 = 0; t2 < 2; ++t2)
#pragma unroll
                for (int m = 0; m < M; ++m)
                    Wgmma<N>::mma(acc[m], a[g][m][0][2 * t2], a[g][m][1][2 * t2], a[g][m][0][2 * t2 + 1],
                                  a[g][m][1][2 * t2 + 1], desc[g][t2]);
        wgmma_commit();
        if (kClose && bt == kBatches - 1) {
            wgmma_wait<0>();
            // One batch a stage (G = 4): it is also the first, and kb - 1's last batch is done by now as well.
            // Paired stages: kb - 1 is this slot's first stage, handed back with it.
            if (!R::kPair && kAfterOpen && bt == 0) mbar_arrive(bars + 8 * (R::kBars + R::bar_of(kb - 1)));
            mbar_arrive(bars + 8 * (R::kBars + bar));  // stage kb read: hand it (or its slot) back to the producer
        } else {
            wgmma_wait<1>();  // the previous batch is done: its A registers are free
            if (!R::kPair && kAfterOpen && bt == 0)
                mbar_arrive(bars + 8 * (R::kBars + R::bar_of(kb - 1)));  // kb - 1 read
        }
    }
}

// One tile of a consumer warpgroup; `it`: the CTA's stages before this tile. The epilogue stores straight from the
// accumulators (no staging, no block barrier), so a warpgroup's stores overlap the others' products and the
// producer's loads of the next tile. Stores: d[4 j + v] is feature row g + 8 (v >> 1) of the warp's 16, token
// 8 j + 2 c + (v & 1); the 8 lanes of a c write 8 consecutive features (gate/up: 8 scattered bf16 of a 256-byte
// row of h, whose 128-column block is permuted; down: 32 contiguous bytes of a row of x). Gate/up on 4 warpgroups:
// rows g and g + 8 are the gate and up rows of the lane's one feature (slice_row), so a lane writes h for it only.
template <int N, bool kGateUp, class R, bool kTma>
__device__ __forceinline__ void consume(const Params& p, const Tile& t, const uint8_t* ring_ptr, uint32_t ring,
                                        uint32_t bars, int it) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c = lane & 3;
    constexpr int kAcc = N / 2, M = R::kWgSlices;
    float acc[M][kAcc];  // slice M wg + m's m64 x N accumulator
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m][i] = 0.0f;
#pragma unroll
        for (int m = 0; m < M; ++m) pin(acc[m][i]);
    }
    const int nk = p.k / kBK;
    const int arow = 16 * wl + g;  // this lane's first row in its slices (and arow + 8)
    // Stages in pairs: the second one drains the wgmma pipeline, so no group is in flight across the loop's back
    // edge (ptxas serializes every wgmma, C7513, if A registers are redefined there while a group may still read
    // them); inside the pair the groups overlap the decoding.
    constexpr int G = N <= 32 ? R::kBatch : 1;  // groups per wgmma batch (see stage())
    int kb = 0;
    for (; kb + 1 < nk; kb += 2) {
        stage<N, G, false, false, R, kTma>(it + kb, acc, wg, arow, c, ring_ptr, ring, bars);
        stage<N, G, true, true, R, kTma>(it + kb + 1, acc, wg, arow, c, ring_ptr, ring, bars);
    }
    if (kb < nk) stage<N, G, false, true, R, kTma>(it + kb, acc, wg, arow, c, ring_ptr, ring, bars);
#pragma unroll
    for (int i = 0; i < kAcc; ++i)
#pragma unroll
        for (int m = 0; m < M; ++m) {
            pin(acc[m][i]);
            acc[m][i] *= kAccScale;  // the decoded weights were 2^-kAccExp of their values
        }
    if constexpr (kGateUp) {
        uint16_t* h = static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t.row0) * p.out_cols + t.feature0;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                // 2 warpgroups: rows of slices 2 wg (W1) and 2 wg + 1 (W3) of features 64 wg ..; 4: rows g (W1) and
                // g + 8 (W3) of slice wg are feature 32 wg + 8 wl + g, d[4 j + v] and d[4 j + v + 2] (v < 2).
                if (M == 1 && v >= 2) continue;
                const int n = 8 * j + 2 * c + (v & 1);
                const int f = M == 2 ? 64 * wg + arow + 8 * (v >> 1) : 32 * wg + 8 * wl + g;
                if (n < t.rows) {
                    float hv = swiglu_value(acc[0][4 * j + v], acc[M - 1][4 * j + v + (M == 2 ? 0 : 2)], p.limit);
                    if (M == 1) pin(hv);  // one h at a time: interleaved, their divisions spilled at 112 registers
                    if (p.h_f32)
                        static_cast<float*>(p.out)[(static_cast<int64_t>(t.row0) + n) * p.out_cols + t.feature0 + f] =
                            hv;
                    else
                        h[static_cast<int64_t>(n) * p.out_cols + kperm_inv(f)] =
                            __bfloat16_as_ushort(__float2bfloat16_rn(hv));
                }
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const int n = 8 * j + 2 * c + (v & 1), f = kSliceRows * M * wg + arow + 8 * (v >> 1);
                if (n < t.rows) {
                    const int64_t r = t.row0 + n;
                    float* row = (p.out_rows ? p.out_rows[r] : static_cast<float*>(p.out) + r * p.out_cols) +
                                 t.feature0;
#pragma unroll
                    for (int m = 0; m < M; ++m) row[f + kSliceRows * m] = acc[m][4 * j + v];
                }
            }
        }
    }
}

// Persistent: CTA b takes tiles b, b + gridDim.x, ... (consecutive tiles run at the same time on neighbouring
// CTAs); the stage ring and its barrier phases continue from tile to tile, so the producer loads the next tile
// while the consumers finish this one.
// kTma: B by bulk tensor copies over maps (TileWidthMaps); else maps is null (cp.async).
template <bool kGateUp, class R, bool kTma>
__device__ __forceinline__ void run_tiles(const Params& p, const CUtensorMap* maps) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // built for another architecture: grouped_experts_wgmma_applies() keeps callers away
#else
    pdl_prologue();  // see pdl.cuh
    extern __shared__ uint8_t smem_raw[];
    uint8_t* ring_ptr = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t ring = mma::smem_addr(ring_ptr), bars = ring + R::kRingBytes;  // full[kBars], then empty[kBars]
    // full: the producer threads' cp.async arrivals; empty: every consumer thread (256 or 512)
    if (threadIdx.x == 0) mbar_init_ring(bars, R::kBars, kProducerThreads, R::kConsumerThreads);
    __syncthreads();
    const int nk = p.k / kBK;
    const int num_tiles = p.tile_count ? *p.tile_count : p.num_tiles;
    if (threadIdx.x >= R::kConsumerThreads) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R::kProducerRegs));
        int it = 0;
        for (int i = blockIdx.x; i < num_tiles; i += gridDim.x, it = R::stages_after(it, nk)) {
            const Tile t = p.tiles[i];
            if constexpr (R::kPair) {
                produce_pairs<kGateUp, R>(p, maps, t, tile_width(t.rows), ring, bars, it);
            } else {
                produce<kGateUp, R>(p, maps, t, tile_width(t.rows), ring, bars, it);
            }
        }
        mma::cp_async_wait_all();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R::kConsumerRegs));
    int it = 0;
    for (int i = blockIdx.x; i < num_tiles; i += gridDim.x, it = R::stages_after(it, nk)) {
        const Tile t = p.tiles[i];
        // The plans never make a tile wider than its ring's B (kMaxN rows); the widths past it are not compiled.
        switch (tile_width(t.rows)) {
            case 128:
                if constexpr (R::kMaxN >= 128) consume<128, kGateUp, R, kTma>(p, t, ring_ptr, ring, bars, it);
                break;
            case 64:
                if constexpr (R::kMaxN >= 64) consume<64, kGateUp, R, kTma>(p, t, ring_ptr, ring, bars, it);
                break;
            case 32:
                consume<32, kGateUp, R, kTma>(p, t, ring_ptr, ring, bars, it);
                break;
            default:
                consume<16, kGateUp, R, kTma>(p, t, ring_ptr, ring, bars, it);
                break;
        }
    }
#endif
}

template <bool kGateUp, class R>
__global__ void __launch_bounds__(R::kThreads, 1) experts_wgmma_kernel(const Params p) {
    run_tiles<kGateUp, R, false>(p, nullptr);
}
// The same with prefill's B by bulk tensor copies (maps: a parameter, where the copies may read it).
template <bool kGateUp, class R>
__global__ void __launch_bounds__(R::kThreads, 1)
    experts_wgmma_tma_kernel(const Params p, const __grid_constant__ TileWidthMaps maps) {
    run_tiles<kGateUp, R, true>(p, maps.map);
}

// xb [rows, k] bf16 bits = x rounded to nearest even, stored column q of each 128-block = real column kperm(q).
// One thread per 8 stored columns (q = 8 m .. 8 m + 7: s = m / 2, p = 8 (m % 2) + j).
// in_rows (non-null): row r of x is at in_rows[r] (the slots' token rows, gathered here rather than copied first).
__global__ void to_bf16_permuted_kernel(uint16_t* __restrict__ xb, const float* __restrict__ x,
                                        const float* const* __restrict__ in_rows, int64_t rows, int k) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int per_row = k / 8;
    if (i >= rows * per_row) return;
    const int64_t r = i / per_row;
    const int ch = static_cast<int>(i % per_row), m = ch & 15;
    const float* row = in_rows ? in_rows[r] : x + r * k;
    const float* src = row + (ch >> 4) * kBK + kperm(8 * m);
    *reinterpret_cast<uint4*>(xb + r * k + 8 * ch) = bf16_chunk_of(src);
}

// FP8 activations (act_block 128): h [rows, k] bf16 bits, stored column q of each 128-block = real column kperm(q),
// = hf [rows, k] f32 quantized as fake_quantize's kFp8Ue8m0 quantizes it (the same per-block maximum, scale and codes:
// pointwise.cu), each value code x scale, exact in bf16. One warp per (row, 128-block), 4 consecutive real columns a
// lane.
__global__ void quantize_h_kernel(uint16_t* __restrict__ h, const float* __restrict__ hf, int64_t rows, int k) {
    pdl_prologue();  // see pdl.cuh
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, blocks = k / kBK;
    if (warp >= rows * blocks) return;
    const int64_t r = warp / blocks;
    const int b = static_cast<int>(warp % blocks);
    const Fp8Quad q = fp8_quantize_quad(hf + r * k + b * kBK + 4 * lane);
    uint16_t* row = h + r * k + b * kBK;
#pragma unroll
    for (int i = 0; i < 4; ++i)  // code x scale: fake_quantize's value, exact in bf16
        row[kperm_inv(4 * lane + i)] =
            __bfloat16_as_ushort(__float2bfloat16_rn(fp8_code_float((q.codes >> (8 * i)) & 0xffu) * q.scale));
}

// ---- the plan built on the device (decode, and prefill-sized calls of routed_experts) ----

// The plan kernel's block: 256 threads for decode's few slots, 1024 at prefill (98,304 slots at 16K tokens: each
// warp's serial pass over its segment is the kernel's time).
constexpr int kPlanThreads = 256, kPrefillPlanThreads = 1024;
constexpr int plan_smem_bytes(int threads, int num_experts) { return (threads / 32 + 3) * (num_experts + 1) * 4; }

struct DevicePlan {
    int* tile_count;        // [2]: gate/up tiles, down tiles
    const float** in_rows;  // [rows] the slots' token rows, sorted by expert (bad ids last)
    float** out_rows;       // [rows] their output rows, in the same order
    Tile* tiles1;           // gate/up tiles
    Tile* tiles2;           // down tiles
};
struct PlanArgs {
    DevicePlan plan;
    float* out;          // [rows, d] f32
    const float* x;      // [rows / rows_per_input, d] f32
    const int32_t* ids;  // [rows] I32 expert of each slot
    int64_t rows, d, inter;
    int rows_per_input, num_experts;
};

constexpr int kPlanAhead = 8;  // groups of 32 slots whose ids a warp loads before it ranks them

// The bucket of slot r of a segment ending at s1: its expert, num_experts for ids outside [0, num_experts), -1 past
// the segment (those lanes group among themselves).
__device__ __forceinline__ int plan_bucket(const PlanArgs& a, int64_t r, int64_t s1) {
    if (r >= s1) return -1;
    const int32_t id = a.ids[r];
    return id >= 0 && id < a.num_experts ? static_cast<int>(id) : a.num_experts;
}

// One warp walks the slots [s0, s1) 32 at a time (kPlanAhead groups' ids loaded before it ranks them: the loads in
// flight together, not one latency per group) and calls rank(r, b, same) for each: slot r's bucket b (-1 past the
// segment) and the mask of the lanes sharing it (__match_any_sync), with a __syncwarp after each group.
template <typename Rank>
__device__ __forceinline__ void walk_segment(const PlanArgs& a, int64_t s0, int64_t s1, Rank rank) {
    const int lane = threadIdx.x % 32;
    for (int64_t base = s0; base < s1; base += 32 * kPlanAhead) {
        int bs[kPlanAhead];
#pragma unroll
        for (int u = 0; u < kPlanAhead; ++u) bs[u] = plan_bucket(a, base + 32 * u + lane, s1);
#pragma unroll
        for (int u = 0; u < kPlanAhead; ++u) {
            rank(base + 32 * u + lane, bs[u], __match_any_sync(0xffffffffu, bs[u]));
            __syncwarp();
        }
    }
}

// One block: the slots sorted by expert id with a stable counting sort (bucket num_experts takes the ids outside
// [0, num_experts)), their row addresses, both launches' tile lists in grouped_experts_wgmma_plan's order with runs
// cut into tiles of kMaxN rows (the ring's), the tile counts, and NaN in the bad ids' output rows (their slots are in
// no tile). Stable, so that the plan, and with it every result, does not depend on timing: warp w sorts the w-th
// contiguous segment of the slots, 32 at a time (a bucket's lanes found with __match_any_sync, ranked by lane), and
// a bucket's slots from warp w follow those of the warps before it (walk_segment). Measured on an H200
// (CudaExpertsWgmma.PrefillThroughput, 98,304 slots): the device-planned op takes 9.69-9.82 ms a layer against
// 9.35-9.56 for the host-planned one, ~0.3 ms more; placing the slots from 32 one-warp blocks instead of this block
// changed nothing (run 4 of 2026-12-02, second session). ncu put a variant of this kernel (shared-memory atomics in
// the counting pass) at 106 us (run 1 of 2026-12-02, third session), so the plan is ~0.1 ms of that; the rest is
// likely the comparison (the host-planned op there works in place on rows already grouped).
template <int kMaxN, int kThreads>
__global__ void __launch_bounds__(kThreads) routed_plan_kernel(const PlanArgs a) {
    pdl_prologue();  // see pdl.cuh
    extern __shared__ int plan_smem[];
    constexpr int kPlanWarps = kThreads / 32;
    const int E = a.num_experts, B = E + 1;
    int* seg = plan_smem;               // [kPlanWarps, B]: a warp's slots per bucket, then its next position in it
    int* count = seg + kPlanWarps * B;  // [B] slots per bucket
    int* row0 = count + B;              // [B] first sorted position of each bucket
    int* tile0 = row0 + B;              // [B] first token tile of each expert; tile0[E]: all of them
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    for (int i = tid; i < kPlanWarps * B; i += kThreads) seg[i] = 0;
    __syncthreads();
    const int64_t per = (a.rows + kPlanWarps - 1) / kPlanWarps;
    const int64_t s0 = min(a.rows, warp * per), s1 = min(a.rows, s0 + per);
    int* mine = seg + warp * B;
    walk_segment(a, s0, s1, [&](int64_t, int b, unsigned same) {  // the segment's slots per bucket
        if (b >= 0 && lane == __ffs(same) - 1) mine[b] += __popc(same);
    });
    __syncthreads();
    for (int b = tid; b < B; b += kThreads) {  // a warp's count becomes its first position within the bucket
        int n = 0;
        for (int w = 0; w < kPlanWarps; ++w) {
            const int c = seg[w * B + b];
            seg[w * B + b] = n;
            n += c;
        }
        count[b] = n;
    }
    __syncthreads();
    // First position and first token tile of each bucket: each thread scans a run of consecutive buckets, the
    // block scan orders the runs.
    const auto token_tiles = [&](int b) { return b < E ? (count[b] + kMaxN - 1) / kMaxN : 0; };
    const int run = (B + kThreads - 1) / kThreads;
    const int lo = min(B, tid * run), hi = min(B, lo + run);
    int2 at = make_int2(0, 0);
    for (int b = lo; b < hi; ++b) at.x += count[b], at.y += token_tiles(b);
    block_exclusive_scan<kThreads>(at);
    for (int b = lo; b < hi; ++b) {
        row0[b] = at.x, tile0[b] = at.y;
        at.x += count[b], at.y += token_tiles(b);
    }
    __syncthreads();
    for (int i = tid; i < kPlanWarps * B; i += kThreads) seg[i] += row0[i % B];  // positions in the sorted slots
    __syncthreads();
    // The slots' row addresses at their sorted positions: mine[b] holds the position of the segment's next slot in
    // bucket b, read by the whole group before its lowest lane moves it on.
    walk_segment(a, s0, s1, [&](int64_t r, int b, unsigned same) {
        const int first = b >= 0 ? mine[b] : 0;
        __syncwarp();
        if (b >= 0) {
            if (lane == __ffs(same) - 1) mine[b] = first + __popc(same);
            const int pos = first + __popc(same & ((1u << lane) - 1));
            // 32-bit division (rows < 2^30): the 64-bit one is a long call on the warp's serial path
            a.plan.in_rows[pos] = a.x + static_cast<int64_t>(static_cast<int>(r) / a.rows_per_input) * a.d;
            a.plan.out_rows[pos] = a.out + r * a.d;
        }
    });
    __syncthreads();  // the block's out_rows writes are visible to it past here
    for (int j = 0; j < count[E]; ++j) {
        float* row = a.plan.out_rows[row0[E] + j];
        for (int64_t f = tid; f < a.d; f += kThreads) row[f] = __int_as_float(0x7fc00000);
    }
    // Expert e's tiles are [F tile0[e], F tile0[e + 1]) of a list of F feature tiles per token tile, feature tile
    // major within them: tile i belongs to the last expert whose first token tile is at or before i / F (that
    // expert has tiles). Where the token tiles fit in seg (no longer needed: decode always), each token tile's
    // expert is written there first, so that a list entry takes one shared-memory load instead of a binary search
    // over the experts (8 dependent loads at 256: most of the kernel's time at decode batch 32, ~8,400 entries a
    // list). H200, 8-layer decode step at batch 32: 4.9 us a call against 9.6 with the search.
    const int tokens = tile0[E];
    int* expert_of_tile = tokens <= kPlanWarps * B ? seg : nullptr;  // [tokens]
    if (expert_of_tile) {
        __syncthreads();  // every seg read above is done
        for (int b = tid; b < E; b += kThreads)
            for (int q = tile0[b]; q < tile0[b + 1]; ++q) expert_of_tile[q] = b;
        __syncthreads();
    }
    const auto expert_of = [&](int q) {
        if (expert_of_tile) return expert_of_tile[q];
        int l = 0, h = E - 1;
        while (l < h) {
            const int mid = (l + h + 1) / 2;
            if (tile0[mid] <= q)
                l = mid;
            else
                h = mid - 1;
        }
        return l;
    };
    const auto emit = [&](Tile* tiles, int features, int width) {
        for (int i = tid; i < tokens * features; i += kThreads) {
            const int l = expert_of(i / features);
            const int nt = tile0[l + 1] - tile0[l], j = i - features * tile0[l], t = j % nt;
            tiles[i] = Tile{l, (j / nt) * width, row0[l] + t * kMaxN, min(kMaxN, count[l] - t * kMaxN)};
        }
    };
    const int f1 = static_cast<int>(a.inter / kGateUpFeatures), f2 = static_cast<int>(a.d / kDownFeatures);
    emit(a.plan.tiles1, f1, kGateUpFeatures);
    emit(a.plan.tiles2, f2, kDownFeatures);
    if (tid == 0) a.plan.tile_count[0] = tokens * f1, a.plan.tile_count[1] = tokens * f2;
}
static_assert(plan_smem_bytes(kPlanThreads, kRoutedWgmmaMaxExperts) <= 48 * 1024, "the decode plan's shared memory");

static_assert(plan_smem_bytes(kPrefillPlanThreads, kRoutedWgmmaMaxExperts) <= 227 * 1024, "the prefill plan's");

// B's bulk tensor copies over act [rows, k] bf16.
TileWidthMaps act_maps(const uint16_t* act, int64_t rows, int64_t k) {
    return tma_tile_width_maps(act, static_cast<uint64_t>(rows), static_cast<uint64_t>(2 * k), 128);
}

// The rings compiled with B by bulk tensor copies as well: prefill's and the default decode ring (the other decode
// rings are DEEPINFER_CUDA_EXPERTS_DECODE_* experiments, on cp.async only).
template <class R>
constexpr bool kTmaRing =
    std::is_same_v<R, PrefillRing> || std::is_same_v<R, PrefillRing4> || std::is_same_v<R, DecodeRing>;

// `tiles` tiles, or at most that many when p.tile_count holds their number on the device; one CTA per SM at most.
// maps (non-null, kTmaRing only): B by bulk tensor copies.
template <bool kGateUp, class R>
void launch_tiles(const Params& p, int64_t tiles, cudaStream_t stream, const TileWidthMaps* maps = nullptr) {
    static std::atomic<uint64_t> configured{0}, configured_tma{0};
    allow_smem(experts_wgmma_kernel<kGateUp, R>, R::kSmemBytes, configured);
    if (tiles == 0) return;
    Params q = p;
    q.num_tiles = static_cast<int>(tiles);
    const int grid = static_cast<int>(std::min<int64_t>(tiles, device_sm_count()));
    if constexpr (kTmaRing<R>) {
        if (maps) {
            allow_smem(experts_wgmma_tma_kernel<kGateUp, R>, R::kSmemBytes, configured_tma);
            launch_pdl(experts_wgmma_tma_kernel<kGateUp, R>, grid, R::kThreads, R::kSmemBytes, stream, q, *maps);
            DI_CUDA_LAUNCH_CHECK();
            return;
        }
    }
    DI_ICHECK(!maps, "experts_wgmma: bulk tensor copies on a ring compiled without them");
    launch_pdl(experts_wgmma_kernel<kGateUp, R>, grid, R::kThreads, R::kSmemBytes, stream, q);
    DI_CUDA_LAUNCH_CHECK();
}

// DEEPINFER_CUDA_EXPERTS_PREFILL_WGS = 2 or 4 (default): prefill's consumer warpgroups (PrefillRing or
// PrefillRing4). Read per call: tests switch it.
int prefill_consumer_warpgroups() {
    const char* var = std::getenv("DEEPINFER_CUDA_EXPERTS_PREFILL_WGS");
    const std::string env = var ? var : "4";
    DI_CHECK(env == "2" || env == "4", "DEEPINFER_CUDA_EXPERTS_PREFILL_WGS must be 2 or 4, not '", env, "'");
    return env[0] - '0';
}

// The gate/up (p, B = p.act [rows, p.k]) and down (q, B = q.act [rows, q.k]) launches on ring R, B by bulk tensor
// copies where R is compiled with them (kTmaRing) unless DEEPINFER_CUDA_EXPERTS_TMA=0 (the producer threads'
// cp.async).
template <class R>
void launch_ring(const Params& p, int64_t tiles1, const Params& q, int64_t tiles2, int64_t rows, cudaStream_t stream) {
    if constexpr (kTmaRing<R>) {
        if (tma_switch_on("DEEPINFER_CUDA_EXPERTS_TMA")) {
            const TileWidthMaps maps1 = act_maps(p.act, rows, p.k), maps2 = act_maps(q.act, rows, q.k);
            launch_tiles<true, R>(p, tiles1, stream, &maps1);
            launch_tiles<false, R>(q, tiles2, stream, &maps2);
            return;
        }
    }
    launch_tiles<true, R>(p, tiles1, stream);
    launch_tiles<false, R>(q, tiles2, stream);
}

// Prefill's products on the ring that DEEPINFER_CUDA_EXPERTS_PREFILL_WGS picks.
void launch_prefill(const Params& p, int64_t tiles1, const Params& q, int64_t tiles2, int64_t rows,
                    cudaStream_t stream) {
    if (prefill_consumer_warpgroups() == 4)
        launch_ring<PrefillRing4>(p, tiles1, q, tiles2, rows, stream);
    else
        launch_ring<PrefillRing>(p, tiles1, q, tiles2, rows, stream);
}

std::vector<ExpertPtrs> expert_ptrs(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts) {
    std::vector<ExpertPtrs> experts(num_experts);
    for (int e = 0; e < num_experts; ++e)
        experts[e] = {{w1[e].data, w3[e].data, w2[e].data}, {w1[e].scale, w3[e].scale, w2[e].scale}};
    return experts;
}

}  // namespace

bool fp4_expert_ok(const WeightDesc& w, int64_t rows, int64_t cols) {
    return w.format == 2 && w.block_cols == 32 && w.rows == rows && w.cols == cols && w.scale_cols == cols / 32 &&
           w.data && w.scale && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w.scale) % 4 == 0;
}

bool fp4_expert_lists_ok(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts,
                         int64_t inter_multiple, int64_t d_multiple) {
    // wgmma and setmaxnreg are sm_90a's: the device must be compute capability 9.0 (and the build must include 90a,
    // which the kernels check).
    if (num_experts <= 0 || device_compute_capability() != 90) return false;
    const int64_t inter = w1[0].rows, d = w1[0].cols;
    if (inter <= 0 || d <= 0 || inter % inter_multiple != 0 || d % d_multiple != 0) return false;
    if (inter > (int64_t{1} << 20) || d > (int64_t{1} << 20)) return false;  // int feature and k indices
    for (int e = 0; e < num_experts; ++e) {
        if (!fp4_expert_ok(w1[e], inter, d) || !fp4_expert_ok(w3[e], inter, d) || !fp4_expert_ok(w2[e], d, inter))
            return false;
    }
    return true;
}

bool grouped_experts_wgmma_applies(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts) {
    return fp4_expert_lists_ok(w1, w3, w2, num_experts, kGateUpFeatures, kDownFeatures);
}

std::vector<uint8_t> grouped_experts_wgmma_plan(const int64_t* run_starts, int num_experts, const WeightDesc* w1,
                                                const WeightDesc* w3, const WeightDesc* w2, int64_t d, int64_t inter) {
    DI_ICHECK(grouped_experts_wgmma_applies(w1, w3, w2, num_experts) && w1[0].cols == d && w1[0].rows == inter,
              "grouped_experts_wgmma: experts the kernels do not take (D ", d, ", I ", inter, ")");
    std::vector<uint8_t> plan = expert_tile_plan(run_starts, num_experts, d, inter, kGateUpFeatures, kDownFeatures,
                                                 PrefillRing::kMaxN, "grouped_experts_wgmma");
    // Then the experts' pointers, 16-byte aligned like the rest.
    const std::vector<ExpertPtrs> experts = expert_ptrs(w1, w3, w2, num_experts);
    static_assert(sizeof(ExpertPtrs) == 48, "plan layout");
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(experts.data());
    plan.insert(plan.end(), bytes, bytes + experts.size() * sizeof(ExpertPtrs));
    return plan;
}

std::vector<uint8_t> expert_tile_plan(const int64_t* run_starts, int num_experts, int64_t d, int64_t inter,
                                      int gate_up_features, int down_features, int max_rows, const char* who) {
    DI_ICHECK(run_starts[0] == 0 && run_starts[num_experts] < (int64_t{1} << 31), who, ": run starts 0 .. ",
              run_starts[num_experts]);
    std::vector<Tile> tiles1, tiles2;
    for (int e = 0; e < num_experts; ++e) {
        const int64_t r0 = run_starts[e], n = run_starts[e + 1] - r0;
        DI_ICHECK(n >= 0, who, ": run ", e, " has ", n, " rows");
        for (int64_t f = 0; f < inter; f += gate_up_features)
            for (int64_t t = 0; t < n; t += max_rows)
                tiles1.push_back({e, static_cast<int>(f), static_cast<int>(r0 + t),
                                  static_cast<int>(std::min<int64_t>(max_rows, n - t))});
        for (int64_t f = 0; f < d; f += down_features)
            for (int64_t t = 0; t < n; t += max_rows)
                tiles2.push_back({e, static_cast<int>(f), static_cast<int>(r0 + t),
                                  static_cast<int>(std::min<int64_t>(max_rows, n - t))});
    }
    static_assert(sizeof(Tile) == 16 && sizeof(PlanHeader) == 16, "plan layout: every part 16-byte aligned");
    const PlanHeader header{static_cast<int64_t>(tiles1.size()), static_cast<int64_t>(tiles2.size())};
    const size_t b1 = tiles1.size() * sizeof(Tile), b2 = tiles2.size() * sizeof(Tile);
    std::vector<uint8_t> plan(sizeof header + b1 + b2);
    std::memcpy(plan.data(), &header, sizeof header);
    std::memcpy(plan.data() + sizeof header, tiles1.data(), b1);
    std::memcpy(plan.data() + sizeof header + b1, tiles2.data(), b2);
    return plan;
}

void launch_grouped_experts_wgmma(float* x, int64_t rows, const std::vector<uint8_t>& plan, const void* device_plan,
                                  int64_t d, int64_t inter, float swiglu_limit, cudaStream_t stream,
                                  const float* const* in_rows, float* const* out_rows) {
    PlanHeader header;
    DI_ICHECK(plan.size() >= sizeof header, "grouped_experts_wgmma: no plan");
    std::memcpy(&header, plan.data(), sizeof header);
    if (rows == 0) return;
    const uint8_t* table = static_cast<const uint8_t*>(device_plan) + sizeof header;
    const size_t b1 = header.tiles1 * sizeof(Tile), b2 = header.tiles2 * sizeof(Tile);

    uint16_t *xb = nullptr, *h = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&xb), static_cast<size_t>(rows * d) * 2, stream));
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&h), static_cast<size_t>(rows * inter) * 2, stream));
    const int64_t chunks = rows * d / 8;
    launch_pdl(to_bf16_permuted_kernel, static_cast<unsigned>(ceil_div(chunks, 256)), 256, 0, stream, xb, x, in_rows,
               rows, static_cast<int>(d));
    DI_CUDA_LAUNCH_CHECK();

    Params p{};
    p.experts = reinterpret_cast<const ExpertPtrs*>(table + b1 + b2);
    p.tiles = reinterpret_cast<const Tile*>(table);
    p.act = xb;
    p.out = h;
    p.k = static_cast<int>(d);
    p.out_cols = static_cast<int>(inter);
    p.limit = swiglu_limit;
    Params q = p;
    q.tiles = reinterpret_cast<const Tile*>(table + b1);
    q.act = h;
    q.out = x;
    q.out_rows = out_rows;
    q.k = static_cast<int>(inter);
    q.out_cols = static_cast<int>(d);
    launch_prefill(p, header.tiles1, q, header.tiles2, rows, stream);

    DI_CUDA_CHECK(cudaFreeAsync(h, stream));
    DI_CUDA_CHECK(cudaFreeAsync(xb, stream));
}

std::vector<uint8_t> routed_experts_wgmma_table(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2,
                                                int num_experts) {
    DI_ICHECK(num_experts <= kRoutedWgmmaMaxExperts && grouped_experts_wgmma_applies(w1, w3, w2, num_experts),
              "routed_experts_wgmma: ", num_experts, " experts the kernels do not take");
    const std::vector<ExpertPtrs> experts = expert_ptrs(w1, w3, w2, num_experts);
    std::vector<uint8_t> bytes(experts.size() * sizeof(ExpertPtrs));
    std::memcpy(bytes.data(), experts.data(), bytes.size());
    return bytes;
}

void launch_routed_experts_wgmma(float* out, const float* x, const int32_t* expert_of_row, int64_t rows,
                                 int rows_per_input, const void* device_table, int num_experts, int64_t d,
                                 int64_t inter, float swiglu_limit, cudaStream_t stream, bool quantize_h,
                                 const void* fp8_table) {
    DI_ICHECK(num_experts > 0 && num_experts <= kRoutedWgmmaMaxExperts && rows_per_input > 0 &&
                  rows % rows_per_input == 0 && rows < (int64_t{1} << 30) && d > 0 && inter > 0 &&
                  d % kDownFeatures == 0 && inter % kGateUpFeatures == 0 && d <= (int64_t{1} << 20) &&
                  inter <= (int64_t{1} << 20),
              "routed_experts_wgmma: ", rows, " rows (", rows_per_input, " per input), ", num_experts, " experts, D ",
              d, ", I ", inter);
    const char* env = std::getenv("DEEPINFER_CUDA_EXPERTS_DECODE_BATCH");  // read per call: tests switch them
    const std::string batch_env = env ? env : "4";
    DI_CHECK(batch_env == "1" || batch_env == "2" || batch_env == "4",
             "DEEPINFER_CUDA_EXPERTS_DECODE_BATCH must be 1, 2 or 4, not '", batch_env, "'");
    const int batch = batch_env[0] - '0';
    const char* wgs_var = std::getenv("DEEPINFER_CUDA_EXPERTS_DECODE_WGS");
    const std::string wgs_env = wgs_var ? wgs_var : "4";
    DI_CHECK(wgs_env == "2" || wgs_env == "4", "DEEPINFER_CUDA_EXPERTS_DECODE_WGS must be 2 or 4, not '", wgs_env, "'");
    const int wgs = wgs_env[0] - '0';
    if (rows == 0) return;
    // Prefill-sized calls take prefill's rings (tiles of 128 rows), as grouped_experts_rows does; FP8 activations'
    // quantize_h keeps the decode ring at any size.
    const bool prefill = rows > kRoutedDecodeMaxSlots && !quantize_h;
    // fp8_table: decode's products on the FP8 tensor cores (experts_fp8_decode.cu), on tiles of their own height.
    const bool fp8 = fp8_table && !prefill && !quantize_h;
    const int tile_rows = prefill ? PrefillRing::kMaxN : fp8 ? kFp8DecodeTileTokens : DecodeRing::kMaxN;
    // Token tiles: sum over the touched experts of ceil(n_e / kMaxN) <= (rows + (kMaxN - 1) touched) / kMaxN.
    const int64_t token_tiles = (rows + (tile_rows - 1) * std::min<int64_t>(rows, num_experts)) / tile_rows;
    const int64_t cap1 = token_tiles * (inter / kGateUpFeatures), cap2 = token_tiles * (d / kDownFeatures);
    DI_ICHECK(cap1 < INT32_MAX && cap2 < INT32_MAX, "routed_experts_wgmma: up to ", cap1, " and ", cap2, " tiles");
    // One stream-ordered scratch: [tile counts] [in_rows] [out_rows] [tiles1] [tiles2] [xb] [h] [h in f32 when
    // quantize_h], 16-byte aligned.
    const auto up16 = [](int64_t b) { return ceil_div(b, 16) * 16; };
    const int64_t at_in = 16, at_out = at_in + up16(rows * 8), at_t1 = at_out + up16(rows * 8);
    const int64_t at_t2 = at_t1 + cap1 * 16, at_xb = at_t2 + cap2 * 16, at_h = at_xb + (fp8 ? 0 : rows * d * 2);
    const int64_t at_hf = at_h + (fp8 ? 0 : up16(rows * inter * 2));  // the FP8 products take their own scratch
    uint8_t* ws = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), at_hf + (quantize_h ? rows * inter * 4 : 0), stream));
    const DevicePlan plan{reinterpret_cast<int*>(ws), reinterpret_cast<const float**>(ws + at_in),
                          reinterpret_cast<float**>(ws + at_out), reinterpret_cast<Tile*>(ws + at_t1),
                          reinterpret_cast<Tile*>(ws + at_t2)};
    uint16_t* xb = reinterpret_cast<uint16_t*>(ws + at_xb);
    uint16_t* h = reinterpret_cast<uint16_t*>(ws + at_h);
    const PlanArgs plan_args{plan, out, x, expert_of_row, rows, d, inter, rows_per_input, num_experts};
    if (prefill) {
        static std::atomic<uint64_t> configured{0};
        constexpr auto kernel = routed_plan_kernel<PrefillRing::kMaxN, kPrefillPlanThreads>;
        allow_smem(kernel, plan_smem_bytes(kPrefillPlanThreads, kRoutedWgmmaMaxExperts), configured);
        launch_pdl(kernel, 1, kPrefillPlanThreads, plan_smem_bytes(kPrefillPlanThreads, num_experts), stream,
                   plan_args);
    } else {
        launch_pdl(fp8 ? routed_plan_kernel<kFp8DecodeTileTokens, kPlanThreads>
                       : routed_plan_kernel<DecodeRing::kMaxN, kPlanThreads>,
                   1, kPlanThreads, plan_smem_bytes(kPlanThreads, num_experts), stream, plan_args);
    }
    DI_CUDA_LAUNCH_CHECK();
    if (fp8) {
        launch_experts_fp8_decode({plan.in_rows, plan.out_rows, plan.tiles1, plan.tiles2, plan.tile_count, cap1, cap2},
                                  rows, fp8_table, d, inter, swiglu_limit, stream);
        DI_CUDA_CHECK(cudaFreeAsync(ws, stream));
        return;
    }
    // Every slot's row, the bad ids' too (their in_rows are valid token rows; no tile reads them).
    launch_pdl(to_bf16_permuted_kernel, static_cast<unsigned>(ceil_div(rows * d / 8, 256)), 256, 0, stream, xb, nullptr,
               plan.in_rows, rows, static_cast<int>(d));
    DI_CUDA_LAUNCH_CHECK();

    Params p{};
    p.experts = static_cast<const ExpertPtrs*>(device_table);
    p.tiles = plan.tiles1;
    p.tile_count = plan.tile_count;
    p.act = xb;
    p.out = quantize_h ? static_cast<void*>(ws + at_hf) : h;
    p.h_f32 = quantize_h;
    p.k = static_cast<int>(d);
    p.out_cols = static_cast<int>(inter);
    p.limit = swiglu_limit;
    Params q = p;
    q.h_f32 = false;
    q.tiles = plan.tiles2;
    q.tile_count = plan.tile_count + 1;
    q.act = h;
    q.out = nullptr;
    q.out_rows = plan.out_rows;
    q.k = static_cast<int>(inter);
    q.out_cols = static_cast<int>(d);
    using Launch = void (*)(const Params&, int64_t, const Params&, int64_t, int64_t, cudaStream_t);
    // [wgs / 4][batch / 2]
    constexpr Launch kLaunch[2][3] = {
        {launch_ring<DecodeRingOf<1, 2>>, launch_ring<DecodeRingOf<2, 2>>, launch_ring<DecodeRingOf<4, 2>>},
        {launch_ring<DecodeRingOf<1, 4>>, launch_ring<DecodeRingOf<2, 4>>, launch_ring<DecodeRingOf<4, 4>>}};
    if (prefill) {  // as launch_grouped_experts_wgmma, with the tile counts in device memory
        launch_prefill(p, cap1, q, cap2, rows, stream);
    } else if (quantize_h) {  // gate/up, h quantized into the bf16 layout, down
        using R = DecodeRing;
        launch_tiles<true, R>(p, cap1, stream);
        launch_pdl(quantize_h_kernel, static_cast<unsigned>(ceil_div(rows * (inter / kBK) * 32, 256)), 256, 0, stream,
                   h, reinterpret_cast<const float*>(ws + at_hf), rows, static_cast<int>(inter));
        DI_CUDA_LAUNCH_CHECK();
        launch_tiles<false, R>(q, cap2, stream);
    } else {
        kLaunch[wgs / 4][batch / 2](p, cap1, q, cap2, rows, stream);
    }
    DI_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

bool grouped_experts_wgmma_applies(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                                   const std::vector<LinearWeight>& w2) {
    if (w1.empty() || w3.size() != w1.size() || w2.size() != w1.size()) return false;
    const ExpertDescs d(w1, w3, w2);
    return grouped_experts_wgmma_applies(d.w1.data(), d.w3.data(), d.w2.data(), static_cast<int>(w1.size()));
}

void run_grouped_experts_wgmma_sync(float* x, const std::vector<int64_t>& run_starts,
                                    const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                                    const std::vector<LinearWeight>& w2, float swiglu_limit, cudaStream_t stream) {
    DI_ICHECK(!w1.empty() && w3.size() == w1.size() && w2.size() == w1.size() && run_starts.size() == w1.size() + 1,
              "grouped_experts_wgmma: ", w1.size(), " experts, ", run_starts.size(), " run starts");
    const ExpertDescs d(w1, w3, w2);
    const std::vector<uint8_t> plan = grouped_experts_wgmma_plan(
        run_starts.data(), static_cast<int>(w1.size()), d.w1.data(), d.w3.data(), d.w2.data(), w1[0].cols, w1[0].rows);
    void* device_plan = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(&device_plan, plan.size(), stream));
    DI_CUDA_CHECK(cudaMemcpyAsync(device_plan, plan.data(), plan.size(), cudaMemcpyHostToDevice, stream));
    launch_grouped_experts_wgmma(x, run_starts.back(), plan, device_plan, w1[0].cols, w1[0].rows, swiglu_limit, stream);
    DI_CUDA_CHECK(cudaFreeAsync(device_plan, stream));
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace deepinfer::cuda
