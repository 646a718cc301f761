// Matrix products for a few activation rows (decode). Each weight byte is read once, in 16-byte loads, and
// dequantized in registers; the activations are staged once per block in shared memory. Measured on an H200
// (gemv_bench --gemv-splits), the FP8 products at one row stream at 53-58% of the HBM rate (the 33-42 MB
// projections), the BF16 head at 99.6%. The FP8 ones wait on their loads' latency rather than on issue: 12% fewer
// instructions made wo_b no faster (bench/results/gemv_instruction_cuts_run32).
//
// Work split (256 threads = 32 groups of 8 lanes):
//  - The 8 lanes of a group read 8 consecutive 16-byte chunks (128 contiguous bytes) of one weight row per
//    step, so a warp load covers 4 whole 128-byte lines. A group owns R (1 or 2) rows of the block's tile of
//    32 * R output features and uses every activation value it reads from shared memory for all of them.
//  - K is split over a cluster of up to 8 blocks when the tiles alone cannot fill the GPU (a 2048-row expert
//    is 32 tiles) or the activation slice would not fit in shared memory; the blocks of a cluster add their
//    partial sums through distributed shared memory in rank order, so results are deterministic.
//  - The grid holds about 2 blocks per SM; blocks loop over tiles, so activations are staged once per block,
//    and each lane keeps the next batch's weight loads (kSteps a row) in flight while it computes the current one.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace chunks;

constexpr int kThreads = 256, kGroups = kThreads / 8;
constexpr int kBlocksPerSm = 2;            // occupancy the kernel is built for (registers, shared memory)
constexpr int kXBytes = 96 * 1024;         // shared memory for the staged activation slice
constexpr int kMaxCluster = 8;             // portable cluster size
// Steps (16-byte loads per row and lane) per batch: what a lane keeps in flight per row while it computes the
// previous batch. The dense kinds at 1-2 rows take 4: their decode is a shift, so the stream waits on memory
// (ncu, the head at one row: 59% of the stall cycles on global loads). FP8/FP4 keep 2: 4 at one row were mixed
// (bench/results/gemv_deeper_loads_run38: wo_a -8%, wkv +6%) and cost registers at more rows.
template <int K, int ROWS>
constexpr int kSteps = (K == kF32 || K == kBF16 || K == kF16) && ROWS <= 2 ? 4 : 2;

// log2 of the activation float4s per chunk.
template <int K>
constexpr int kQShift = K == kF32 ? 0 : (K == kBF16 || K == kF16) ? 1 : K == kFP8 ? 2 : 3;

// Floats per staged activation row for `rows` rows (a multiple of 32, see swizzle()).
constexpr int row_stride(int rows) { return kXBytes / 4 / rows / 32 * 32; }

// One weight of a launch: its rows w_row0 .. w_row0 + n_out times its own activations. A launch serves up to
// kMaxSegments weights of one kind and width (e.g. every projection of one input), its tiles numbered
// segment after segment, so small weights share the launch's waves instead of each paying for its own.
struct GemvSegment {
    WeightDesc w;          // [w.rows, w.cols]
    const float* x;        // [rows, lda] f32
    float* out;            // [rows, ldc] f32
    int64_t lda, ldc, w_row0, n_out;
    int tile0;             // the segment's first tile in the launch
    int x_vec4;            // x rows start 16-byte aligned: stage with float4 loads
};
constexpr int kMaxSegments = 12;

struct GemvParams {
    GemvSegment seg[kMaxSegments];
    int segments;
    int rows_per_group;    // 1 or 2 (tile = 32 * rows_per_group output features)
    int tiles;             // tiles of all segments
    int64_t cols;          // K, the same for every segment
    int slice_chunks;      // 16-byte chunks of K per cluster rank, a multiple of 8
    int scale_shift;       // FP8/FP4: log2(chunks per scale block along K)
};

// Activation float4 q of a staged row lives at swizzle(q): the 8 lanes of a group read chunks 8s..8s+7 and the
// same float4 of each, which without the XOR would fall into the same banks (chunks are 32..128 bytes apart).
template <int K>
__device__ __forceinline__ int swizzle(int q) {
    return K == kF32 ? q : q ^ ((q >> kQShift<K>) & 7);
}

