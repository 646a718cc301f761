// Tensor-core matrix products for more than kGemvMaxRows activation rows: out [T, N] f32 = x [T, K] f32 . W^T,
// W [N, K] in any stored format. mma.sync m16n8k16 with bf16 inputs and fp32 accumulation:
//  - x is rounded to bf16 once by a small pass into a scratch [T, Kp] (Kp = K rounded up to kBK, zero padded),
//    so the main loop streams half the activation bytes with cp.async and never checks K for x;
//  - W tiles are loaded into registers one stage ahead and dequantized into shared memory as bf16. FP8 e4m3
//    and FP4 e2m1 times a power-of-two E8M0 scale are exact in bf16; f32 scales, f16 and f32 weights round.
// Per output element the reduction is always the same sequence of k16 MMAs over K in order, whatever the tile
// shape or T, so without split-K a row's result does not depend on the other rows (batch-invariant mode).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/launch.cuh"

namespace deepinfer::cuda {

namespace {

using namespace mma;

constexpr int kThreads = 256;  // 8 warps: 2 along M x 4 along N
constexpr int kBK = 32;        // K per pipeline stage
constexpr int kLds = kBK + 8;  // shared row stride (bf16): 80 bytes, so ldmatrix's 8 row reads hit distinct banks
constexpr int kGroupM = 16;    // M tiles per raster group: concurrent blocks share x rows and W tiles in L2

// Weight kinds with a vectorized loader (16 consecutive weights of one row per thread), and kAny: any format,
// element by element through weight_at (K not a multiple of 16, or scale blocks not multiples of 16).
enum Kind { kF32, kBF16, kF16, kFP8, kFP4, kAny };

struct TcParams {
    float* out;                // [rows, n_out] at row stride ldc; with split-K [splits, rows, n_out] partials
    int64_t ldc;
    int64_t split_stride;      // floats between the partials of consecutive splits (0: one split)
    const __nv_bfloat16* x;    // [rows, kp] bf16, zero in columns >= k
    int64_t kp;
    int64_t rows, n_out, k;
    WeightDesc w;              // W rows w_row0 .. w_row0 + n_out
    int64_t w_row0;
    int steps_per_split;       // kBK steps of K per blockIdx.y
};

// One thread's share of a W tile: 16 consecutive weights of one row, raw, loaded a stage ahead.
template <int KIND>
struct WChunk {
    uint4 raw[KIND == kF32 ? 4 : (KIND == kBF16 || KIND == kF16) ? 2 : 1];
    float scale;

    // Row `row` of W, weights k .. k + 15 (all in range or, valid false, all zero).
    __device__ __forceinline__ void load(const WeightDesc& w, int64_t row, int64_t k, bool valid) {
#pragma unroll
        for (auto& r : raw) r = make_uint4(0, 0, 0, 0);
        scale = 1.0f;
        if (!valid) return;
        if constexpr (KIND == kF32) {
            const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const float*>(w.data) + row * w.cols + k);
#pragma unroll
            for (int i = 0; i < 4; ++i) raw[i] = __ldg(p + i);
        } else if constexpr (KIND == kBF16 || KIND == kF16) {
            const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(w.data) + row * w.cols + k);
            raw[0] = __ldg(p);
            raw[1] = __ldg(p + 1);
        } else if constexpr (KIND == kFP8) {
            raw[0] = __ldg(reinterpret_cast<const uint4*>(w.data + row * w.cols + k));
            const int64_t si = (row / w.block_rows) * w.scale_cols + k / w.block_cols;
            scale = w.scale_f32 ? __ldg(reinterpret_cast<const float*>(w.scale) + si) : e8m0_to_f32(__ldg(w.scale + si));
        } else if constexpr (KIND == kFP4) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(w.data + row * (w.cols / 2) + k / 2));
            raw[0].x = v.x;
            raw[0].y = v.y;
            scale = e8m0_to_f32(__ldg(w.scale + row * w.scale_cols + k / w.block_cols));
        }
    }

    // The 16 weights as bf16 pairs.
    __device__ __forceinline__ void dequantize(uint32_t (&o)[8]) const {
        if constexpr (KIND == kF32) {
            const float* f = reinterpret_cast<const float*>(raw);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
        } else if constexpr (KIND == kBF16) {
            const uint32_t* u = reinterpret_cast<const uint32_t*>(raw);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = u[i];
        } else if constexpr (KIND == kF16) {
            const __half2* h = reinterpret_cast<const __half2*>(raw);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float2 f = __half22float2(h[i]);
                o[i] = pack_bf16(f.x, f.y);
            }
        } else if constexpr (KIND == kFP8) {
            const uint16_t* b = reinterpret_cast<const uint16_t*>(raw);  // byte pairs, low byte first
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(b[i], __NV_E4M3)));
                o[i] = pack_bf16(f.x * scale, f.y * scale);
            }
        } else if constexpr (KIND == kFP4) {
            // Little-endian bytes, low nibble first: weight 2j is byte j's low nibble.
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const uint32_t word = i < 4 ? raw[0].x : raw[0].y, sh = 8 * (i % 4);
                o[i] = pack_bf16(fp4e2m1_to_f32((word >> sh) & 0xf) * scale,
                                 fp4e2m1_to_f32((word >> (sh + 4)) & 0xf) * scale);
            }
        }
    }
};

