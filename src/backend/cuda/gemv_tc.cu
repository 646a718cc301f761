// Products of 2..32 activation rows on the tensor cores (batched decode). The fp32 GEMV (gemv.cu) does a fused
// multiply-add per weight and row, so at 8 rows it runs out of arithmetic long before the weights stream at the
// card's bandwidth; here one mma.sync m16n8k16 takes 16 weights of 8 features for all rows at once.
//
// Roles: A = the activations (16 rows, zero past the real ones; 17..32 rows take two such tiles, each weight
// fragment feeding both), B = W^T (16 k x 8 features), C = out [16 rows, 8 features] f32. Lane (g = lane / 4,
// c = lane % 4) supplies B for feature g and A for rows g and g + 8.
// The dot product does not care which k meets which, so the mma's 16 logical k of a step are mapped to
// physical k as: lane c's logical pairs {2c, 2c+1} and {2c+8, 2c+9} are physical 4 consecutive weights
// c * E + 4j .. c * E + 4j + 3 of its 16-byte weight chunk (E weights), step j = 0 .. E/4 - 1. So each lane
// reads one 16-byte chunk of its feature's row per E/4 steps and the same 4c-strided activations, and a warp's
// 4 lanes of a feature read 64 contiguous bytes.
//
// Block: 8 warps = 2 feature halves (16 features each) x 4 K quarters, 32 features per tile; a cluster of cs
// blocks splits K further (their partials added in rank order through distributed shared memory). Several
// products of one weight kind and K (the projections of one input, the groups of a grouped linear) share a
// launch, their tiles laid end to end. Weights stream through a per-warp ring of cp.async stages (see the
// kernel). Weights are dequantized to bf16 in registers (FP8 and FP4 times power-of-two scales exactly; f32
// weights and fp32 scales round), activations are rounded to bf16 once when staged: the numerics of the
// tensor-core GEMM.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace chunks;

constexpr int kThreads = 256;
constexpr int kFeatureWarps = 2, kKWarps = 4;  // warps along features and along K
constexpr int kMaxRows = 32;                   // activation rows at most: two m16 MMA tiles
constexpr int kPad = 8;                        // bf16 padding per staged row (rotates the banks)
constexpr int kRingBytes = 32 * 1024;          // weight chunks in flight per block (see kStages)
constexpr int kMaxCluster = 8;
constexpr int kMaxJobs = 8;  // products per launch

// K staged per cluster rank for MT m16 tiles of rows (the staged bytes stay about the same).
constexpr int slice_k(int mt) { return 2048 / mt; }
// Staged activations per block at most: bf16 rows of a rank's slice plus padding, the larger of the two shapes.
constexpr int stage_bytes(int mt) { return 16 * mt * (slice_k(mt) + kPad) * 2; }
constexpr int kStageBytes = stage_bytes(1) > stage_bytes(2) ? stage_bytes(1) : stage_bytes(2);
// Groups of 8 features per warp, at every row count: two (a tile of 32 features) share each activation fragment
// read from shared memory and halve the tiles' fixed costs (the K quarters' and the cluster's reductions, about as
// many issued instructions as the main loop with one group at 8 rows; ncu). On the H200 at 8 rows (gemv_bench,
// one group -> two): wq_b 31.1 -> 26.3 us, wo_b 53.5 -> 41.5, wo_a (8 groups) 34.0 -> 27.6, wq_a 13.8 -> 10.8
// (wkv 8.5 -> 9.2); the 8-layer V4-Flash decode step at batch 8 4.79 -> 4.57 ms.
constexpr int kGroupsPerWarp = 2;
constexpr int kTile = 8 * kFeatureWarps * kGroupsPerWarp;  // features per tile
// Stages of a warp's weight ring: 32 KiB a block, so 16 warps an SM keep up to ~56 KiB of weights in flight
// (two chunks a lane held in registers allowed ~24 KiB). On the H200 this took the 8-layer V4-Flash decode step
// from 11.3 to 10.6 ms at 32 rows and left 8 rows unchanged; the kernel still streams well below the HBM's rate
// at 16-32 rows (bench/results/gemv_tc_*.txt), the next thing to find out being why.
constexpr int kStages = kRingBytes / (kThreads / 32) / (kGroupsPerWarp * 32 * 16);

// One product of a launch; its tiles are tiles tile0 .. tile0 + ceil(n_out / tile) - 1 of the launch. Its
// weight's layout is the launch's `w`, its data and scales are its own.
struct TcJob {
    const uint8_t* data;
    const uint8_t* scale;
    const float* x;  // [rows, lda] f32
    float* out;      // [rows, ldc] f32
    int64_t lda, ldc, w_row0, n_out;
    int tile0;
    int x_vec4;  // x rows 16-byte aligned: stage with float4 loads
};

