// The mHC mix's dot products (hyper_connection.cu) for many tokens on the tensor cores, at fp32 accuracy (3xTF32).
//
// raw[t, j] = f_t . fn_j (j < M) and raw[t, M] = f_t . f_t, for f [T, W] and fn [M, W]: a GEMM with the tokens as
// the MMA's rows, the fn rows as its columns (M padded with zero rows to NT whole 8s: 24 = 3 x 8 at the model's
// shape) and the width as the reduction. Every value x (of f and of fn) is split x = hi + lo, hi = tf32(x),
// lo = tf32(x - hi), and a product taken as a_lo b_hi + a_hi b_lo + a_hi b_hi: three mma.sync m16n8k8 tf32, the
// a_lo b_lo term dropped. The sums of squares take no MMA: fp32 FMAs on the f values each lane already holds.
//
// Accuracy. hi keeps 11 significant bits, so |lo| <= 2^-11 |x| and tf32(lo) is within 2^-22 |x| of lo; with the
// dropped term (<= 2^-22 |ab|) a product is within ~3 * 2^-22 ~ 7e-7 of ab (one fp32 rounding: 2^-24), an error
// of random sign across terms. Over W terms of random sign it adds ~2^-22 sqrt(W) rms(ab) to a dot whose size is
// ~sqrt(W) rms(ab): ~3e-7 relative, below the fp32 summation noise of the CPU oracle's serial sum (~4e-6 of the
// logits at W = 16384). Plain TF32 (no lo terms) errs by ~2^-11 per product: ~3e-4 of the coefficients.
// The tensor core accumulates in fp32 but does not round to nearest (published measurements of earlier parts
// find truncation), a bias that compounds along one accumulator: emulated with truncation, one accumulator per
// 2048 widths puts the coefficients ~2.5e-5 off, beyond the fp32 bound. So a warp's MMA accumulators start from
// zero every stage (16 widths, 6 MMAs) and are added into fp32 registers, rounding to nearest; the emulation (a
// host model of all of this at the model's shape, 600 tokens) then puts the coefficients ~3.5e-7 from the fp32
// SIMT kernels' and ~3.5e-6 from the CPU's (the CPU's own error), and plain TF32 ~3.3e-4 away.
// Sum order: per warp, stage sums in stage order (see Tiling for the widths a stage holds); the two width-halves of a
// stage (warps wk = 0, 1) added in that order; then the splits, in order, by the finish kernel. It depends on T (the
// split count), so the backend takes this path only outside batch-invariant mode (and not in the exact fp32 mode).
//
// Tiling. Block: 8 warps, 128 tokens, stages of 32 widths (f [128, 32] and fn [NT * 8, 32]) through a 4-deep
// cp.async ring; warp (wm, wk) computes tokens wm * 32 .. + 32 (two m16 tiles, each fn fragment feeding both)
// over widths wk * 16 .. + 16 of every stage. Grid: (token tiles, splits); split s covers widths
// [s * Ks, (s + 1) * Ks) (Ks whole stages, zeros past W), or, where f is 4 streams of d columns (`cols` = d: the mHC
// mix, n = 4; Ks % 128 == 0), columns [s * Ks / 4, (s + 1) * Ks / 4) of each stream, stage 4 b + k holding stream k
// at the split's b-th block of 32 columns (zeros past d), and writes its partials [T, S, M + 1] to the scratch,
// which the finish kernel adds in split order. Staged row r keeps its two 16-float pieces in the order
// (p ^ (r & 1)): a warp's float4 reads of rows g and g + 1 then fall on opposite bank halves (conflict-free).
// A lane (g, c) reads the float4 at widths 4c .. 4c + 3 of its piece for rows g and g + 8 (A) and for fn row g
// (B); MMA step s in {0, 1} feeds components 2s and 2s + 1 as the logical k = c and c + 4. A and B map k alike,
// so the dot is unchanged.
//
// Cost at T = 16,384, W = 16,384, M = 24 (a prefill's hc_mix on an H200):
//   - HBM: f read once, T W 4 = 1.07 GB; partials T S (M + 1) 4 = 6.5 MB (S = 4) written and read back; fn
//     (1.5 MB) stays in L2 (each token tile reads it once: 128 x 1.5 MB = 0.19 GB of L2 traffic, 18% of f's).
//     At ~4.3 TB/s: ~0.26 ms.
//   - Tensor cores: 3 x 2 T W (NT * 8) = 38.7 GFLOP of tf32 MMA; at an assumed ~250 TFLOP/s for mma.sync (about
//     half the 495 TFLOP/s dense tf32 peak, which needs wgmma) ~0.15 ms, overlapped with the loads.
//   - Issue: per stage and warp 36 MMAs, 7 shared loads, ~60 conversions (2 cvt + 1 sub per value of A and B),
//     16 FMAs for the squares, 24 FADDs for the stage sums: ~0.08 ms over the SMs' schedulers.
//   Expected: bound by f's bytes, ~0.3 ms (the fp32 SIMT kernel: 1.14 ms, compute-bound at ~12 TFLOP/s).
//   Measured (H200, prefill 8 x 2048, run 18): 0.40 ms a call for the whole mix, finish included.
//
// With the expand (launch_hc_post_dots_tc, kPost; hyper_connection.cu's launch_hc_post_mix, behind
// DEEPINFER_CUDA_HC_POST_MIX=1, off: slower): at a sublayer boundary the streams f are hc_post's output, which the
// mix reads back (1.07 GB at 16K tokens) right after hc_post wrote it. Here the loader makes f itself, split by
// columns as above: at the first stage of a column block (stream 0) each thread loads y and the 4 old streams at its
// 4 columns for its 4 rows (two rows' loads in flight at a time), makes all 4 streams' values there with hc_post's
// sums (post y, then the old streams' terms in stream order), stages stream 0's and stores all 4 to f; the block's
// next 3 stages (streams 1-3) copy theirs back from f like the plain kernel (L2 hits). Each old and y element is read
// once and each f element made once. Measured (H200, CudaOpsDefaultMode.HcPostPreNormThroughput, 16,384 tokens,
// d 4096, runs of 2026-12-02, third session): 1.39 ms a boundary against 1.28 for hc_post + hc_pre_norm, bitwise the
// same. The stream-0 stages wait on their loads (two round trips a column block, no other work of the block in
// flight); four rows' loads at once spill (1.86 ms). Two earlier designs: a split as one stream's widths (each load
// reading all 4 old streams, every stage waiting on its loads) 1.58 ms in the model against 0.98 for hc_post + the
// mix; stages of 8 columns of all 4 streams (32 bytes of a row a stage) 2.8-2.9 ms whatever the L2 prefetch size.
// ncu (run 6): 44% of the fused kernel's stall cycles wait on those loads, at 25% occupancy (registers and shared
// memory allow 2 blocks of 8 warps), and it moves ~3.0 GB against the 2.4 GB of old, y and f. What would close the gap:
// the loader's loads in flight while the block computes (a warp-specialized producer, or a cp.async ring of raw y and
// old rows, 80 KB a column block at 128 tokens). Prefetching the next column block's rows into L2 three stages ahead
// did not (1.37 ms, run 7): the waits are not DRAM latency alone.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kWarpsM = 4, kWarpsK = 2, kThreads = kWarpsM * kWarpsK * 32;
constexpr int kMTiles = 2;                       // m16 token tiles per warp
constexpr int kTokens = kWarpsM * kMTiles * 16;  // 128 tokens per block
constexpr int kPiece = 16;                       // widths per warp and stage
constexpr int kStep = kWarpsK * kPiece;          // 32 widths per stage
constexpr int kStages = 4;                       // ring depth: 3 stages in flight while one is consumed
constexpr int kMaxNTiles = 3;                    // fn rows up to 24: the mix of n <= 4 streams, heads
constexpr int64_t kMinSplit = 8 * kStep;         // narrowest split: 8 stages
constexpr int kBlocksPerSm = 2;                  // shared memory (78 KB at NT = 3) and registers (<= 128)
static_assert(kTokens == kThreads / 8 * 4, "staging: 8 threads per row, 4 f rows per thread");

