// Row-wise and element-wise kernels: RMSNorm, RoPE, SwiGLU, gated pooling, quantization simulation.
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm_rows.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/rope.cuh"

namespace deepinfer::cuda {

namespace {

// Rows of up to 4096 aligned floats (the model's): each thread keeps its 16 values in registers, loaded as four
// float4s at once, so the row is read once with every load in flight (the loop below reads it twice, one
// dependent load at a time: ~8 us a row at decode). kNormThreads, kNormVec: norm_rows.cuh.
__global__ void __launch_bounds__(kNormThreads) rms_norm_vec_kernel(float* __restrict__ out, const float* __restrict__ x,
                                                                   const float* __restrict__ weight, int64_t cols,
                                                                   float eps) {
    pdl_prologue();  // see pdl.cuh
    const float4* xr = reinterpret_cast<const float4*>(x + blockIdx.x * cols);
    float4* yr = reinterpret_cast<float4*>(out + blockIdx.x * cols);
    const int n4 = static_cast<int>(cols / 4);
    float4 v[kNormVec];
    const float ss = load_row(v, xr, threadIdx.x, kNormThreads, n4);
    const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
    store_normed(yr, v, inv, weight, threadIdx.x, kNormThreads, n4);
}

// hc_collapse then RMSNorm, a block per row (collapse_norm_row, norm_rows.cuh). N > 0: n known at compile time.
template <int N>
__global__ void __launch_bounds__(kNormThreads)
    hc_collapse_norm_kernel(float* __restrict__ out, const float4* __restrict__ streams, const float* __restrict__ pre,
                            const float* __restrict__ weight, int n_rt, int64_t cols, float eps) {
    pdl_prologue();  // see pdl.cuh
    const int n = N > 0 ? N : n_rt;
    const int64_t r = blockIdx.x;
    collapse_norm_row<N>(out + r * cols, streams + r * n * (cols / 4), pre + r * n, weight, n, cols, eps);
}

// Rows of up to 1024 aligned floats (q heads of 512, the 1024 / 512 latents): a warp per row, V float4s a lane,
// so a block of 8 rows has no idle threads and no barrier (one block per 512-float row, above, left half its
// threads idle and took 1.6 ms for V4-Flash's 16384 x 64 query heads, 60% of the bandwidth).
constexpr int kRowWarps = 8;
// Fewer rows (decode) keep a block per row: its 8 warps' loads of a row are in flight at once, where one warp's
// come one after another (6.0 vs 5.3 us a call, on average, over a batch-1 decode step).
constexpr int64_t kRowWarpMinRows = 1024;
template <int V>
__global__ void __launch_bounds__(kRowWarps * 32) rms_norm_warp_kernel(float* __restrict__ out,
                                                                      const float* __restrict__ x,
                                                                      const float* __restrict__ weight, int64_t rows,
                                                                      int64_t cols, float eps) {
    pdl_prologue();  // see pdl.cuh
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const int lane = threadIdx.x % 32, n4 = static_cast<int>(cols / 4);
    float4 v[V];
    float ss = load_row(v, reinterpret_cast<const float4*>(x + r * cols), lane, 32, n4);
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
    store_normed(reinterpret_cast<float4*>(out + r * cols), v, inv, weight, lane, 32, n4);
}

__global__ void rms_norm_kernel(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ weight,
                                int64_t cols, float eps) {
    pdl_prologue();  // see pdl.cuh
    const float* xr = x + blockIdx.x * cols;
    float* yr = out + blockIdx.x * cols;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i] * inv;
        yr[i] = weight ? weight[i] * v : v;
    }
}

__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, int64_t rows, int64_t heads, int64_t head_dim,
                            int half, float af, float sign) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * heads * half) return;
    const int pair = static_cast<int>(i % half);
    const int64_t rh = i / half, r = rh / heads;
    float* v = x + rh * head_dim + (head_dim - 2 * half) + 2 * pair;
    float a = v[0], b = v[1];
    rotate_pair(a, b, positions[r], inv_freq[pair], af, sign);
    v[0] = a;
    v[1] = b;
}

__global__ void rope_table_kernel(float2* __restrict__ table, const int32_t* __restrict__ positions,
                                  const float* __restrict__ inv_freq, int64_t rows, int half, float af) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * half) return;
    float2 cs;
    rope_cos_sin(positions[i / half], inv_freq[i % half], af, cs.x, cs.y);
    table[i] = cs;
}

