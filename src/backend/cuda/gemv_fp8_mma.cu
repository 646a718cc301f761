// Products of 1..kGemvFp8MmaMaxRows activation rows with FP8 weights (e4m3, 128 x 128 block scales, E8M0 or f32) on
// the FP8 tensor cores (mma.sync m16n8k32 e4m3 x e4m3, sm_89 and later): the decode GEMV of the attention projections
// and the shared expert at batch 1..4. out[t, n] = sum_k x[t, k] W[w_row0 + n, k].
//
// Why: the fp32 GEMV (gemv.cu) at one row is bound by its instructions, not by memory (ncu on an H200, wo_b: issue
// slots 68% busy, DRAM 36%, and its time scales with the SM clock: 19.7 us at 1.45 GHz, 14.3 at 1.98), ~8 instructions
// a weight to decode FP8 into f32 and multiply, and the wgmma GEMV decodes FP8 into bf16 fragments. Here the weight
// bytes are the mma's A operand as they are (no decode) and the activations its B operand, so a weight costs ~0.4
// instructions and the loads set the pace.
//
// The activations. Each 128-block of an activation row, rounded to bf16 (as the other tensor-core GEMVs round it), is
// s (hi + lo / 16) with s = 2^(E - 7) for the block's largest magnitude in [2^E, 2^(E + 1)), hi = e4m3(x / s) and
// lo = e4m3(16 (x / s - hi)), both rounded to nearest: x / s < 256 keeps hi normal (4 significant bits) for every
// element within 2^14 of the block's largest, and its remainder, a multiple of x's last bit no larger than half of
// hi's, is then exact in lo, so hi + lo / 16 = x exactly; smaller elements keep their bits down to 2^-10 s (an error of
// at most 2^-17 of the block's largest). B's 8 columns are token t's hi (column 2 t) and lo (2 t + 1), so up to 4
// tokens.
//
// The k order. In an mma of k32, lane (g, c) = (lane / 4, lane % 4) holds A's row g (a0) and g + 8 (a1) at k 4c..4c+3,
// a2 / a3 the same at k 16 + 4c..; B's column g at k 4c.. (b0) and 16 + 4c.. (b1). A dot product does not care how k is
// ordered as long as A and B agree, so the 4 mmas s of a 128-k block take the stored bytes 32 c + 8 s .. + 3 as the
// lane's k 4c.. and 32 c + 8 s + 4 .. + 7 as its k 16 + 4c..: each lane reads the 32 contiguous bytes 32 c .. 32 c + 31
// of its rows and of its column in two 16-byte loads a row, weights and activations alike, in their stored order.
//
// Sums. The FP8 tensor cores add a block's products with fewer bits than fp32, so each 128-k block (4 mmas) sums into
// fresh registers and is then scaled into fp32 accumulators: acc += (hi_sum + lo_sum / 16) s w_scale (the weights'
// block scale and the activations' s are powers of two, or f32 weight scales). Results differ from the bf16 GEMVs'
// by that in-block summation (H200, CudaGemvWgmma.Fp8Mma*: at most 1.0e-6 relative against the CPU on the same bf16
// activations).
//
// Work split: a CTA of 8 warps takes 16 R weight rows (R = 8 / S row groups of 16, one a warp per K part) and S K
// parts (warp w: row group w / S, 128-blocks w % S, w % S + S, ...), its warps' partial sums added in part order
// through shared memory: deterministic. S (1, 2, 4 or 8) is the smallest that makes enough CTAs (the shape's per SM)
// for the launch's products. Each lane keeps the next 128-block's loads (64 bytes of weights, 32 of activations) in
// flight while the current block's products run.
//
// Measured (H200, gemv_bench, us a call; bench/results/decode_gemv_experiments_2026-12-03d.txt): wq_b, wo_b, wo_a at
// 2-4 rows 14.3-14.4 / 13.7-13.9 / 15.7-16.0 against the wgmma GEMV's 13.0 / 15.9-16.1 / 15.7-16.0;
// the small products (wq_a, wkv) ~7.4 against ~8.2 (both mostly fixed costs); the decode step at batch 2 / 4 2.09 /
// 2.56 ms against 2.21 / 2.66. At one row it is no faster than the fp32 GEMV (wo_b 13.5 against 14.3 us but wo_a
// 15.6 against 13.7 and the small products ~7.4 against ~5.2), so the backend keeps that one there. Like every GEMV
// here it streams the large weights at ~55% of the HBM rate: neither a deeper pipeline (4 blocks a lane in flight, B
// staged in shared memory: slower) nor the other kernels' designs got further (the experiments file says more).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/weight_chunks.cuh"
#include "backend/cuda/wgmma_common.cuh"