// The jobs of a launch share the weight kind, K, the scale layout, the row count and so the cluster size.
struct GemvTcParams {
    WeightDesc w;  // the layout the jobs' weights share (data and scale: the first job's)
    TcJob jobs[kMaxJobs];
    int num_jobs, tiles, rows;
    int slice_blocks;  // k blocks (4 E weights) per cluster rank
    int scale_shift;   // FP8: log2(k blocks per 128-wide scale block); FP4: 0 (a chunk is one group)
};

// The activations x [rows, k0 .. k0 + n) (x points at k0) as bf16 rows of `stride` in xs, 4 per step (16-byte
// loads when aligned), 4 loads in flight.
__device__ __forceinline__ void stage_x(uint16_t* xs, int stride, const float* x, int64_t lda, int vec4, int rows,
                                        int n) {
    const int per_row = n / 4, total = rows * per_row;
    for (int i0 = threadIdx.x; i0 < total; i0 += 4 * kThreads) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * kThreads;
            if (i >= total) break;
            const int t = i / per_row, k4 = 4 * (i - t * per_row);
            const float* src = x + t * lda + k4;
            v[u] = vec4 ? __ldg(reinterpret_cast<const float4*>(src)) : make_float4(src[0], src[1], src[2], src[3]);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * kThreads;
            if (i >= total) break;
            const int t = i / per_row, k4 = 4 * (i - t * per_row);
            *reinterpret_cast<uint2*>(xs + t * stride + k4) =
                make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
        }
    }
}