// Independent partial sums a chunk keeps per output row (granule g adds into g % kParts): the FMAs of a chunk are
// otherwise one dependent chain per row (16 for FP8), and with ~4 warps a scheduler (128 registers a thread) that
// chain's latency, not the issue rate, set the pace (ncu: "fixed latency" 41% of the stall cycles at one row).
template <int ROWS>
constexpr int kParts = ROWS <= 2   ? 4
                       : ROWS <= 4 ? 2
                                   : 1;

// out[t, n] = sum_k x[t, k] * W[w_row0 + n, k] for t < ROWS, R (1 or 2) output rows a group. R is a template
// parameter so that the per-row guards of the unrolled body compile away (as a runtime value they were ~12% of the
// instructions, as branches). Grid: (cluster size, tile slots), cluster (cs, 1, 1).
template <int K, int ROWS, int R>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) gemv_kernel(const __grid_constant__ GemvParams p) {
    pdl_prologue();  // see pdl.cuh
    constexpr int E = kElems<K>, Q = E / 4, G = kGran<K>, P = kParts<ROWS>, kU = kSteps<K, ROWS>;
    constexpr int kStride4 = row_stride(ROWS) / 4;  // float4s per staged row
    constexpr bool kScaled = K == kFP8 || K == kFP4;
    extern __shared__ __align__(16) float4 xs[];     // [ROWS][kStride4] f32, this rank's K slice, swizzled
    __shared__ float red[ROWS][2 * kGroups];         // [ROWS, tile] partial sums for the cluster reduction

    const int l8 = threadIdx.x % 8, group = threadIdx.x / 8;
    const int cs = gridDim.x, rank = blockIdx.x;
    const int64_t chunks = p.cols / E, c_begin = static_cast<int64_t>(rank) * p.slice_chunks;
    const int nc = static_cast<int>(max(int64_t{0}, min(chunks - c_begin, int64_t{p.slice_chunks})));
    const int batches = (nc + 8 * kU - 1) / (8 * kU);
    const int tile_n = kGroups * R;
    const int lane_sw = K == kF32 ? 0 : l8;  // swizzle() of this lane's chunks: q ^ l8

    struct Batch {
        uint4 v[kU][R];
        uint32_t s[kU][R];  // raw scale bits
    };
    const float* staged_x = nullptr;  // the activations now in xs
    for (int tile = blockIdx.y; tile < p.tiles; tile += gridDim.y) {
        int si = 0;
        while (si + 1 < p.segments && tile >= p.seg[si + 1].tile0) ++si;
        const GemvSegment& sg = p.seg[si];
        const int64_t tile_in = tile - sg.tile0;
        const uint4* wdata = reinterpret_cast<const uint4*>(sg.w.data);
        const uint4* wrow[R];
        int64_t srow[R], n[R];
        for (int r = 0; r < R; ++r) {
            n[r] = tile_in * tile_n + group + kGroups * r;
            const int64_t row = sg.w_row0 + min(n[r], sg.n_out - 1);  // rows past the end compute a copy, unwritten
            wrow[r] = wdata + row * chunks + c_begin;
            srow[r] = (K == kFP8 ? row / sg.w.block_rows : row) * sg.w.scale_cols;
        }
        auto load = [&](Batch& b, int batch) {
            for (int u = 0; u < kU; ++u) {
                const int c = l8 + 8 * (batch * kU + u);
                for (int r = 0; r < R; ++r) {
                    const bool ok = c < nc;
                    b.v[u][r] = ok ? __ldg(wrow[r] + c) : make_uint4(0, 0, 0, 0);
                    b.s[u][r] = 0;
                    if constexpr (kScaled) {
                        const int64_t at = srow[r] + ((c_begin + c) >> p.scale_shift);
                        const uint32_t* s32 = reinterpret_cast<const uint32_t*>(sg.w.scale);
                        if (ok) b.s[u][r] = K == kFP8 && sg.w.scale_f32 ? __ldg(s32 + at) : __ldg(sg.w.scale + at);
                    }
                }
            }
        };
        Batch cur;
        load(cur, 0);  // in flight while the activations are staged
        if (staged_x != sg.x) {  // uniform over the block: every thread walks the same tiles
            if (staged_x) __syncthreads();  // the previous tile's reads of xs are done
            const int n4 = nc * Q;
            const float* xb = sg.x + c_begin * E;
            for (int i = threadIdx.x; i < ROWS * n4; i += kThreads) {
                const int t = i / n4, q = i - t * n4;
                const float* src = xb + t * sg.lda + 4 * q;
                xs[t * kStride4 + swizzle<K>(q)] = sg.x_vec4 ? *reinterpret_cast<const float4*>(src)
                                                             : make_float4(src[0], src[1], src[2], src[3]);
            }
            __syncthreads();
            staged_x = sg.x;
        }
        float acc[R][ROWS] = {};
        for (int b = 0; b < batches; ++b) {
            Batch nxt;
            load(nxt, b + 1);  // loads past the slice are skipped, so the last batch prefetches nothing
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                const int c = l8 + 8 * (b * kU + u);
                if (c >= nc) break;
                const int q0 = (c * Q) ^ lane_sw;  // swizzled float4 index of the chunk's first activation
                float d[P][R][ROWS] = {};          // the chunk's partial sums, before its scale
#pragma unroll
                for (int g = 0; g < E / G; ++g) {
                    float wf[R][G];
#pragma unroll
                    for (int r = 0; r < R; ++r) decode<K>(cur.v[u][r], g, wf[r]);
#pragma unroll
                    for (int h = 0; h < G / 4; ++h) {
                        const float4* xp = xs + (q0 ^ (g * (G / 4) + h));
#pragma unroll
                        for (int t = 0; t < ROWS; ++t) {
                            const float4 xv = xp[t * kStride4];
#pragma unroll
                            for (int r = 0; r < R; ++r) {
                                const float* wv = wf[r] + 4 * h;
                                float& a = d[g % P][r][t];
                                a = fmaf(wv[0], xv.x, a);
                                a = fmaf(wv[1], xv.y, a);
                                a = fmaf(wv[2], xv.z, a);
                                a = fmaf(wv[3], xv.w, a);
                            }
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float s = 1.0f;
                    if constexpr (kScaled) {
                        const uint32_t sb = cur.s[u][r];
                        s = K == kFP8 && sg.w.scale_f32 ? __uint_as_float(sb) : e8m0_to_f32(static_cast<uint8_t>(sb));
                    }
#pragma unroll
                    for (int t = 0; t < ROWS; ++t) {
                        float sum = d[0][r][t];
#pragma unroll
                        for (int q = 1; q < P; ++q) sum += d[q][r][t];
                        acc[r][t] = kScaled ? fmaf(sum, s, acc[r][t]) : acc[r][t] + sum;
                    }
                }
            }
            cur = nxt;
        }

        // Sum the 8 lanes of each group (fixed butterfly), then the cluster's ranks in rank order.
        const float post = K == kFP4 ? 64.0f : 1.0f;  // undo the FP4 decode's 2^-6
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int t = 0; t < ROWS; ++t) {
                float a = acc[r][t];
                a += __shfl_xor_sync(0xffffffffu, a, 1);
                a += __shfl_xor_sync(0xffffffffu, a, 2);
                a += __shfl_xor_sync(0xffffffffu, a, 4);
                if (l8 == 0) {
                    if (cs == 1) {
                        if (n[r] < sg.n_out) sg.out[t * sg.ldc + n[r]] = a * post;
                    } else {
                        red[t][group + kGroups * r] = a;
                    }
                }
            }
        }
        if (cs > 1) {
            cg::cluster_group cluster = cg::this_cluster();
            cluster.sync();
            for (int i = threadIdx.x + kThreads * rank; i < ROWS * tile_n; i += kThreads * cs) {
                const int t = i / tile_n, j = i - t * tile_n;
                float a = 0.0f;
                for (int q = 0; q < cs; ++q) a += cluster.map_shared_rank(&red[0][0], q)[t * 2 * kGroups + j];
                const int64_t nn = tile_in * tile_n + j;
                if (nn < sg.n_out) sg.out[t * sg.ldc + nn] = a * post;
            }
            cluster.sync();  // red is rewritten by the next tile and must outlive the other ranks' reads
        }
    }
}