namespace deepinfer::cuda {
namespace {

using wgmma::word_of;

constexpr int kBK = 128;  // k per block (one scale block)
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kMaxJobs = 8;
constexpr int kTargetCtas = 3;  // CTAs an SM: the registers allow 3 (80 a thread, no spills); the split aims for them

struct MmaJob {
    const uint8_t* data;   // FP8 [w rows, k]
    const uint8_t* scale;  // [ceil(w rows / 128), scale_cols] E8M0 bytes or f32
    const uint8_t* xq;     // [2 rows, k] e4m3: row 2 t token t's hi, 2 t + 1 its lo
    const float* xs;       // [k / 128, rows] the tokens' block scales s
    float* out;            // [rows, ldc] f32
    int64_t ldc, w_row0, n_out;
    int tile0;  // the job's first tile of the launch
};
struct MmaParams {
    MmaJob jobs[kMaxJobs];
    int num_jobs, tiles, rows;
    int nkb;     // 128-blocks of K
    int splits;  // K parts S of a CTA
    int scale_f32;
    int64_t k, scale_cols;
};

// d = A B + d for m16n8k32, e4m3 in, f32 sums (fragments as the header comment says).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();  // gemv_fp8_mma_applies() keeps callers away
#endif
}

// A lane's loads for one 128-block: its 32 bytes of rows g and g + 8 and of column g of B.
struct BlockLoads {
    uint4 a[2][2];  // [row g, g + 8][16-byte half]
    uint4 b[2];
};

__device__ __forceinline__ const MmaJob& job_of(const MmaParams& p, int tile) {
    int j = 0;
    while (j + 1 < p.num_jobs && p.jobs[j + 1].tile0 <= tile) ++j;
    return p.jobs[j];
}

__device__ __forceinline__ float scale_at(const MmaParams& p, const MmaJob& job, int64_t row, int kb) {
    const int64_t at = (job.w_row0 + row) / kBK * p.scale_cols + kb;
    return p.scale_f32 ? __ldg(reinterpret_cast<const float*>(job.scale) + at) : e8m0_to_f32(__ldg(job.scale + at));
}

__global__ void __launch_bounds__(kThreads, kTargetCtas) gemv_fp8_mma_kernel(const __grid_constant__ MmaParams p) {
    pdl_prologue();                        // see pdl.cuh
    __shared__ float part[kWarps][32][2];  // each warp's lane sums (rows g, g + 8 of token c)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int groups = kWarps / p.splits, grp = warp / p.splits, q = warp % p.splits;
    const int tile = blockIdx.x;
    const MmaJob& job = job_of(p, tile);
    const int64_t r0 = static_cast<int64_t>(tile - job.tile0) * 16 * groups + 16 * grp;  // the warp's first row
    int64_t row[2];
    const uint8_t* wrow[2];
    for (int h = 0; h < 2; ++h) {
        row[h] = r0 + g + 8 * h;
        wrow[h] = job.data + (job.w_row0 + min(row[h], job.n_out - 1)) * p.k + 32 * c;  // past n_out: read, not stored
    }
    const bool col_live = g < 2 * p.rows;  // B's column g holds a token's codes
    const uint8_t* bcol = job.xq + (col_live ? g : 0) * p.k + 32 * c;
    auto load = [&](BlockLoads& l, int kb) {
        const int64_t off = static_cast<int64_t>(kb) * kBK;
        for (int h = 0; h < 2; ++h) {
            l.a[h][0] = __ldg(reinterpret_cast<const uint4*>(wrow[h] + off));
            l.a[h][1] = __ldg(reinterpret_cast<const uint4*>(wrow[h] + off + 16));
        }
        l.b[0] = col_live ? __ldg(reinterpret_cast<const uint4*>(bcol + off)) : make_uint4(0, 0, 0, 0);
        l.b[1] = col_live ? __ldg(reinterpret_cast<const uint4*>(bcol + off + 16)) : make_uint4(0, 0, 0, 0);
    };
    float acc[2] = {0.0f, 0.0f};  // rows g, g + 8 of token c
    BlockLoads cur, nxt;
    int kb = q;
    if (kb < p.nkb) load(cur, kb);
    for (; kb < p.nkb; kb += p.splits) {
        if (kb + p.splits < p.nkb) load(nxt, kb + p.splits);  // in flight while this block's products run
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int half = s / 2, w0 = 2 * (s % 2);
            const uint4 &a0 = cur.a[0][half], &a1 = cur.a[1][half], &b = cur.b[half];
            mma_e4m3(d, word_of(a0, w0), word_of(a1, w0), word_of(a0, w0 + 1), word_of(a1, w0 + 1), word_of(b, w0),
                     word_of(b, w0 + 1));
        }
        // d[0], d[1]: row g, columns 2c (hi) and 2c + 1 (lo) = token c; d[2], d[3]: row g + 8.
        const float xs = c < p.rows ? __ldg(job.xs + static_cast<int64_t>(kb) * p.rows + c) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float m = scale_at(p, job, min(row[h], job.n_out - 1), kb) * xs;
            acc[h] = fmaf(fmaf(d[2 * h + 1], 0.0625f, d[2 * h]), m, acc[h]);
        }
        cur = nxt;
    }
    // The K parts of each row group added in part order.
    part[warp][lane][0] = acc[0];
    part[warp][lane][1] = acc[1];
    __syncthreads();
    if (q != 0) return;
    for (int h = 0; h < 2; ++h) {
        float s = part[warp][lane][h];
        for (int j = 1; j < p.splits; ++j) s += part[warp + j][lane][h];
        if (c < p.rows && row[h] < job.n_out) job.out[c * job.ldc + row[h]] = s;
    }
}