// out tile [BM, BN] of rows m0.., features n0..; K steps [s0, s1) of kBK.
template <int BM, int BN, int KIND>
__global__ void __launch_bounds__(kThreads, 2) gemm_tc_kernel(TcParams p) {
    constexpr int WM = BM / 2, WN = BN / 4;  // warp tile
    constexpr int MT = WM / 16, NT = WN / 8;  // MMA tiles per warp
    static_assert(NT % 2 == 0, "B fragments are loaded for two n8 tiles at once");
    __shared__ __align__(16) __nv_bfloat16 xs[2][BM * kLds];  // [stage][BM rows][kBK (+pad)]
    __shared__ __align__(16) __nv_bfloat16 ws[2][BN * kLds];  // [stage][BN features][kBK (+pad)]

    // Grouped raster: kGroupM M tiles sweep the N tiles together.
    const int tiles_m = static_cast<int>((p.rows + BM - 1) / BM), tiles_n = static_cast<int>((p.n_out + BN - 1) / BN);
    const int pid = blockIdx.x, width = kGroupM * tiles_n, first_m = (pid / width) * kGroupM;
    const int group = min(tiles_m - first_m, kGroupM);
    const int64_t m0 = static_cast<int64_t>(first_m + (pid % width) % group) * BM;
    const int64_t n0 = static_cast<int64_t>((pid % width) / group) * BN;

    const int total_steps = static_cast<int>((p.k + kBK - 1) / kBK);
    const int s0 = blockIdx.y * p.steps_per_split, s1 = min(s0 + p.steps_per_split, total_steps);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / 4, wn = warp % 4;

    // x tile: BM rows x 4 chunks of 8 bf16, async.
    auto load_x = [&](int stage, int step) {
#pragma unroll
        for (int c = tid; c < BM * 4; c += kThreads) {
            const int r = c / 4, cc = c % 4;
            const bool ok = m0 + r < p.rows;
            const __nv_bfloat16* src = ok ? p.x + (m0 + r) * p.kp + step * kBK + cc * 8 : p.x;
            cp_async16(&xs[stage][r * kLds + cc * 8], src, ok ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    // W tile: BN rows x 2 halves of 16 weights; thread tid owns row tid / 2, half tid % 2.
    const int w_r = tid / 2, w_c = (tid % 2) * 16;
    const bool w_active = w_r < BN;
    WChunk<KIND == kAny ? kF32 : KIND> chunk;
    auto load_w = [&](int step) {
        if constexpr (KIND != kAny) {
            const int64_t n = n0 + w_r, k = static_cast<int64_t>(step) * kBK + w_c;
            chunk.load(p.w, p.w_row0 + n, k, w_active && n < p.n_out && k < p.k);
        }
    };
    auto store_w = [&](int stage, int step) {
        if (!w_active) return;
        uint32_t o[8];
        if constexpr (KIND == kAny) {
            const int64_t n = n0 + w_r, k = static_cast<int64_t>(step) * kBK + w_c;
            float v[16];
#pragma unroll
            for (int e = 0; e < 16; ++e)
                v[e] = (n < p.n_out && k + e < p.k) ? weight_at(p.w, p.w_row0 + n, k + e) : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
        } else {
            chunk.dequantize(o);
        }
        uint4* dst = reinterpret_cast<uint4*>(&ws[stage][w_r * kLds + w_c]);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
    };

    // ldmatrix row addresses of this lane. A: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
    // (m 8-15, k 8-15); B: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
    const uint32_t a_lane = smem_addr(&xs[0][(wm * WM + lane % 16) * kLds + (lane / 16) * 8]);
    const uint32_t b_lane = smem_addr(&ws[0][(wn * WN + lane % 8 + (lane / 16) * 8) * kLds + ((lane / 8) % 2) * 8]);
    float acc[MT][NT][4] = {};
    auto compute = [&](int stage) {
        const uint32_t a_base = a_lane + stage * (BM * kLds * 2), b_base = b_lane + stage * (BN * kLds * 2);
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            uint32_t a[MT][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], a_base + (mt * 16 * kLds + kk) * 2);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t r[4];
                ldmatrix_x4(r, b_base + (np * 16 * kLds + kk) * 2);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    };

    // Two stages: while the MMAs consume one, the next x tile lands by cp.async and the next W tile waits in
    // registers, dequantized into the other stage after the MMAs.
    if (s0 < s1) {
        load_x(0, s0);
        load_w(s0);
        store_w(0, s0);
        asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    for (int step = s0; step < s1; ++step) {
        const int stage = (step - s0) & 1;
        const bool more = step + 1 < s1;
        if (more) {
            load_x(stage ^ 1, step + 1);
            load_w(step + 1);
        }
        compute(stage);
        if (more) {
            store_w(stage ^ 1, step + 1);
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
    }

    // Fragment layout: d0, d1 at row lane / 4, columns 2 (lane % 4) + {0, 1}; d2, d3 eight rows below.
    float* out = p.out + blockIdx.y * p.split_stride;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t m = m0 + wm * WM + mt * 16 + lane / 4 + (i / 2) * 8;
                const int64_t n = n0 + wn * WN + nt * 8 + (lane % 4) * 2 + i % 2;
                if (m < p.rows && n < p.n_out) out[m * p.ldc + n] = acc[mt][nt][i];
            }
}

// xb [rows, kp] bf16 = x [rows, k] (row stride lda) rounded to nearest even, zero in columns k .. kp - 1.
__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ xb, int64_t kp, const float* __restrict__ x, int64_t lda,
                               int64_t rows, int64_t k, bool vec) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, per_row = kp / 8;
    if (i >= rows * per_row) return;
    const int64_t r = i / per_row, c = (i % per_row) * 8;
    const float* src = x + r * lda + c;
    float v[8];
    if (vec && c + 8 <= k) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(src)), b = __ldg(reinterpret_cast<const float4*>(src) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = c + e < k ? __ldg(src + e) : 0.0f;
    }
    *reinterpret_cast<uint4*>(xb + r * kp + c) =
        make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

// x [n] f32 = xb [n] bf16 bits, exactly.
__global__ void from_bf16_kernel(float* __restrict__ x, const uint16_t* __restrict__ xb, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __uint_as_float(static_cast<uint32_t>(__ldg(xb + i)) << 16);
}

// out[t, n] (row stride ldc) = sum over splits, in split order, of part[s, t, n].
__global__ void split_sum_kernel(float* __restrict__ out, int64_t ldc, const float* __restrict__ part, int splits,
                                 int64_t rows, int64_t n_out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * n_out) return;
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += part[z * rows * n_out + i];
    out[(i / n_out) * ldc + i % n_out] = s;
}