// MT m16 tiles of rows: each dequantized weight fragment feeds MT MMAs, and each warp serves NF groups of 8
// features (kGroupsPerWarp), so that each activation fragment read from shared memory feeds NF MMAs too: with 32
// rows, one group would need 8 16-byte shared loads per lane for 512 bytes of FP8 weights a warp, more than the
// shared memory delivers at the HBM's rate. Block y of the grid takes a contiguous range of the launch's tiles
// (so it restages activations only where its range crosses into a job with other inputs); every rank of a
// cluster takes the same range.
template <int K, int MT>
__global__ void __launch_bounds__(kThreads, 2) gemv_tc_kernel(const __grid_constant__ GemvTcParams p) {
    pdl_prologue();  // see pdl.cuh
    constexpr int E = kElems<K>, KB = 4 * E, W2 = E / 2;  // weights per chunk, k per block, words per chunk
    constexpr int kRowsT = 16 * MT, NF = kGroupsPerWarp, S = kStages;
    // Dynamic shared memory: the staged activations, [p.rows][stride] bf16 (this rank's K slice), then each
    // warp's ring of weight chunks, [warps][S][NF][32 lanes] 16 bytes, which the K quarters' partial sums
    // red [kKWarps][kTile][kRowsT] f32 overlay once the chunks are consumed, then the rings of their scales'
    // words, [warps][S][NF][32 lanes] 4 bytes.
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* const xs = reinterpret_cast<uint16_t*>(smem);
    const int slot = (threadIdx.x / 32) * (S * NF * 32) + threadIdx.x % 32;
    uint4* const ring = reinterpret_cast<uint4*>(smem + kStageBytes) + slot;
    uint32_t* const ring_scales = reinterpret_cast<uint32_t*>(smem + kStageBytes + kRingBytes) + slot;
    auto& red = *reinterpret_cast<float(*)[kKWarps][kTile][kRowsT]>(smem + kStageBytes);
    static_assert(sizeof(float) * kKWarps * kTile * kRowsT <= kRingBytes, "red fits in the rings");

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c = lane % 4, wf = warp % kFeatureWarps, wk = warp / kFeatureWarps;
    const int cs = gridDim.x, rank = blockIdx.x;
    const int64_t blocks = p.w.cols / KB, kb0 = static_cast<int64_t>(rank) * p.slice_blocks;
    const int nkb = static_cast<int>(max(int64_t{0}, min(blocks - kb0, int64_t{p.slice_blocks})));
    const int stride = p.slice_blocks * KB + kPad;
    const uint16_t* xrow = xs + g * stride + c * E;  // row g's activations at this lane's offset in a block

    const int per_block = (p.tiles + gridDim.y - 1) / gridDim.y;
    const int tile_begin = blockIdx.y * per_block, tile_end = min(tile_begin + per_block, p.tiles);
    const float* staged = nullptr;  // the x the shared memory holds
#pragma unroll 1
    for (int tile = tile_begin; tile < tile_end; ++tile) {
        int j = 0;
        while (j + 1 < p.num_jobs && p.jobs[j + 1].tile0 <= tile) ++j;
        const TcJob& job = p.jobs[j];
        const int64_t chunks_per_row = p.w.cols / E;
        // This lane's features: group nf's feature g. Their scales: FP8 one per 128 k (a k block of 64 lies in
        // one), FP4 one per 32 (one chunk).
        const bool scale_f32 = K == kFP8 && p.w.scale_f32;
        const uint4* wrow[NF];
        const uint8_t* scales[NF];
#pragma unroll
        for (int nf = 0; nf < NF; ++nf) {
            const int64_t n = static_cast<int64_t>(tile - job.tile0) * kTile + (wf * NF + nf) * 8 + g;
            const int64_t row = job.w_row0 + min(n, job.n_out - 1);  // past the end: a copy, never written
            wrow[nf] = reinterpret_cast<const uint4*>(job.data) + row * chunks_per_row + kb0 * 4 + c;
            scales[nf] = job.scale + (K == kFP8 ? row / p.w.block_rows : row) * p.w.scale_cols * (scale_f32 ? 4 : 1);
        }

        // This warp's k blocks are wk, wk + 4, ...: its i-th goes into ring stage i % S, 16 bytes a lane and
        // feature group by cp.async straight into the lane's own slot (no lane reads another's). FP4 streams a
        // scale byte per chunk: the 4 lanes of a feature fetch the aligned word holding their 4 (scale rows are
        // whole words: K / 32 is a multiple of 4) into their scale slots alike. FP8's scales (one per 128 x 128
        // weights) are read when used, from L1 or L2.
        auto scale_at = [&](int nf, int kb) {  // the scale's byte address
            if constexpr (K == kFP8)
                return scales[nf] + (static_cast<int64_t>((kb0 + kb) >> p.scale_shift) << (scale_f32 ? 2 : 0));
            return scales[nf] + (kb0 + kb) * 4 + c;
        };
        auto issue = [&](int i) {
            const int kb = wk + kKWarps * i, stage = i % S;
            if (kb < nkb) {
#pragma unroll
                for (int nf = 0; nf < NF; ++nf) {
                    mma::cp_async16(ring + (stage * NF + nf) * 32, wrow[nf] + 4 * kb, 16);
                    if constexpr (K == kFP4) mma::cp_async4(ring_scales + (stage * NF + nf) * 32, scale_at(nf, kb) - c);
                }
            }
            asm volatile("cp.async.commit_group;\n" ::);  // empty past the end: the group count stays uniform
        };
        float acc[MT][NF][4] = {};
        const int iters = (nkb - wk + kKWarps - 1) / kKWarps;  // this warp's k blocks
#pragma unroll
        for (int i = 0; i < S - 1; ++i) issue(i);  // in flight while the activations are staged
        if (staged != job.x) {
            // The previous tile's reads of xs ended before its closing barrier.
            stage_x(xs, stride, job.x + kb0 * KB, job.lda, job.x_vec4, p.rows, nkb * KB);
            __syncthreads();
            staged = job.x;
        }
        // FP8: the raw scale bits (E8M0 byte or f32) of this warp's next k block, loaded one step ahead so that
        // their L1/L2 latency overlaps a step's work instead of following the weights' wait (ncu at 8 rows: the
        // conversion of a scale loaded in the step was the main loop's second largest stall).
        uint32_t scale_bits[NF];
        auto load_scales = [&](int kb) {
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
                const uint8_t* at = scale_at(nf, kb);
                scale_bits[nf] = scale_f32 ? __ldg(reinterpret_cast<const uint32_t*>(at)) : __ldg(at);
            }
        };
        if constexpr (K == kFP8) {
            if (iters > 0) load_scales(wk);
        }
        for (int i = 0; i < iters; ++i) {
            // Stage (i - 1) % S was read in the previous step: refill it with k block i + S - 1, then wait
            // for k block i (all but the S - 1 newest groups complete).
            issue(i + S - 1);
            asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
            const int stage = i % S, kb = wk + kKWarps * i;
            uint4 v[NF];
            float sc[NF];
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
                v[nf] = ring[(stage * NF + nf) * 32];
                sc[nf] = 1.0f;
                if constexpr (K == kFP4) {
                    sc[nf] = e8m0_to_f32((ring_scales[(stage * NF + nf) * 32] >> (8 * c)) & 0xff);
                } else if constexpr (K == kFP8) {
                    sc[nf] = scale_f32 ? __uint_as_float(scale_bits[nf]) : e8m0_to_f32(scale_bits[nf]);
                }
            }
            if constexpr (K == kFP8) {
                if (i + 1 < iters) load_scales(kb + kKWarps);
            }
            uint32_t wb[NF][W2];
            // FP4's decode gives 2^-6 times the value: fold 64 into the scale.
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) chunk_to_bf16<K>(v[nf], K == kFP4 ? sc[nf] * 64.0f : sc[nf], wb[nf]);
            // Rows g + 8 h + 16 mt of the activations at this lane's k positions (zero past p.rows), 8 at a
            // time (two MMA steps; f32 weights: 4, one step).
            constexpr int kSteps = E / 4 < 2 ? E / 4 : 2;