// The activations' codes and scales (see the header comment): one warp a (token, 128-block), lane l its columns
// 4 l .. 4 l + 3; blockIdx.y = the input.
struct SplitParams {
    const float* x[kMaxJobs];
    int64_t lda[kMaxJobs];
    uint8_t* xq[kMaxJobs];
    float* xs[kMaxJobs];
    int64_t rows, k;
};
__global__ void gemv_fp8_split_x_kernel(const __grid_constant__ SplitParams a) {
    pdl_prologue();  // see pdl.cuh
    const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t nkb = a.k / kBK;
    if (w >= a.rows * nkb) return;
    const int64_t t = w / nkb, kb = w % nkb;
    const float* src = a.x[blockIdx.y] + t * a.lda[blockIdx.y] + kb * kBK + 4 * lane;
    float v[4], m = 0.0f;
    for (int e = 0; e < 4; ++e) {
        v[e] = __bfloat162float(__float2bfloat16_rn(__ldg(src + e)));
        m = fmaxf(m, fabsf(v[e]));
    }
    m = warp_max(m);
    // E from the largest magnitude's exponent bits, kept where 2^(E - 7) and its inverse are normal floats (a block
    // of zeros or of subnormals takes E = -119).
    const int e_max = min(max(static_cast<int>((__float_as_uint(m) >> 23) & 0xff) - 127, -119), 127);
    const float s = pow2_int(e_max - 7), inv = pow2_int(7 - e_max);
    const float y[4] = {v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv};
    const E4m3Split q = split_e4m3_quad(y);
    uint8_t* dst = a.xq[blockIdx.y] + 2 * t * a.k + kb * kBK + 4 * lane;
    *reinterpret_cast<uint32_t*>(dst) = q.hi;
    *reinterpret_cast<uint32_t*>(dst + a.k) = q.lo;
    if (lane == 0) a.xs[blockIdx.y][kb * a.rows + t] = s;
}