// RMSNorm then RoPE of rows of up to 4096 aligned floats (a head of x [rows / heads, heads, cols]), a block per row,
// in place: rms_norm_vec_kernel's arithmetic, then rope_kernel's on the normed values in registers, so the output
// is bitwise the two kernels' without the row's second trip through memory and one launch. The rotated pairs are
// the last 2 half columns (cols - 2 half a multiple of 4: a float4 holds two whole pairs or none).
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_rope_kernel(float* __restrict__ x, const float* __restrict__ weight, int64_t cols, float eps,
                         const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int64_t heads,
                         int half, float af) {
    pdl_prologue();  // see pdl.cuh
    float4* xr = reinterpret_cast<float4*>(x + blockIdx.x * cols);
    const int n4 = static_cast<int>(cols / 4), first4 = static_cast<int>((cols - 2 * half) / 4);
    float4 v[kNormVec];
    const float ss = load_row(v, xr, threadIdx.x, kNormThreads, n4);
    const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
    const int32_t position = positions[blockIdx.x / heads];
#pragma unroll
    for (int u = 0; u < kNormVec; ++u) {
        const int i = threadIdx.x + u * kNormThreads;
        if (i >= n4) break;
        float4 o = normed4(v[u], inv, weight, i);
        if (i >= first4) {
            const int pair = 2 * (i - first4);
            rotate_pair(o.x, o.y, position, inv_freq[pair], af, 1.0f);
            rotate_pair(o.z, o.w, position, inv_freq[pair + 1], af, 1.0f);
        }
        xr[i] = o;
    }
}

__global__ void swiglu_kernel(float* __restrict__ out, const float* __restrict__ gate, const float* __restrict__ up,
                              int64_t n, float limit) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = swiglu_value(gate[i], up[i], limit);
}

__global__ void gated_pool_kernel(float* __restrict__ out, const float* __restrict__ kv, const float* __restrict__ gate,
                                  int64_t entries, int64_t slots, int64_t c) {
    pdl_prologue();  // see pdl.cuh
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= entries * c) return;
    const int64_t e = i / c, ch = i % c;
    float m = -INFINITY;
    for (int64_t s = 0; s < slots; ++s) m = fmaxf(m, gate[(e * slots + s) * c + ch]);
    float denom = 0, acc = 0;
    for (int64_t s = 0; s < slots; ++s) {
        const float g = gate[(e * slots + s) * c + ch];
        if (g == -INFINITY) continue;
        const float p = expf(g - m);
        denom += p;
        acc += p * kv[(e * slots + s) * c + ch];
    }
    out[i] = acc / denom;
}

// The QAT recipes of backend/cpu/quant_sim.cpp, element for element (FP8's in quant_math.cuh).
__device__ float round_e2m1(float v) {
    const float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float mag = fabsf(v);
    const int idx = (mag > 0.25f) + (mag >= 0.75f) + (mag > 1.25f) + (mag >= 1.75f) + (mag > 2.5f) + (mag >= 3.5f) +
                    (mag > 5.0f);
    const float q = kGrid[idx];
    return v < 0 ? -q : (v > 0 ? q : 0.0f * v);
}

// A warp per block of `block` elements, lane i taking elements i, i + 32, ... (coalesced); the maximum by shuffles
// (fmaxf in any order is the CPU's serial maximum, NaN ignored alike), then each element as the CPU rounds it.
__global__ void fake_quantize_kernel(float* __restrict__ x, int64_t blocks, int block, int kind) {
    const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= blocks) return;
    float* v = x + b * block;
    float amax = 0;
    for (int i = lane; i < block; i += 32) amax = fmaxf(amax, fabsf(v[i]));
    amax = warp_max(amax);
    if (kind == 0) {
        const float s = fp8_block_scale(amax);
        for (int i = lane; i < block; i += 32) v[i] = fp8_code_float(fp8_code(v[i], s)) * s;
    } else {
        const float s = kind == 1 ? round_e4m3(fmaxf(amax, 6.0f * 0.001953125f) / 6.0f)
                                  : pow2_ceil(fmaxf(amax, 6.0f * 1.17549435e-38f) * (1.0f / 6.0f));
        for (int i = lane; i < block; i += 32) v[i] = round_e2m1(fminf(fmaxf(v[i] / s, -6.0f), 6.0f)) * s;
    }
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Whether a row of `cols` floats fits the register-resident kernels (rms_norm_vec_kernel and the fused ones).
bool fits_vec_row(int64_t cols) { return cols % 4 == 0 && cols <= int64_t{4} * kNormVec * kNormThreads; }

// Whether launch_rms_norm gives `rows` vector rows of `cols` a warp each (else a block each): many short rows, unless
// fixed_kernel (batch-invariant mode) keeps the block-a-row kernel, and so one summation order, for every row count.
bool rms_norm_takes_warps(int64_t rows, int64_t cols, bool fixed_kernel) {
    return cols <= 1024 && rows >= kRowWarpMinRows && !fixed_kernel;
}

}  // namespace