#pragma unroll
            for (int q = 0; q < (E / 4) / kSteps; ++q) {
                uint32_t xa[MT][2][4] = {};
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        if (g + 8 * h + 16 * mt >= p.rows) continue;
                        const uint16_t* xp = xrow + (h * 8 + mt * 16) * stride + kb * KB + 8 * q;
                        if constexpr (kSteps == 2) {
                            const uint4 v = *reinterpret_cast<const uint4*>(xp);
                            xa[mt][h][0] = v.x, xa[mt][h][1] = v.y, xa[mt][h][2] = v.z, xa[mt][h][3] = v.w;
                        } else {
                            const uint2 v = *reinterpret_cast<const uint2*>(xp);
                            xa[mt][h][0] = v.x, xa[mt][h][1] = v.y;
                        }
                    }
                }
#pragma unroll
                for (int jj = 0; jj < kSteps; ++jj) {
                    const int s = kSteps * q + jj;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int nf = 0; nf < NF; ++nf)
                            mma_bf16(acc[mt][nf], xa[mt][0][2 * jj], xa[mt][1][2 * jj], xa[mt][0][2 * jj + 1],
                                     xa[mt][1][2 * jj + 1], wb[nf][2 * s], wb[nf][2 * s + 1]);
                }
            }
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();  // red below overlays the other warps' rings

        // acc[mt][nf][0..1]: row g + 16 mt, features 2c, 2c + 1 of group nf; acc[mt][nf][2..3]: row g + 8 + 16 mt.
        // Sum the K quarters, then the cluster's ranks, in fixed order.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int nf = 0; nf < NF; ++nf) {
                const int f = (wf * NF + nf) * 8 + 2 * c;
                red[wk][f][g + 16 * mt] = acc[mt][nf][0];
                red[wk][f + 1][g + 16 * mt] = acc[mt][nf][1];
                red[wk][f][g + 8 + 16 * mt] = acc[mt][nf][2];
                red[wk][f + 1][g + 8 + 16 * mt] = acc[mt][nf][3];
            }
        }
        __syncthreads();
        constexpr int kOut = kTile * kRowsT;
        float* part = &red[0][0][0];  // after the sum below: [kTile][kRowsT] of this rank, in red[1]
        for (int i = threadIdx.x; i < kOut; i += kThreads) {
            const int f = i / kRowsT, r = i % kRowsT;
            float s = red[0][f][r];
#pragma unroll
            for (int q = 1; q < kKWarps; ++q) s += red[q][f][r];
            part[i + kOut] = s;  // red[1][f][r]: only this thread reads that element
        }
        const int64_t f0 = static_cast<int64_t>(tile - job.tile0) * kTile;
        if (cs == 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < kOut; i += kThreads) {
                const int f = i / kRowsT, r = i % kRowsT;
                if (r < p.rows && f0 + f < job.n_out) job.out[r * job.ldc + f0 + f] = part[i + kOut];
            }
            __syncthreads();  // red is rewritten by the next tile
        } else {
            cg::cluster_group cluster = cg::this_cluster();
            cluster.sync();
            for (int i = threadIdx.x + kThreads * rank; i < kOut; i += kThreads * cs) {
                float s = 0.0f;
                for (int q = 0; q < cs; ++q) s += cluster.map_shared_rank(part, q)[i + kOut];
                const int f = i / kRowsT, r = i % kRowsT;
                if (r < p.rows && f0 + f < job.n_out) job.out[r * job.ldc + f0 + f] = s;
            }
            cluster.sync();  // the other ranks' reads of red are done before the next tile rewrites it
        }
    }
}

template <int K, int MT>
void launch(const GemvTcParams& p, int cs, int slots, cudaStream_t stream) {
    auto kernel = gemv_tc_kernel<K, MT>;
    const int smem = kStageBytes + kRingBytes + kRingBytes / 4;
    static std::atomic<uint64_t> configured{0};
    allow_smem(kernel, smem, configured);
    launch_clustered_pdl(kernel, dim3(cs, slots), cs, kThreads, smem, stream, p);
}

