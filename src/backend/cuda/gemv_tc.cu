// Products of 2..16 activation rows on the tensor cores (batched decode). The fp32 GEMV (gemv.cu) does a fused
// multiply-add per weight and row, so at 8 rows it runs out of arithmetic long before the weights stream at the
// card's bandwidth; here one mma.sync m16n8k16 takes 16 weights of 8 features for all rows at once.
//
// Roles: A = the activations (16 rows, zero past the real ones), B = W^T (16 k x 8 features), C = out [16 rows,
// 8 features] f32. Lane (g = lane / 4, c = lane % 4) supplies B for feature g and A for rows g and g + 8.
// The dot product does not care which k meets which, so the mma's 16 logical k of a step are mapped to
// physical k as: lane c's logical pairs {2c, 2c+1} and {2c+8, 2c+9} are physical 4 consecutive weights
// c * E + 4j .. c * E + 4j + 3 of its 16-byte weight chunk (E weights), step j = 0 .. E/4 - 1. So each lane
// reads one 16-byte chunk of its feature's row per E/4 steps and the same 4c-strided activations, and a warp's
// 4 lanes of a feature read 64 contiguous bytes.
//
// Block: 8 warps = 2 feature halves (8 features each) x 4 K quarters, 16 features per tile; a cluster of cs
// blocks splits K further (their partials added in rank order through distributed shared memory). Weights are
// dequantized to bf16 in registers (FP8 and FP4 times power-of-two scales exactly; f32 weights and fp32
// scales round), activations are rounded to bf16 once when staged: the numerics of the tensor-core GEMM.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace chunks;

constexpr int kThreads = 256;
constexpr int kFeatureWarps = 2, kKWarps = 4;  // warps along features and along K
constexpr int kTile = 8 * kFeatureWarps;       // features per tile
constexpr int kRows = 16;                       // activation rows at most (the MMA's M)
constexpr int kSliceK = 2048;                   // staged activations per rank: 8 rows x 2048 bf16 = 32 KiB
constexpr int kPad = 8;                         // bf16 padding per staged row (rotates the banks)
constexpr int kU = 2;                           // chunks per lane in flight
constexpr int kMaxCluster = 8;

struct GemvTcParams {
    WeightDesc w;
    const float* x;  // [rows, lda] f32
    float* out;      // [rows, ldc] f32
    int64_t lda, ldc, w_row0, n_out;
    int rows, tiles;
    int x_vec4;        // x rows 16-byte aligned: stage with float4 loads
    int slice_blocks;  // k blocks (4 E weights) per cluster rank
    int scale_shift;   // FP8: log2(k blocks per 128-wide scale block); FP4: 0 (a chunk is one group)
};