int64_t slice_chunks(int64_t chunks, int cs) { return ceil_div(ceil_div(chunks, cs), 8) * 8; }

template <int K, int ROWS, int R>
void launch(const GemvParams& p, int cs, int slots, cudaStream_t stream) {
    auto kernel = gemv_kernel<K, ROWS, R>;
    static std::atomic<uint64_t> configured{0};
    allow_smem(kernel, ROWS * row_stride(ROWS) * 4, configured);
    // Every row but the last is a full stride apart; the last holds just the slice.
    const int smem = ((ROWS - 1) * row_stride(ROWS) + p.slice_chunks * kElems<K>) * 4;
    launch_clustered_pdl(kernel, dim3(cs, slots), cs, kThreads, smem, stream, p);
}

// Whether 2 output rows a group fit the registers: FP8/FP4 at 7-8 activation rows spill (ptxas), so they take 1.
constexpr bool pairs_fit(int kind, int64_t rows) { return !((kind == kFP8 || kind == kFP4) && rows >= 7); }

// launch<K, rows, R> for rows in 1 .. kGemvMaxRows (never an instantiation that spills: see pairs_fit).
template <int K, int R, int ROWS = 1>
void launch_rows(const GemvParams& p, int rows, int cs, int slots, cudaStream_t stream) {
    if constexpr (ROWS < kGemvMaxRows) {
        if (rows > ROWS) return launch_rows<K, R, ROWS + 1>(p, rows, cs, slots, stream);
    }
    if constexpr (R == 1 || pairs_fit(K, ROWS))
        launch<K, ROWS, R>(p, cs, slots, stream);
    else
        DI_CHECK(false, "gemv: 2 rows a group at ", ROWS, " rows");
}