template <int K>
void launch_rows(const GemvTcParams& p, int cs, int slots, cudaStream_t stream) {
    if (p.rows > 16)
        launch<K, 2>(p, cs, slots, stream);
    else
        launch<K, 1>(p, cs, slots, stream);
}

// Jobs one launch can share: the same weight kind, K and scale layout.
bool same_launch(const GemvJob& a, const GemvJob& b) {
    return kind_of(a.w) == kind_of(b.w) && a.w.cols == b.w.cols && a.w.block_cols == b.w.block_cols &&
           a.w.block_rows == b.w.block_rows && a.w.scale_f32 == b.w.scale_f32;
}

void launch_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    const WeightDesc& w = jobs[0].w;
    const int kind = kind_of(w), e = elems_of(kind), kb = 4 * e, mt = rows > 16 ? 2 : 1;
    GemvTcParams p{};
    p.w = w;
    p.num_jobs = count;
    p.rows = static_cast<int>(rows);
    int64_t tiles = 0;
    for (int i = 0; i < count; ++i) {
        const GemvJob& j = jobs[i];
        p.jobs[i] = {j.w.data,
                     j.w.scale,
                     j.x,
                     j.out,
                     j.lda,
                     j.ldc,
                     j.w_row0,
                     j.n_out,
                     static_cast<int>(tiles),
                     reinterpret_cast<uintptr_t>(j.x) % 16 == 0 && j.lda % 4 == 0};
        tiles += ceil_div(j.n_out, kTile);
    }
    DI_CHECK(tiles <= INT32_MAX, "gemv_tc: ", tiles, " tiles");
    p.tiles = static_cast<int>(tiles);
    const int64_t blocks = w.cols / kb;
    const int64_t target = static_cast<int64_t>(device_sm_count()) * 2;  // blocks per SM: shared memory
    // Split K: until the slice fits the staged activations, then while the blocks stay within one wave and
    // each warp keeps at least 4 k blocks.
    int cs = 1;
    while (ceil_div(blocks, cs) * kb > slice_k(mt)) cs *= 2;
    while (cs < kMaxCluster && tiles * cs * 2 <= target && blocks >= int64_t{kKWarps} * 4 * cs * 2) cs *= 2;
    DI_CHECK(cs <= kMaxCluster, "gemv_tc: K = ", w.cols, " needs more than ", kMaxCluster, " ranks");
    p.slice_blocks = static_cast<int>(ceil_div(blocks, cs));
    if (w.format == 1) p.scale_shift = __builtin_ctz(static_cast<unsigned>(w.block_cols / kb));
    const int slots = static_cast<int>(std::min<int64_t>(tiles, std::max<int64_t>(1, target / cs)));
    switch (kind) {
        case kF32:
            launch_rows<kF32>(p, cs, slots, stream);
            break;
        case kBF16:
            launch_rows<kBF16>(p, cs, slots, stream);
            break;
        case kF16:
            launch_rows<kF16>(p, cs, slots, stream);
            break;
        case kFP8:
            launch_rows<kFP8>(p, cs, slots, stream);
            break;
        default:
            launch_rows<kFP4>(p, cs, slots, stream);
            break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool gemv_tc_applies(int64_t rows, const WeightDesc& w) {
    if (rows < 2 || rows > kMaxRows) return false;
    const int e = elems_of(kind_of(w));
    // Whole k blocks of 4 chunks per row, 16-byte aligned rows, each chunk inside one scale block, and K within
    // the staged slices of a full cluster.
    if (w.cols % (4 * e) != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
    if (w.cols > int64_t{kMaxCluster} * slice_k(rows > 16 ? 2 : 1)) return false;
    if (w.format == 1) {  // FP8: a power-of-two number of k blocks per scale block along K
        const int per = w.block_cols / (4 * e);
        return w.block_cols % (4 * e) == 0 && (per & (per - 1)) == 0;
    }
    // FP4: one scale group per chunk, scale rows streamed in aligned words.
    if (w.format == 2) return w.block_cols == e && reinterpret_cast<uintptr_t>(w.scale) % 4 == 0;
    return true;
}

void launch_gemv_tc_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    // Jobs in their given order, consecutive compatible ones in one launch.
    for_each_shared_launch(jobs, count, kMaxJobs, same_launch,
                           [&](const GemvJob* first, int n) { launch_jobs(first, n, rows, stream); });
}

}  // namespace deepinfer::cuda