template <int NT>
constexpr int staged_rows() {
    return kTokens + NT * 8;
}
template <int NT>
constexpr int smem_floats() {  // the stage ring, then (reused) the two width-halves' sums [kWarpsK, 128, NT * 8 + 1]
    return std::max(kStages * staged_rows<NT>() * kStep, kWarpsK * kTokens * (NT * 8 + 1));
}

// Float offset of piece p of staged row r (see the top: the pieces swap places on odd rows).
__device__ __forceinline__ int piece_at(int r, int p) { return r * kStep + ((p ^ (r & 1)) * kPiece); }

// The four values of v split into tf32 hi and lo parts.
__device__ __forceinline__ void split4(float4 v, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
    const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        hi[i] = mma::to_tf32(x[i]);
        lo[i] = mma::to_tf32(x[i] - __uint_as_float(hi[i]));
    }
}

__device__ __forceinline__ float sum_squares(float4 v, float acc) {
    acc = fmaf(v.x, v.x, acc);
    acc = fmaf(v.y, v.y, acc);
    acc = fmaf(v.z, v.z, acc);
    return fmaf(v.w, v.w, acc);
}

// cp.async of 16 bytes (zeros past src_bytes) that has L2 fetch the surrounding 256 bytes: a token row is staged
// 128 bytes a stage, so the row's next piece is already in L2 (one DRAM access of 256 bytes, not two of 128).
__device__ __forceinline__ void cp_async16_l2_256(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(mma::smem_addr(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
// The same for a load into registers.
__device__ __forceinline__ float4 ld_l2_256(const float* src) {
    float4 v;
    asm volatile("ld.global.nc.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(src));
    return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// With kPost, f is made as the block stages it: the mHC expand of the sublayer before (hc_post's arithmetic, n = 4),
// f[t, k d + c] = post[t, k] y[t, c] + sum_j comb[t, j, k] old[t, j d + c], written to f as well as staged. f: [T, 4 d]
// (out), y [T, d], post [T, 4], comb [T, 4, 4], old [T, 4 d] f32 with d the kernel's cols; d % 4 == 0, all 16-byte
// aligned.
struct PostSource {
    float* out;  // f, written (the kernel's f is only read without kPost)
    const float* y;
    const float* post;
    const float* comb;
    const float* old;
};

// part [T, splits, M + 1] f32: split blockIdx.y's partials of the 128 tokens of tile blockIdx.x (kPost: split
// blockIdx.x of tile blockIdx.y).
// f: [T, W] f32, fn: [M, W] f32, both 16-byte aligned, W % 4 == 0; M <= NT * 8. cols: 0, or d where f is 4 streams
// of d columns (then split_width % (4 kStep) == 0).
template <int NT, bool kPost>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    hc_dots_tc_kernel(float* __restrict__ part, const float* __restrict__ f, const float* __restrict__ fn,
                      int64_t tokens, int64_t width, int rows, int64_t split_width, int splits, int64_t cols,
                      PostSource src) {
    extern __shared__ __align__(16) float smem[];  // kStages x [128 + NT * 8 rows, 32] f32
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int wm = warp % kWarpsM, wk = warp / kWarpsM;
    const int64_t t0 = static_cast<int64_t>(kPost ? blockIdx.y : blockIdx.x) * kTokens;
    const int split = kPost ? blockIdx.x : blockIdx.y;
    // The split's span: widths [begin, end), or (cols > 0) columns [begin, end) of each of the 4 streams, stage s
    // then being stream s % 4 at the span's column block s / 4 (32 columns).
    const int64_t span = cols ? split_width / 4 : split_width;
    const int64_t begin = split * span, end = min(cols ? cols : width, begin + span);
    const int blocks = static_cast<int>((end - begin + kStep - 1) / kStep);
    const int steps = cols ? 4 * blocks : blocks;

    // Thread i stages 16-byte chunk q = i % 8 of f rows i / 8 + 32 j (j < 4) and, for i < NT * 64, of fn row
    // i / 8: zeros past the split's span, past the tokens and past M (cp.async with 0 source bytes). Chunk q of
    // stage s lies at column (or width) stage_at(s, q) of its stream, at width stage_width(s, q) of f.
    const int q = threadIdx.x % 8, r0 = threadIdx.x / 8;
    const auto stage_at = [&](int s) { return begin + static_cast<int64_t>(cols ? s / 4 : s) * kStep + 4 * q; };
    const auto stage_width = [&](int s) { return (cols ? (s % 4) * cols : 0) + stage_at(s); };

    auto load = [&](int s) {
        float* st = smem + (s % kStages) * staged_rows<NT>() * kStep;
        const int64_t at = stage_at(s), k = stage_width(s);
        const bool k_ok = at < end;  // whole float4s: W % 4 == 0 (d % 4 == 0 with cols)
        if (kPost && s % 4 == 0) {
            // A column block's first stage makes all 4 streams' values there (each old and y element read once),
            // two rows at a time (their 10 loads in flight together; all four rows' would spill), each as hc_post
            // sums it: post y, then the old streams' terms in stream order. Stream 0's values go to the stage, all
            // four to f, where the block's next 3 stages read them back (L2 hits: written a stage before).
#pragma unroll 1
            for (int j0 = 0; j0 < kTokens / 32; j0 += 2) {
                float4 y4[2], old4[2][4];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int64_t t = t0 + r0 + 32 * (j0 + h);
                    if (k_ok && t < tokens) {
                        y4[h] = ld_l2_256(src.y + t * cols + at);
#pragma unroll
                        for (int i = 0; i < 4; ++i) old4[h][i] = ld_l2_256(src.old + (t * 4 + i) * cols + at);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = r0 + 32 * (j0 + h);
                    const int64_t t = t0 + r;
                    const bool ok = k_ok && t < tokens;
#pragma unroll
                    for (int ks = 0; ks < 4; ++ks) {
                        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                        if (ok) {
                            const float p = src.post[t * 4 + ks];
                            v = make_float4(p * y4[h].x, p * y4[h].y, p * y4[h].z, p * y4[h].w);
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float w = src.comb[(t * 4 + i) * 4 + ks];
                                v.x = fmaf(w, old4[h][i].x, v.x);
                                v.y = fmaf(w, old4[h][i].y, v.y);
                                v.z = fmaf(w, old4[h][i].z, v.z);
                                v.w = fmaf(w, old4[h][i].w, v.w);
                            }
                            *reinterpret_cast<float4*>(src.out + t * width + ks * cols + at) = v;
                        }
                        if (ks == 0) *reinterpret_cast<float4*>(st + piece_at(r, q / 4) + 4 * (q % 4)) = v;
                    }
                }
            }
        } else {
            // kPost: f's values made by this thread at stage s - s % 4 (ordered by the barriers between).
#pragma unroll
            for (int j = 0; j < kTokens / 32; ++j) {
                const int r = r0 + 32 * j;
                const bool ok = k_ok && t0 + r < tokens;
                cp_async16_l2_256(st + piece_at(r, q / 4) + 4 * (q % 4), ok ? f + (t0 + r) * width + k : f,
                                  ok ? 16 : 0);
            }
        }
        if (r0 < NT * 8) {
            const bool ok = k_ok && r0 < rows;
            mma::cp_async16(st + piece_at(kTokens + r0, q / 4) + 4 * (q % 4), ok ? fn + r0 * width + k : fn,
                            ok ? 16 : 0);
        }
    };

    float run[kMTiles][NT][4];  // C fragments of the warp's m16 tiles: the sums over the stages so far
    float ss[kMTiles][2];       // sums of squares of rows g and g + 8 over this lane's widths
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        ss[mt][0] = ss[mt][1] = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) run[mt][nt][0] = run[mt][nt][1] = run[mt][nt][2] = run[mt][nt][3] = 0.f;
    }
    auto compute = [&](int s) {
        const float* st = smem + (s % kStages) * staged_rows<NT>() * kStep;
        uint32_t bh[NT][4], bl[NT][4];  // fn rows nt * 8 + g at this lane's 4 widths
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            split4(*reinterpret_cast<const float4*>(st + piece_at(kTokens + nt * 8 + g, wk) + 4 * c), bh[nt], bl[nt]);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            const int r = wm * 32 + mt * 16 + g;
            const float4 x0 = *reinterpret_cast<const float4*>(st + piece_at(r, wk) + 4 * c);
            const float4 x1 = *reinterpret_cast<const float4*>(st + piece_at(r + 8, wk) + 4 * c);
            ss[mt][0] = sum_squares(x0, ss[mt][0]);
            ss[mt][1] = sum_squares(x1, ss[mt][1]);
            uint32_t h0[4], l0[4], h1[4], l1[4];
            split4(x0, h0, l0);
            split4(x1, h1, l1);
            float acc[NT][4];  // this stage's sums, from zero (see the top: accumulation is not rounded)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                const uint32_t ah[4] = {h0[2 * kk], h1[2 * kk], h0[2 * kk + 1], h1[2 * kk + 1]};
                const uint32_t al[4] = {l0[2 * kk], l1[2 * kk], l0[2 * kk + 1], l1[2 * kk + 1]};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {  // the small terms first
                    mma::mma_tf32(acc[nt], al, bh[nt][2 * kk], bh[nt][2 * kk + 1]);
                    mma::mma_tf32(acc[nt], ah, bl[nt][2 * kk], bl[nt][2 * kk + 1]);
                    mma::mma_tf32(acc[nt], ah, bh[nt][2 * kk], bh[nt][2 * kk + 1]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) run[mt][nt][i] += acc[nt][i];
        }
    };

    // The ring: stage s + 3 is requested while stage s is consumed; one barrier per stage both publishes stage s
    // and frees the slot stage s - 1 used.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < steps) load(s);
        cp_async_commit();  // empty groups past the end keep the count uniform
    }
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (s + kStages - 1 < steps) load(s + kStages - 1);
        cp_async_commit();
        compute(s);
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free for the sums

    // Squares over the row's 4 lanes, then both width-halves' sums to shared memory, C-fragment positions:
    // d0, d1 row g, columns 2c, 2c + 1; d2, d3 row g + 8.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            ss[mt][h] += __shfl_xor_sync(0xffffffffu, ss[mt][h], 1);
            ss[mt][h] += __shfl_xor_sync(0xffffffffu, ss[mt][h], 2);
        }
    constexpr int ld = NT * 8 + 1;
    float* red = smem;  // [kWarpsK, 128 tokens, NT * 8 + 1] f32; column NT * 8: the sum of squares
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        float* row = red + (wk * kTokens + wm * 32 + mt * 16 + g) * ld;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            row[nt * 8 + 2 * c] = run[mt][nt][0];
            row[nt * 8 + 2 * c + 1] = run[mt][nt][1];
            row[8 * ld + nt * 8 + 2 * c] = run[mt][nt][2];
            row[8 * ld + nt * 8 + 2 * c + 1] = run[mt][nt][3];
        }
        if (c == 0) {
            row[NT * 8] = ss[mt][0];
            row[8 * ld + NT * 8] = ss[mt][1];
        }
    }
    __syncthreads();
    const int stride = rows + 1, live = static_cast<int>(min(static_cast<int64_t>(kTokens), tokens - t0));
    for (int i = threadIdx.x; i < live * stride; i += kThreads) {
        const int r = i / stride, j = i % stride, col = j < rows ? j : NT * 8;
        float sum = red[r * ld + col];
#pragma unroll
        for (int w = 1; w < kWarpsK; ++w) sum += red[(w * kTokens + r) * ld + col];
        part[((t0 + r) * splits + split) * stride + j] = sum;
    }
}