template <int K>
__global__ void __launch_bounds__(kThreads, 3) gemv_tc_kernel(const __grid_constant__ GemvTcParams p) {
    constexpr int E = kElems<K>, KB = 4 * E, W2 = E / 2;  // weights per chunk, k per block, words per chunk
    constexpr bool kScaled = K == kFP8 || K == kFP4;
    extern __shared__ __align__(16) uint16_t xs[];  // [p.rows][stride] bf16: this rank's K slice
    __shared__ float red[kKWarps][kTile][kRows];    // [K quarter, feature, row] partial sums

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c = lane % 4, wf = warp % kFeatureWarps, wk = warp / kFeatureWarps;
    const int cs = gridDim.x, rank = blockIdx.x;
    const int64_t blocks = p.w.cols / KB, kb0 = static_cast<int64_t>(rank) * p.slice_blocks;
    const int nkb = static_cast<int>(max(int64_t{0}, min(blocks - kb0, int64_t{p.slice_blocks})));
    const int stride = p.slice_blocks * KB + kPad;

    const uint4* wdata = reinterpret_cast<const uint4*>(p.w.data);
    const int64_t chunks_per_row = p.w.cols / E;
    const uint16_t* xrow = xs + g * stride + c * E;  // row g's activations at this lane's offset in a block
    bool staged = false;
    for (int tile = blockIdx.y; tile < p.tiles; tile += gridDim.y) {
        const int64_t n = static_cast<int64_t>(tile) * kTile + wf * 8 + g;  // this lane's feature (B column)
        const int64_t row = p.w_row0 + min(n, p.n_out - 1);  // past the end: a copy, never written
        const uint4* wrow = wdata + row * chunks_per_row + kb0 * 4 + c;
        const int64_t srow = (K == kFP8 ? row / p.w.block_rows : row) * p.w.scale_cols;

        struct Batch {
            uint4 v[kU];
            float s[kU];
        };
        // The warp's k blocks: wk, wk + 4, ... of the slice.
        auto load = [&](Batch& b, int i0) {
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                const int kb = wk + kKWarps * (i0 + u);
                const bool ok = kb < nkb;
                b.v[u] = ok ? __ldg(wrow + 4 * kb) : make_uint4(0, 0, 0, 0);
                b.s[u] = 1.0f;
                if constexpr (kScaled) {
                    if (ok) {
                        // FP8: one scale per 128 k (a k block of 64 lies in one); FP4: one per 32 = this chunk.
                        const int64_t chunk = (kb0 + kb) * 4 + c;
                        const int64_t at = srow + (K == kFP8 ? (kb0 + kb) >> p.scale_shift : chunk);
                        b.s[u] = K == kFP8 && p.w.scale_f32 ? __ldg(reinterpret_cast<const float*>(p.w.scale) + at)
                                                            : e8m0_to_f32(__ldg(p.w.scale + at));
                    }
                }
            }
        };
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int iters = (nkb - wk + kKWarps - 1) / kKWarps;  // this warp's k blocks
        Batch cur;
        load(cur, 0);  // in flight while the activations are staged
        if (!staged) {
            // The slice's activations as bf16, 4 per step (16-byte loads when aligned), 4 loads in flight.
            const int per_row = nkb * KB / 4, total = p.rows * per_row;
            for (int i0 = threadIdx.x; i0 < total; i0 += 4 * kThreads) {
                float4 v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int i = i0 + u * kThreads;
                    if (i >= total) break;
                    const int t = i / per_row, k4 = 4 * (i - t * per_row);
                    const float* src = p.x + t * p.lda + kb0 * KB + k4;
                    v[u] = p.x_vec4 ? __ldg(reinterpret_cast<const float4*>(src))
                                    : make_float4(src[0], src[1], src[2], src[3]);
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
            __syncthreads();
            staged = true;
        }
        for (int i0 = 0; i0 < iters; i0 += kU) {
            Batch nxt;
            load(nxt, i0 + kU);
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                if (i0 + u >= iters) break;
                uint32_t wb[W2];
                // FP4's decode gives 2^-6 times the value: fold 64 into the scale.
                chunk_to_bf16<K>(cur.v[u], K == kFP4 ? cur.s[u] * 64.0f : cur.s[u], wb);
                const int kb = wk + kKWarps * (i0 + u);
                // Rows g and g + 8 of the activations at this lane's k positions (zero past p.rows), 8 at a time
                // (two MMA steps; f32 weights: 4, one step).
                constexpr int kSteps = E / 4 < 2 ? E / 4 : 2;
#pragma unroll
                for (int q = 0; q < (E / 4) / kSteps; ++q) {
                    uint32_t xa[2][4] = {};
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        if (g + 8 * h >= p.rows) continue;
                        const uint16_t* xp = xrow + h * 8 * stride + kb * KB + 8 * q;
                        if constexpr (kSteps == 2) {
                            const uint4 v = *reinterpret_cast<const uint4*>(xp);
                            xa[h][0] = v.x, xa[h][1] = v.y, xa[h][2] = v.z, xa[h][3] = v.w;
                        } else {
                            const uint2 v = *reinterpret_cast<const uint2*>(xp);
                            xa[h][0] = v.x, xa[h][1] = v.y;
                        }
                    }
#pragma unroll
                    for (int jj = 0; jj < kSteps; ++jj) {
                        const int j = kSteps * q + jj;
                        mma_bf16(acc, xa[0][2 * jj], xa[1][2 * jj], xa[0][2 * jj + 1], xa[1][2 * jj + 1],
                                 wb[2 * j], wb[2 * j + 1]);
                    }
                }
            }
            cur = nxt;
        }

        // acc[0..1]: row g, features 2c, 2c + 1 of the warp's 8; acc[2..3]: row g + 8. Sum the K quarters, then
        // the cluster's ranks, in fixed order.
        red[wk][wf * 8 + 2 * c][g] = acc[0];
        red[wk][wf * 8 + 2 * c + 1][g] = acc[1];
        red[wk][wf * 8 + 2 * c][g + 8] = acc[2];
        red[wk][wf * 8 + 2 * c + 1][g + 8] = acc[3];
        __syncthreads();
        float* part = &red[0][0][0];  // after the sum below: [kTile][kRows] of this rank
        if (threadIdx.x < kTile * kRows) {
            const int f = threadIdx.x / kRows, r = threadIdx.x % kRows;
            float s = red[0][f][r];
#pragma unroll
            for (int q = 1; q < kKWarps; ++q) s += red[q][f][r];
            part[threadIdx.x + kTile * kRows] = s;  // red[1][f][r]: only this thread reads that element
        }
        const int64_t f0 = static_cast<int64_t>(tile) * kTile;
        if (cs == 1) {
            __syncthreads();
            if (threadIdx.x < kTile * kRows) {
                const int f = threadIdx.x / kRows, r = threadIdx.x % kRows;
                if (r < p.rows && f0 + f < p.n_out) p.out[r * p.ldc + f0 + f] = part[threadIdx.x + kTile * kRows];
            }
            __syncthreads();  // red is rewritten by the next tile
        } else {
            cg::cluster_group cluster = cg::this_cluster();
            cluster.sync();
            for (int i = threadIdx.x + kThreads * rank; i < kTile * kRows; i += kThreads * cs) {
                float s = 0.0f;
                for (int q = 0; q < cs; ++q) s += cluster.map_shared_rank(part, q)[i + kTile * kRows];
                const int f = i / kRows, r = i % kRows;
                if (r < p.rows && f0 + f < p.n_out) p.out[r * p.ldc + f0 + f] = s;
            }
            cluster.sync();  // the other ranks' reads of red are done before the next tile rewrites it
        }
    }
}