int kind_of(const WeightDesc& w) {
    // The vector loaders read 16 weights of one row at once, inside one scale block, from aligned addresses.
    const bool whole = w.cols % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
    if (w.format == 0) return !whole ? kAny : w.dtype == 0 ? kF32 : w.dtype == 1 ? kBF16 : kF16;
    if (!whole || w.block_cols % 16 != 0) return kAny;
    return w.format == 1 ? kFP8 : kFP4;
}

template <int BM, int BN, int KIND>
void launch_kernel(const TcParams& p, dim3 grid, cudaStream_t stream) {
    gemm_tc_kernel<BM, BN, KIND><<<grid, kThreads, 0, stream>>>(p);
}

template <int BM, int BN>
void launch_tiles(const TcParams& p, int kind, dim3 grid, cudaStream_t stream) {
    switch (kind) {
        case kF32: launch_kernel<BM, BN, kF32>(p, grid, stream); break;
        case kBF16: launch_kernel<BM, BN, kBF16>(p, grid, stream); break;
        case kF16: launch_kernel<BM, BN, kF16>(p, grid, stream); break;
        case kFP8: launch_kernel<BM, BN, kFP8>(p, grid, stream); break;
        case kFP4: launch_kernel<BM, BN, kFP4>(p, grid, stream); break;
        default: launch_kernel<BM, BN, kAny>(p, grid, stream); break;
    }
}


}  // namespace