void launch_rms_norm(float* out, const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                     bool fixed_kernel, cudaStream_t stream) {
    if (rows == 0) return;
    const bool vec = fits_vec_row(cols) && aligned16(out) && aligned16(x) && aligned16(weight);
    if (vec && rms_norm_takes_warps(rows, cols, fixed_kernel)) {
        const unsigned blocks = static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
        const int v = static_cast<int>((cols + 127) / 128);  // float4s a lane
        auto kernel = v == 1 ? rms_norm_warp_kernel<1> : v == 2 ? rms_norm_warp_kernel<2>
                                                     : v <= 4 ? rms_norm_warp_kernel<4> : rms_norm_warp_kernel<8>;
        launch_pdl(kernel, blocks, kRowWarps * 32, 0, stream, out, x, weight, rows, cols, eps);
    } else if (vec) {
        launch_pdl(rms_norm_vec_kernel, static_cast<unsigned>(rows), kNormThreads, 0, stream, out, x, weight, cols, eps);
    } else
        launch_pdl(rms_norm_kernel, static_cast<unsigned>(rows), 256, 0, stream, out, x, weight, cols, eps);
    DI_CUDA_LAUNCH_CHECK();
}

bool hc_collapse_norm_applies(int64_t n, int64_t d, const float* out, const float* streams, const float* weight) {
    return n >= 1 && n <= 8 && fits_vec_row(d) && aligned16(out) && aligned16(streams) && aligned16(weight);
}

void launch_hc_collapse_norm(float* out, const float* streams, const float* pre, const float* weight, int64_t rows,
                             int64_t n, int64_t d, float eps, cudaStream_t stream) {
    if (rows == 0) return;
    DI_ICHECK(hc_collapse_norm_applies(n, d, out, streams, weight), "hc_collapse_norm: n ", n, ", d ", d);
    auto kernel = n == 4 ? hc_collapse_norm_kernel<4> : hc_collapse_norm_kernel<0>;
    launch_pdl(kernel, static_cast<unsigned>(rows), kNormThreads, 0, stream, out,
               reinterpret_cast<const float4*>(streams), pre, weight, static_cast<int>(n), d, eps);
    DI_CUDA_LAUNCH_CHECK();
}

bool rms_norm_rope_applies(const float* x, const float* weight, int64_t rows, int64_t heads, int64_t head_dim,
                           int rope_dim, bool fixed_kernel) {
    // Where launch_rms_norm takes its block-a-row kernel, and the rotated dims are whole float4s.
    return fits_vec_row(head_dim) && !rms_norm_takes_warps(rows * heads, head_dim, fixed_kernel) && rope_dim % 4 == 0 &&
           rope_dim <= head_dim && aligned16(x) && aligned16(weight);
}

void launch_rms_norm_rope(float* x, const float* weight, float eps, const int32_t* positions, const float* inv_freq,
                          int64_t rows, int64_t heads, int64_t head_dim, int rope_dim, float attention_factor,
                          bool fixed_kernel, cudaStream_t stream) {
    DI_ICHECK(rms_norm_rope_applies(x, weight, rows, heads, head_dim, rope_dim, fixed_kernel), "rms_norm_rope");
    if (rows * heads == 0) return;
    launch_pdl(rms_norm_rope_kernel, static_cast<unsigned>(rows * heads), kNormThreads, 0, stream, x, weight, head_dim,
               eps, positions, inv_freq, heads, rope_dim / 2, attention_factor);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_rope_table(float2* table, const int32_t* positions, const float* inv_freq, int64_t rows, int half,
                       float attention_factor, cudaStream_t stream) {
    const int64_t n = rows * half;
    if (n == 0) return;
    launch_pdl(rope_table_kernel, blocks_for(n, 256), 256, 0, stream, table, positions, inv_freq, rows, half,
               attention_factor);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_rope(float* x, const int32_t* positions, const float* inv_freq, int64_t rows, int64_t heads,
                 int64_t head_dim, int rope_dim, float attention_factor, bool inverse, cudaStream_t stream) {
    const int half = rope_dim / 2;
    const int64_t n = rows * heads * half;
    if (n == 0) return;
    launch_pdl(rope_kernel, blocks_for(n, 256), 256, 0, stream, x, positions, inv_freq, rows, heads, head_dim, half,
                                                        attention_factor, inverse ? -1.0f : 1.0f);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_swiglu(float* out, const float* gate, const float* up, int64_t n, float limit, cudaStream_t stream) {
    if (n == 0) return;
    launch_pdl(swiglu_kernel, blocks_for(n, 256), 256, 0, stream, out, gate, up, n, limit);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_gated_pool(float* out, const float* kv, const float* gate, int64_t entries, int64_t slots, int64_t c,
                       cudaStream_t stream) {
    if (entries * c == 0) return;
    launch_pdl(gated_pool_kernel, blocks_for(entries * c, 256), 256, 0, stream, out, kv, gate, entries, slots, c);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_fake_quantize(float* x, int64_t n, int block, int kind, cudaStream_t stream) {
    const int64_t blocks = n / block;
    if (blocks == 0) return;
    fake_quantize_kernel<<<blocks_for(blocks * 32, 256), 256, 0, stream>>>(x, blocks, block, kind);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