template <int NT, bool kPost>
void launch_nt(float* part, const float* f, int64_t tokens, int64_t width, const float* fn, int rows,
               int64_t split_width, int splits, int64_t cols, const PostSource& src, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};  // one bit per device
    constexpr int bytes = smem_floats<NT>() * static_cast<int>(sizeof(float));
    constexpr auto kernel = hc_dots_tc_kernel<NT, kPost>;
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    if (!(configured.load() >> (dev % 64) & 1)) {
        DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        // Shared memory before L1 (the stages bypass it), so that kBlocksPerSm blocks fit an SM.
        DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
        configured.fetch_or(uint64_t{1} << (dev % 64));
    }
    const unsigned tiles = static_cast<unsigned>(ceil_div(tokens, kTokens));
    const dim3 grid = kPost ? dim3(static_cast<unsigned>(splits), tiles) : dim3(tiles, static_cast<unsigned>(splits));
    kernel<<<grid, kThreads, bytes, stream>>>(part, f, fn, tokens, width, rows, split_width, splits, cols, src);
}

}  // namespace

bool hc_dots_tc_applies(const float* f, int64_t width, const float* fn, int rows) {
    return rows >= 1 && rows <= kMaxNTiles * 8 && width > 0 && width % 4 == 0 &&
           reinterpret_cast<uintptr_t>(f) % 16 == 0 && reinterpret_cast<uintptr_t>(fn) % 16 == 0;
}