template <int K>
void launch_kind(const GemvParams& p, int rows, int cs, int slots, cudaStream_t stream) {
    if (p.rows_per_group == 2)
        launch_rows<K, 2>(p, rows, cs, slots, stream);
    else
        launch_rows<K, 1>(p, rows, cs, slots, stream);
}

}  // namespace

bool gemv_applies(int64_t rows, const WeightDesc& w) {
    if (rows < 1 || rows > kGemvMaxRows) return false;
    const int e = elems_of(kind_of(w));
    // Whole 16-byte chunks per row (so rows stay 16-byte aligned), each inside one scale block, and a
    // power-of-two number of chunks per scale block (a shift finds a chunk's scale).
    if (w.cols % e != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
    if (w.format != 0) {
        const int cpb = w.block_cols / e;
        if (w.block_cols % e != 0 || (cpb & (cpb - 1)) != 0) return false;
    }
    // The activations of one rank of the largest cluster fit in shared memory.
    return slice_chunks(w.cols / e, kMaxCluster) * e <= row_stride(static_cast<int>(rows));
}

namespace {

// A split forced by set_gemv_split (gemv_bench's sweep): rows per group and cluster size, 0 when none.
std::atomic<int> forced_rows_per_group{0}, forced_cluster{0};

// One launch over jobs[0 .. n) (same kind and K, at most kMaxSegments).
void launch_segments(const GemvJob* jobs, int n, int64_t rows, cudaStream_t stream) {
    const WeightDesc& w0 = jobs[0].w;
    const int kind = kind_of(w0), e = elems_of(kind);
    const int64_t sms = device_sm_count(), chunks = w0.cols / e, target = sms * kBlocksPerSm;
    GemvParams p{};
    p.segments = n;
    p.cols = w0.cols;
    // Two rows per group (activations reused twice, twice the loads in flight) from 2 activation rows and for the
    // dense kinds; FP8/FP4 at one row take the smaller tiles, whose K splits fill the GPU with less reduction
    // (gemv_bench --gemv-splits on an H200: wo_b [4096 x 8192] at one row 14.2 us as 1 x 2 against 16.3 as 2 x 2;
    // the bf16 head [129280 x 4096] at one row 249 us with 2 rows a group and 4 steps, 329 with 1 and 2).
    p.rows_per_group = rows >= 2 || kind == kF32 || kind == kBF16 || kind == kF16 ? 2 : 1;
    if (const int forced = forced_rows_per_group.load(std::memory_order_relaxed)) p.rows_per_group = forced;
    if (!pairs_fit(kind, rows)) p.rows_per_group = 1;
    int64_t tiles = 0;
    for (int i = 0; i < n; ++i) {
        const GemvJob& j = jobs[i];
        p.seg[i] = GemvSegment{j.w, j.x, j.out, j.lda, j.ldc, j.w_row0, j.n_out, static_cast<int>(tiles),
                               reinterpret_cast<uintptr_t>(j.x) % 16 == 0 && j.lda % 4 == 0};
        tiles += ceil_div(j.n_out, kGroups * p.rows_per_group);
    }
    // Split K: until the slice fits in shared memory, then until about one block per SM (7/8 of the SMs; a wave of
    // 2 blocks per SM made the small products slower: more ranks to reduce, each with few chunks) while each rank
    // keeps two steps (16 chunks) of every row; at one activation row once more towards 2 blocks per SM when each
    // rank keeps 64 chunks (the large K: wo_b, the shared expert). Measured per shape: gemv_bench --gemv-splits.
    int cs = 1;
    while (slice_chunks(chunks, cs) * e > row_stride(static_cast<int>(rows))) cs *= 2;
    const int min_cs = cs;
    while (cs < kMaxCluster && tiles * cs < sms - sms / 8 && chunks >= 16 * cs * 2) cs *= 2;
    if (rows == 1 && cs < kMaxCluster && tiles * cs <= sms && chunks >= 128 * cs) cs *= 2;
    if (const int forced = forced_cluster.load(std::memory_order_relaxed)) {
        DI_CHECK(forced >= min_cs, "gemv: a cluster of ", forced, " leaves the activation slice too large");
        cs = forced;
    }
    p.tiles = static_cast<int>(tiles);
    p.slice_chunks = static_cast<int>(slice_chunks(chunks, cs));
    if (w0.format != 0) p.scale_shift = __builtin_ctz(static_cast<unsigned>(w0.block_cols / e));
    const int slots = static_cast<int>(std::min<int64_t>(tiles, std::max<int64_t>(1, target / cs)));
    const int r = static_cast<int>(rows);
    if (kind == kF32)
        launch_kind<kF32>(p, r, cs, slots, stream);
    else if (kind == kBF16)
        launch_kind<kBF16>(p, r, cs, slots, stream);
    else if (kind == kF16)
        launch_kind<kF16>(p, r, cs, slots, stream);
    else if (kind == kFP8)
        launch_kind<kFP8>(p, r, cs, slots, stream);
    else
        launch_kind<kFP4>(p, r, cs, slots, stream);
}

// Jobs that can share a launch: one kernel instantiation (kind), one K, and for scaled formats one scale
// block width (the chunk-to-scale shift is per launch).
bool same_launch(const GemvJob& a, const GemvJob& b) {
    return kind_of(a.w) == kind_of(b.w) && a.w.cols == b.w.cols && a.w.format == b.w.format &&
           (a.w.format == 0 || a.w.block_cols == b.w.block_cols);
}

}  // namespace

bool set_gemv_split(int rows_per_group, int cluster) {
    const bool none = rows_per_group == 0 && cluster == 0;
    const bool valid =
        (rows_per_group == 1 || rows_per_group == 2) && (cluster == 1 || cluster == 2 || cluster == 4 || cluster == 8);
    if (!none && !valid) return false;
    forced_rows_per_group.store(rows_per_group, std::memory_order_relaxed);
    forced_cluster.store(cluster, std::memory_order_relaxed);
    return true;
}

void launch_gemv_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    // Jobs in their given order, consecutive compatible ones in one launch.
    for_each_shared_launch(jobs, count, kMaxSegments, same_launch,
                           [&](const GemvJob* first, int n) { launch_segments(first, n, rows, stream); });
}

}  // namespace deepinfer::cuda