// Jobs one launch can share: K and the scale kind.
bool same_launch(const GemvJob& a, const GemvJob& b) { return a.w.cols == b.w.cols && a.w.scale_f32 == b.w.scale_f32; }

// The smallest K split (of 1, 2, 4, 8, at most the 128-blocks) that gives the launch kTargetCtas CTAs an SM, else 8.
int split_for(const GemvJob* jobs, int count, int nkb) {
    const int64_t want = int64_t{kTargetCtas} * device_sm_count();
    int s = 1;
    for (; s < kWarps && s < nkb; s *= 2) {
        int64_t tiles = 0;
        for (int i = 0; i < count; ++i) tiles += ceil_div(jobs[i].n_out, int64_t{16} * (kWarps / s));
        if (tiles >= want) break;
    }
    return s;
}

void launch_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    const WeightDesc& w = jobs[0].w;
    const int64_t k = w.cols;
    MmaParams p{};
    p.k = k, p.nkb = static_cast<int>(k / kBK), p.scale_cols = w.scale_cols, p.scale_f32 = w.scale_f32;
    p.num_jobs = count, p.rows = static_cast<int>(rows), p.splits = split_for(jobs, count, p.nkb);
    // One copy of codes and scales per distinct input.
    SplitParams sp{};
    int input_of[kMaxJobs];
    const int inputs = distinct_inputs(jobs, count, sp.x, sp.lda, input_of);
    sp.rows = rows;
    sp.k = k;
    const size_t q_bytes = static_cast<size_t>(2 * rows * k),
                 per_input = (q_bytes + rows * (k / kBK) * 4 + 15) / 16 * 16;
    uint8_t* scratch = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), per_input * inputs, stream));
    for (int i = 0; i < inputs; ++i) {
        sp.xq[i] = scratch + per_input * i;
        sp.xs[i] = reinterpret_cast<float*>(sp.xq[i] + q_bytes);
    }
    launch_pdl(gemv_fp8_split_x_kernel, dim3(static_cast<unsigned>(ceil_div(rows * (k / kBK), 8)), inputs), 256, 0,
               stream, sp);
    DI_CUDA_LAUNCH_CHECK();
    const int64_t rows_per_tile = int64_t{16} * (kWarps / p.splits);
    int tiles = 0;
    for (int i = 0; i < count; ++i) {
        const GemvJob& j = jobs[i];
        p.jobs[i] =
            MmaJob{j.w.data, j.w.scale, sp.xq[input_of[i]], sp.xs[input_of[i]], j.out, j.ldc, j.w_row0, j.n_out, tiles};
        tiles += static_cast<int>(ceil_div(j.n_out, rows_per_tile));
    }
    p.tiles = tiles;
    launch_pdl(gemv_fp8_mma_kernel, dim3(static_cast<unsigned>(tiles)), kThreads, 0, stream, p);
    DI_CUDA_LAUNCH_CHECK();
    DI_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

}  // namespace

bool gemv_fp8_mma_applies(int64_t rows, const WeightDesc& w) {
    return rows >= 1 && rows <= kGemvFp8MmaMaxRows && fp8_block_weight_streams(w) &&
           device_compute_capability() >= 89;  // the FP8 mma
}

void launch_gemv_fp8_mma_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream) {
    for (int i = 0; i < count; ++i)
        DI_ICHECK(gemv_fp8_mma_applies(rows, jobs[i].w) && jobs[i].n_out >= 0 && jobs[i].n_out <= (int64_t{1} << 30) &&
                      jobs[i].w_row0 >= 0,
                  "gemv_fp8_mma: product ", i, " of ", count, " at ", rows, " rows is not one the kernel takes");
    for_each_shared_launch(jobs, count, kMaxJobs, same_launch,
                           [&](const GemvJob* first, int m) { launch_jobs(first, m, rows, stream); });
}

}  // namespace deepinfer::cuda