template <int K>
void launch(const GemvTcParams& p, int cs, int slots, cudaStream_t stream) {
    constexpr int KB = 4 * kElems<K>;
    auto kernel = gemv_tc_kernel<K>;
    const int smem = p.rows * (p.slice_blocks * KB + kPad) * 2;  // rows past p.rows are never read
    static std::atomic<uint64_t> configured{0};
    allow_smem(kernel, kRows * (kSliceK + kPad) * 2, configured);
    launch_clustered(kernel, dim3(cs, slots), cs, kThreads, smem, stream, p);
}

}  // namespace

bool gemv_tc_applies(int64_t rows, const WeightDesc& w) {
    if (rows < 2 || rows > kRows) return false;
    const int e = elems_of(kind_of(w));
    // Whole k blocks of 4 chunks per row, 16-byte aligned rows, and each chunk inside one scale block.
    if (w.cols % (4 * e) != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
    if (w.format == 1) {  // FP8: a power-of-two number of k blocks per scale block along K
        const int per = w.block_cols / (4 * e);
        return w.block_cols % (4 * e) == 0 && (per & (per - 1)) == 0;
    }
    if (w.format == 2) return w.block_cols == e;  // FP4: one scale group per chunk
    return true;
}

void launch_gemv_tc(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                    int64_t w_row0, int64_t n_out, cudaStream_t stream) {
    if (n_out == 0) return;
    const int kind = kind_of(w), e = elems_of(kind), kb = 4 * e;
    const int64_t blocks = w.cols / kb, tiles = ceil_div(n_out, kTile);
    const int64_t target = static_cast<int64_t>(device_sm_count()) * 3;  // ~3 blocks per SM (registers)
    // Split K: until the slice fits the staged activations, then while the blocks stay within one wave and
    // each warp keeps at least 4 k blocks.
    int cs = 1;
    while (ceil_div(blocks, cs) * kb > kSliceK) cs *= 2;
    while (cs < kMaxCluster && tiles * cs * 2 <= target && blocks >= int64_t{kKWarps} * 4 * cs * 2) cs *= 2;
    DI_CHECK(cs <= kMaxCluster, "gemv_tc: K = ", w.cols, " needs more than ", kMaxCluster, " ranks");
    GemvTcParams p{};
    p.w = w, p.x = x, p.out = out, p.lda = lda, p.ldc = ldc, p.w_row0 = w_row0, p.n_out = n_out;
    p.rows = static_cast<int>(rows);
    p.tiles = static_cast<int>(tiles);
    p.x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && lda % 4 == 0;
    p.slice_blocks = static_cast<int>(ceil_div(blocks, cs));
    if (w.format == 1) p.scale_shift = __builtin_ctz(static_cast<unsigned>(w.block_cols / kb));
    const int slots = static_cast<int>(std::min<int64_t>(tiles, std::max<int64_t>(1, target / cs)));
    switch (kind) {
        case kF32: launch<kF32>(p, cs, slots, stream); break;
        case kBF16: launch<kBF16>(p, cs, slots, stream); break;
        case kF16: launch<kF16>(p, cs, slots, stream); break;
        case kFP8: launch<kFP8>(p, cs, slots, stream); break;
        default: launch<kFP4>(p, cs, slots, stream); break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