void launch_to_bf16(uint16_t* xb, int64_t kp, const float* x, int64_t lda, int64_t rows, int64_t k,
                    cudaStream_t stream) {
    const bool vec = lda % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int64_t chunks = rows * kp / 8;
    if (chunks == 0) return;
    to_bf16_kernel<<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(xb), kp, x, lda, rows, k, vec);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_from_bf16(float* x, const uint16_t* xb, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    from_bf16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, xb, n);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_gemm_tc(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                    int64_t w_row0, int64_t n_out, bool allow_split_k, cudaStream_t stream) {
    if (rows == 0 || n_out == 0) return;
    const int64_t k = w.cols, kp = std::max<int64_t>((k + kBK - 1) / kBK * kBK, kBK);

    // Activations to bf16 once: [rows, kp].
    __nv_bfloat16* xb = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&xb), rows * kp * 2, stream));
    launch_to_bf16(reinterpret_cast<uint16_t*>(xb), kp, x, lda, rows, k, stream);

    // The largest tile that still gives every SM a block; smaller problems take 64x64 tiles and, when allowed,
    // split K so that about two blocks run per SM (partials summed in split order: deterministic).
    const int sms = device_sm_count();
    auto tiles = [&](int bm, int bn) { return ((rows + bm - 1) / bm) * ((n_out + bn - 1) / bn); };
    int bm = 64, bn = 64;
    if (tiles(128, 128) >= sms) bm = 128, bn = 128;
    else if (tiles(128, 64) >= sms) bm = 128, bn = 64;
    const int64_t n_tiles = tiles(bm, bn);
    const int total_steps = static_cast<int>(kp / kBK);
    int splits = 1;
    if (allow_split_k && n_tiles < sms) {
        const int64_t want = std::min<int64_t>((2 * sms + n_tiles - 1) / n_tiles, std::max(total_steps / 8, 1));
        splits = static_cast<int>(std::min<int64_t>(want, 32));
    }
    const int per_split = (total_steps + splits - 1) / splits;
    splits = (total_steps + per_split - 1) / per_split;

    TcParams p{};
    float* part = nullptr;
    if (splits > 1) {
        DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&part), splits * rows * n_out * 4, stream));
        p.out = part, p.ldc = n_out, p.split_stride = rows * n_out;
    } else {
        p.out = out, p.ldc = ldc, p.split_stride = 0;
    }
    p.x = xb, p.kp = kp, p.rows = rows, p.n_out = n_out, p.k = k, p.w = w, p.w_row0 = w_row0;
    p.steps_per_split = per_split;
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(splits));
    const int kind = kind_of(w);
    if (bm == 128 && bn == 128) launch_tiles<128, 128>(p, kind, grid, stream);
    else if (bm == 128) launch_tiles<128, 64>(p, kind, grid, stream);
    else launch_tiles<64, 64>(p, kind, grid, stream);
    DI_CUDA_LAUNCH_CHECK();
    if (splits > 1) {
        split_sum_kernel<<<static_cast<unsigned>((rows * n_out + 255) / 256), 256, 0, stream>>>(out, ldc, part, splits,
                                                                                               rows, n_out);
        DI_CUDA_LAUNCH_CHECK();
        DI_CUDA_CHECK(cudaFreeAsync(part, stream));
    }
    DI_CUDA_CHECK(cudaFreeAsync(xb, stream));
}

}  // namespace deepinfer::cuda