// The fewest splits (a power of two, each at least kMinSplit wide) whose blocks fill every SM's kBlocksPerSm
// slots; their width in whole stages. At 16,384 tokens and W = 16,384 on 132 SMs: 4 splits, 512 blocks.
// With 4 streams, whole column blocks of each stream (4 stages).
int64_t hc_dots_tc_split_width(int64_t tokens, int64_t width, int64_t streams) {
    const int64_t tiles = ceil_div(tokens, kTokens), target = kBlocksPerSm * int64_t{device_sm_count()};
    const int64_t most = std::max<int64_t>(1, width / kMinSplit);
    int64_t splits = 1;
    while (splits < most && tiles * splits < target) splits *= 2;
    const int64_t unit = streams == 4 ? 4 * kStep : kStep;
    return ceil_div(ceil_div(width, std::min(splits, most)), unit) * unit;
}

void launch_hc_dots_tc(float* part, const float* f, int64_t tokens, int64_t width, const float* fn, int rows,
                       int64_t split_width, int64_t streams, cudaStream_t stream) {
    DI_ICHECK(hc_dots_tc_applies(f, width, fn, rows) && split_width % kStep == 0 &&
                  (streams == 1 || (streams == 4 && width % 16 == 0 && split_width % (4 * kStep) == 0)),
              "hc tensor-core dots layout");
    const int64_t splits = ceil_div(width, split_width);
    DI_ICHECK(splits <= 65535, "hc tensor-core dots: ", splits, " splits");
    auto launch = rows <= 8 ? launch_nt<1, false> : rows <= 16 ? launch_nt<2, false> : launch_nt<3, false>;
    launch(part, f, tokens, width, fn, rows, split_width, static_cast<int>(splits), streams == 4 ? width / 4 : 0,
           PostSource{}, stream);
    DI_CUDA_LAUNCH_CHECK();
}

bool hc_post_dots_tc_applies(const float* out, const float* y, const float* old, int64_t d, const float* fn, int rows) {
    const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return d > 0 && d % 4 == 0 && aligned(y) && aligned(old) && hc_dots_tc_applies(out, 4 * d, fn, rows);
}

void launch_hc_post_dots_tc(float* part, float* out, const float* y, const float* post, const float* comb,
                            const float* old, int64_t tokens, int64_t d, const float* fn, int rows, int64_t split_width,
                            cudaStream_t stream) {
    DI_ICHECK(hc_post_dots_tc_applies(out, y, old, d, fn, rows) && split_width % (4 * kStep) == 0,
              "hc tensor-core dots with the expand: layout");
    const int64_t width = 4 * d, splits = ceil_div(width, split_width);
    DI_ICHECK(splits <= 65535 && ceil_div(tokens, kTokens) <= 65535, "hc tensor-core dots: ", splits, " splits");
    auto launch = rows <= 8 ? launch_nt<1, true> : rows <= 16 ? launch_nt<2, true> : launch_nt<3, true>;
    launch(part, out, tokens, width, fn, rows, split_width, static_cast<int>(splits), d,
           PostSource{out, y, post, comb, old}, stream);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
