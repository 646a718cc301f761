// GEMV micro-benchmark: the decode products of DeepSeek-V4-Flash at 1 and 8 activation rows, timed with CUDA
// events over many launches that rotate through enough weight copies to miss the L2 cache. Prints us per call,
// GB/s of weight + scale bytes and the share of --bandwidth-gbs, beside the kernel the current one replaced
// (kept below as the baseline, one warp per output feature), and the relative difference of their outputs.
// Then the routed experts (expert_linear over 256 FP4 experts, top-6 of each token) at 1, 8, 32 and 128 tokens,
// rotating through 8 random routings so that consecutive calls touch different experts; GB/s counts the weight +
// scale bytes of the distinct experts a call touches. Both kernels of launch_expert_linear are timed: fp32 FMAs
// (DEEPINFER_CUDA_GEMM=tiled) and tensor cores (the bf16 modes), with the tensor-core output's relative difference
// from the fp32 one and, unless --no-baseline, the time of the expert kernel the fp32 one replaced.
//   gemv_bench [--bandwidth-gbs 4259] [--iters 200] [--no-baseline] [--experts-only | --no-experts]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_chunks.cuh"
#include "common/event_timing.cuh"

namespace deepinfer::cuda {
namespace baseline {


constexpr int kWarps = 8;   // output features per block
constexpr int kUnroll = 4;  // 16-byte loads in flight per lane

enum Kind { kF32, kBF16, kF16, kFP8, kFP4 };

// Weights per 16-byte chunk.
template <int K>
constexpr int kElems = K == kF32 ? 4 : (K == kBF16 || K == kF16) ? 8 : K == kFP8 ? 16 : 32;

template <int K>
__device__ __forceinline__ void dequantize(const uint4& v, float* out) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t u = words[i];
        if constexpr (K == kF32) {
            out[i] = __uint_as_float(u);
        } else if constexpr (K == kBF16) {
            out[2 * i] = bf16_bits_to_f32(static_cast<uint16_t>(u & 0xffff));
            out[2 * i + 1] = bf16_bits_to_f32(static_cast<uint16_t>(u >> 16));
        } else if constexpr (K == kF16) {
            out[2 * i] = f16_bits_to_f32(static_cast<uint16_t>(u & 0xffff));
            out[2 * i + 1] = f16_bits_to_f32(static_cast<uint16_t>(u >> 16));
        } else if constexpr (K == kFP8) {
#pragma unroll
            for (int b = 0; b < 4; ++b) out[4 * i + b] = f8e4m3_to_f32(static_cast<uint8_t>(u >> (8 * b)));
        } else {
            // Little-endian bytes, low nibble first: element 2j is byte j's low nibble.
#pragma unroll
            for (int b = 0; b < 8; ++b) out[8 * i + b] = fp4e2m1_to_f32(static_cast<uint8_t>((u >> (4 * b)) & 0xf));
        }
    }
}

// out[t, n] = sum_k x[t, k] * W[w_row0 + n, k] for t < rows (<= kGemvMaxRows).
template <int K>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(float* __restrict__ out, int64_t ldc,
                                                           const float* __restrict__ x, int64_t lda, int rows,
                                                           WeightDesc w, int64_t w_row0, int64_t n_out) {
    constexpr int E = kElems<K>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    if (n >= n_out) return;
    const int64_t row = w_row0 + n, chunks = w.cols / E;
    const uint4* wrow = reinterpret_cast<const uint4*>(w.data) + row * chunks;
    float acc[kGemvMaxRows] = {};
    for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * 32;
            v[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = c0 + u * 32;
            if (c >= chunks) break;
            const int64_t k0 = c * E;
            float wv[E];
            dequantize<K>(v[u], wv);
            float s = 1.0f;  // one scale per chunk: the chunk never straddles a scale block
            if constexpr (K == kFP8) {
                const int64_t si = (row / w.block_rows) * w.scale_cols + k0 / w.block_cols;
                s = w.scale_f32 ? reinterpret_cast<const float*>(w.scale)[si] : e8m0_to_f32(w.scale[si]);
            } else if constexpr (K == kFP4) {
                s = e8m0_to_f32(w.scale[row * w.scale_cols + k0 / w.block_cols]);
            }
#pragma unroll
            for (int t = 0; t < kGemvMaxRows; ++t) {
                if (t >= rows) break;
                const float* xr = x + t * lda + k0;
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d = fmaf(wv[e], __ldg(xr + e), d);
                acc[t] = fmaf(d, s, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxRows; ++t) {
        if (t >= rows) break;
        float a = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) out[t * ldc + n] = a;
    }
}

int kind_of(const WeightDesc& w) {
    if (w.format == 1) return kFP8;
    if (w.format == 2) return kFP4;
    return w.dtype == 0 ? kF32 : w.dtype == 1 ? kBF16 : kF16;
}

void launch(float* out, int64_t ldc, const float* x, int64_t lda, int rows, const WeightDesc& w, int64_t w_row0,
            int64_t n_out, cudaStream_t stream) {
    const unsigned grid = static_cast<unsigned>((n_out + kWarps - 1) / kWarps);
    switch (kind_of(w)) {
        case kF32: gemv_kernel<kF32><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out); break;
        case kBF16: gemv_kernel<kBF16><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out); break;
        case kF16: gemv_kernel<kF16><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out); break;
        case kFP8: gemv_kernel<kFP8><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out); break;
        default: gemv_kernel<kFP4><<<grid, kWarps * 32, 0, stream>>>(out, ldc, x, lda, rows, w, w_row0, n_out); break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace baseline

// The routed-expert kernel before the one in moe.cu (FP4 only here): block (tile of 64 features, row y) serves
// row y's expert when y is the first row routed to it, in passes of up to 4 of its rows.
namespace baseline_experts {

using namespace chunks;

constexpr int kThreads = 256, kGroups = kThreads / 8;
constexpr int kTile = 2 * kGroups;  // output features per block: 2 per group of 8 lanes
constexpr int kPassRows = 4;        // rows of one expert served per pass over its weight
constexpr int kU = 2;               // steps (16-byte loads per weight row and lane) per batch

struct StreamParams {
    ExpertLinearDesc d;
    int scale_shift;  // FP8/FP4: log2(16-byte chunks per scale block along K)
    int x_vec4;       // x rows start 16-byte aligned: float4 loads
};

template <int K>
__global__ void __launch_bounds__(kThreads, 2) expert_linear_kernel(const StreamParams p) {
    constexpr int E = kElems<K>, G = kGran<K>;
    constexpr bool kScaled = K == kFP8 || K == kFP4;
    __shared__ int members[kPassRows];  // the pass's rows, ascending
    __shared__ int count;
    const ExpertLinearDesc& d = p.d;
    const int l8 = threadIdx.x % 8, group = threadIdx.x / 8, lane = threadIdx.x % 32;
    const int chunks = static_cast<int>(d.k / E);
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
    const int batches = (chunks + 8 * kU - 1) / (8 * kU);

    for (int64_t y = blockIdx.y; y < d.rows; y += gridDim.y) {
        const int e = d.expert_of_row[y];
        const bool valid = e >= 0 && e < d.num_experts;
        // Row y leads when no earlier row has its expert; a row with an invalid id leads alone.
        int earlier = 0;
        if (valid)
            for (int64_t r = threadIdx.x; r < y; r += kThreads) earlier |= d.expert_of_row[r] == e;
        if (__syncthreads_or(earlier)) continue;
        if (!valid) {
            for (int j = threadIdx.x; j < kTile; j += kThreads)
                if (n0 + j < d.n) d.out[y * d.n + n0 + j] = __int_as_float(0x7fc00000);
            continue;
        }
        const WeightDesc w = d.table[e];
        const uint4* wdata = reinterpret_cast<const uint4*>(w.data);
        const uint4* wrow[2];
        int64_t nrow[2];
        int srow[2];  // scale row offsets (an expert's scale grid is far below 2^31 entries)
        for (int r = 0; r < 2; ++r) {
            nrow[r] = n0 + group + kGroups * r;
            const int64_t row = min(nrow[r], d.n - 1);  // features past the end compute a copy, unwritten
            wrow[r] = wdata + row * chunks;
            srow[r] = static_cast<int>((K == kFP8 ? row / w.block_rows : row) * w.scale_cols);
        }

        struct Batch {
            uint4 v[kU][2];
            uint32_t s[kU][2];  // raw scale bits
        };
        auto load = [&](Batch& b, int batch) {
            for (int u = 0; u < kU; ++u) {
                const int c = l8 + 8 * (batch * kU + u);
                for (int r = 0; r < 2; ++r) {
                    const bool ok = c < chunks;
                    b.v[u][r] = ok ? __ldg(wrow[r] + c) : make_uint4(0, 0, 0, 0);
                    b.s[u][r] = 0;
                    if constexpr (kScaled) {
                        const int si = srow[r] + (c >> p.scale_shift);
                        if (ok)
                            b.s[u][r] = K == kFP8 && w.scale_f32 ? __ldg(reinterpret_cast<const uint32_t*>(w.scale) + si)
                                                                 : __ldg(w.scale + si);
                    }
                }
            }
        };

        int64_t from = y;
        while (true) {
            // Warp 0 collects the expert's next rows from `from` on.
            if (threadIdx.x < 32) {
                int cnt = 0;
                for (int64_t base = from; base < d.rows && cnt < kPassRows; base += 32) {
                    const int64_t r = base + lane;
                    const bool m = r < d.rows && d.expert_of_row[r] == e;
                    const unsigned mask = __ballot_sync(0xffffffffu, m);
                    const int at = cnt + __popc(mask & ((1u << lane) - 1u));
                    if (m && at < kPassRows) members[at] = static_cast<int>(r);
                    cnt = min(cnt + __popc(mask), kPassRows);
                }
                if (lane == 0) count = cnt;
            }
            __syncthreads();
            const int nr = count;
            if (nr == 0) break;
            int xoff[kPassRows];  // the rows' inputs, as offsets into x (x is small: the launcher checks)
#pragma unroll
            for (int t = 0; t < kPassRows; ++t)
                xoff[t] = t < nr ? members[t] / d.rows_per_input * static_cast<int>(d.k) : 0;

            float acc[2][kPassRows] = {};
            Batch cur;
            load(cur, 0);
            for (int b = 0; b < batches; ++b) {
                Batch nxt;
                load(nxt, b + 1);  // loads past the row are skipped, so the last batch prefetches nothing
#pragma unroll
                for (int u = 0; u < kU; ++u) {
                    const int c = l8 + 8 * (b * kU + u);
                    if (c >= chunks) break;
                    float dd[2][kPassRows] = {};  // the chunk's sums, before its scale
#pragma unroll
                    for (int g = 0; g < E / G; ++g) {
                        float wf[2][G];
#pragma unroll
                        for (int r = 0; r < 2; ++r) decode<K>(cur.v[u][r], g, wf[r]);
#pragma unroll
                        for (int h = 0; h < G / 4; ++h) {
                            const int xo = c * E + g * G + 4 * h;
#pragma unroll
                            for (int t = 0; t < kPassRows; ++t) {
                                if (t >= nr) break;
                                const float* xp = d.x + xoff[t] + xo;
                                const float4 xv = p.x_vec4 ? __ldg(reinterpret_cast<const float4*>(xp))
                                                           : make_float4(xp[0], xp[1], xp[2], xp[3]);
#pragma unroll
                                for (int r = 0; r < 2; ++r) {
                                    const float* wv = wf[r] + 4 * h;
                                    float& a = kScaled ? dd[r][t] : acc[r][t];
                                    a = fmaf(wv[0], xv.x, a);
                                    a = fmaf(wv[1], xv.y, a);
                                    a = fmaf(wv[2], xv.z, a);
                                    a = fmaf(wv[3], xv.w, a);
                                }
                            }
                        }
                    }
                    if constexpr (kScaled) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const uint32_t sb = cur.s[u][r];
                            const float sc =
                        K == kFP8 && w.scale_f32 ? __uint_as_float(sb) : e8m0_to_f32(static_cast<uint8_t>(sb));
#pragma unroll
                            for (int t = 0; t < kPassRows; ++t) acc[r][t] = fmaf(dd[r][t], sc, acc[r][t]);
                        }
                    }
                }
                cur = nxt;
            }

            // Sum the 8 lanes of each group (fixed butterfly) and write the pass's rows.
            const float post = K == kFP4 ? 64.0f : 1.0f;  // undo the FP4 decode's 2^-6
#pragma unroll
            for (int r = 0; r < 2; ++r) {
#pragma unroll
                for (int t = 0; t < kPassRows; ++t) {
                    if (t >= nr) break;
                    float a = acc[r][t];
                    a += __shfl_xor_sync(0xffffffffu, a, 1);
                    a += __shfl_xor_sync(0xffffffffu, a, 2);
                    a += __shfl_xor_sync(0xffffffffu, a, 4);
                    if (l8 == 0 && nrow[r] < d.n) d.out[static_cast<int64_t>(members[t]) * d.n + nrow[r]] = a * post;
                }
            }
            const int last = members[nr - 1];
            __syncthreads();  // members and count are rewritten by the next pass
            if (nr < kPassRows) break;
            from = last + 1;
        }
    }
}

void launch(const ExpertLinearDesc& d, const WeightDesc& first, cudaStream_t stream) {
    StreamParams p{d, __builtin_ctz(static_cast<unsigned>(first.block_cols / 32)),
                   reinterpret_cast<uintptr_t>(d.x) % 16 == 0 ? 1 : 0};
    const dim3 grid(static_cast<unsigned>((d.n + kTile - 1) / kTile),
                    static_cast<unsigned>(std::min<int64_t>(d.rows, 65535)));
    expert_linear_kernel<kFP4><<<grid, kThreads, 0, stream>>>(p);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace baseline_experts
}  // namespace deepinfer::cuda

namespace {

using namespace deepinfer::cuda;

#define CHECK(expr) DI_CUDA_CHECK(expr)

__device__ __forceinline__ uint32_t hash(uint64_t i, uint32_t seed) {
    uint64_t h = (i + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return static_cast<uint32_t>(h >> 32);
}

// Random but finite contents: mode 0 f32 in [-0.5, 0.5), 1 bf16 / 2 f16 in +-[0.5, 1), 3 e4m3 (no NaN), 4 e2m1,
// 5 E8M0 scales 2^-7 .. 2^0, 6 f32 scales 2^-8.
__global__ void fill(uint8_t* p, int64_t bytes, int mode, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += int64_t{gridDim.x} * blockDim.x) {
        const uint32_t h = hash(i, seed);
        if (mode == 0 || mode == 6) {
            if (i % 4 != 0) continue;
            const float v = mode == 0 ? static_cast<float>(h % 1000) / 1000.0f - 0.5f : 1.0f / 256;
            *reinterpret_cast<float*>(p + i) = v;
        } else if (mode == 1 || mode == 2) {
            if (i % 2 != 0) continue;
            *reinterpret_cast<uint16_t*>(p + i) = mode == 1 ? (h & 0x807f) | 0x3f00 : (h & 0x83ff) | 0x3800;
        } else if (mode == 3) {
            p[i] = static_cast<uint8_t>(h & 0xbf);
        } else if (mode == 4) {
            p[i] = static_cast<uint8_t>(h);
        } else {
            p[i] = static_cast<uint8_t>(120 + h % 8);
        }
    }
}

void fill_device(void* p, int64_t bytes, int mode, uint32_t seed) {
    fill<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, mode, seed);
    DI_CUDA_LAUNCH_CHECK();
}

struct Case {
    const char* name;
    int64_t n, k;
    int format, dtype, scale_f32;  // as in WeightDesc
    int groups;                    // grouped_linear: n / groups outputs per group over k inputs each
};

const char* dtype_label(const Case& c) {
    if (c.format == 2) return "fp4";
    if (c.format == 1) return c.scale_f32 ? "fp8/f32" : "fp8/e8m0";
    return c.dtype == 0 ? "f32" : c.dtype == 1 ? "bf16" : "f16";
}

struct Matrix {
    WeightDesc d;
    int64_t bytes = 0, scale_bytes = 0;
};

Matrix make_matrix(const Case& c, uint32_t seed) {
    Matrix m;
    WeightDesc& d = m.d;
    d = WeightDesc{};
    d.rows = c.n, d.cols = c.k, d.format = c.format, d.dtype = c.dtype, d.scale_f32 = c.scale_f32;
    int data_mode = 0, scale_mode = 5;
    if (c.format == 0) {
        m.bytes = c.n * c.k * (c.dtype == 0 ? 4 : 2);
        data_mode = c.dtype == 0 ? 0 : c.dtype == 1 ? 1 : 2;
    } else if (c.format == 1) {
        d.block_rows = d.block_cols = 128;
        d.scale_cols = (c.k + 127) / 128;
        m.bytes = c.n * c.k;
        m.scale_bytes = (c.n + 127) / 128 * d.scale_cols * (c.scale_f32 ? 4 : 1);
        data_mode = 3;
        scale_mode = c.scale_f32 ? 6 : 5;
    } else {
        d.block_cols = 32;
        d.scale_cols = c.k / 32;
        m.bytes = c.n * c.k / 2;
        m.scale_bytes = c.n * d.scale_cols;
        data_mode = 4;
    }
    uint8_t* data = nullptr;
    CHECK(cudaMalloc(&data, m.bytes));
    fill_device(data, m.bytes, data_mode, seed);
    d.data = data;
    if (m.scale_bytes) {
        uint8_t* scale = nullptr;
        CHECK(cudaMalloc(&scale, m.scale_bytes));
        fill_device(scale, m.scale_bytes, scale_mode, seed + 1);
        d.scale = scale;
    }
    return m;
}

// One call of the product: a plain linear, or one launch per group as the CUDA backend's grouped_linear does.
template <typename Launch>
void run_case(const Case& c, const WeightDesc& d, float* out, const float* x, int rows, Launch launch) {
    const int64_t r = c.n / c.groups;
    for (int g = 0; g < c.groups; ++g) launch(out + g * r, c.n, x + g * c.k, c.groups * c.k, rows, d, g * r, r);
}

template <typename Launch>
double time_us(const Case& c, const std::vector<Matrix>& copies, float* out, const float* x, int rows, int iters,
               Launch launch) {
    auto call = [&](int i) { run_case(c, copies[i % copies.size()].d, out, x, rows, launch); };
    for (int i = 0; i < 10; ++i) call(i);
    return deepinfer::bench::mean_call_us(iters, call);
}

std::vector<float> download(const float* p, int64_t n) {
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
}

// ---- routed experts ----

// expert_linear over kExperts experts of [n x k] FP4, top-kTopK routing of `tokens` tokens (slot (t, j) reads
// token row t when rows_per_input is kTopK, its own row when it is 1), as the MoE block's w1/w3 and w2 calls.
constexpr int kExperts = 256, kTopK = 6, kRoutings = 8;

void run_experts(const char* name, int64_t n, int64_t k, int rows_per_input, double bandwidth, int iters,
                 bool baseline) {
    const Case c{name, n, k, 2, 0, 0, 1};
    std::vector<Matrix> experts;
    std::vector<WeightDesc> table;
    for (int e = 0; e < kExperts; ++e) {
        experts.push_back(make_matrix(c, 1000 + 2 * static_cast<uint32_t>(e)));
        table.push_back(experts.back().d);
    }
    const int64_t expert_bytes = experts[0].bytes + experts[0].scale_bytes;
    WeightDesc* table_d = nullptr;
    CHECK(cudaMalloc(&table_d, table.size() * sizeof(WeightDesc)));
    CHECK(cudaMemcpy(table_d, table.data(), table.size() * sizeof(WeightDesc), cudaMemcpyHostToDevice));
    const bool fast = expert_linear_streams(table.data(), kExperts);

    const int64_t max_tokens = 128, max_rows = max_tokens * kTopK;
    float *x = nullptr, *out_new = nullptr, *out_old = nullptr;
    CHECK(cudaMalloc(&x, max_rows * k * 4));
    CHECK(cudaMalloc(&out_new, max_rows * n * 4));
    CHECK(cudaMalloc(&out_old, max_rows * n * 4));
    fill_device(x, max_rows * k * 4, 0, 11);
    int32_t* ids_d = nullptr;
    CHECK(cudaMalloc(&ids_d, kRoutings * max_rows * 4));

    std::mt19937 rng(5);
    for (int64_t tokens : {1, 8, 32, 128}) {
        // kRoutings routings of `tokens` tokens: kTopK distinct experts each, ascending, as moe_route leaves them.
        const int64_t rows = tokens * kTopK;
        std::vector<int32_t> ids, all(kExperts);
        double distinct = 0;
        for (int r = 0; r < kRoutings; ++r) {
            std::vector<bool> touched(kExperts);
            for (int64_t t = 0; t < tokens; ++t) {
                std::iota(all.begin(), all.end(), 0);
                std::shuffle(all.begin(), all.end(), rng);
                std::sort(all.begin(), all.begin() + kTopK);
                for (int j = 0; j < kTopK; ++j) ids.push_back(all[j]), touched[all[j]] = true;
            }
            distinct += static_cast<double>(std::count(touched.begin(), touched.end(), true)) / kRoutings;
        }
        CHECK(cudaMemcpy(ids_d, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        auto desc = [&](float* out, int r) {
            return ExpertLinearDesc{out, x, ids_d + r * rows, table_d, rows, n, k, kExperts, rows_per_input};
        };
        auto time_calls = [&](auto launch, float* out, int count) {
            for (int i = 0; i < kRoutings; ++i) launch(desc(out, i % kRoutings));
            return deepinfer::bench::mean_call_us(count, [&](int i) { launch(desc(out, i % kRoutings)); });
        };
        auto fp32_kernel = [&](const ExpertLinearDesc& d) { launch_expert_linear(d, table[0], fast, false, nullptr); };
        auto tc_kernel = [&](const ExpertLinearDesc& d) { launch_expert_linear(d, table[0], fast, true, nullptr); };
        auto old_kernel = [&](const ExpertLinearDesc& d) { baseline_experts::launch(d, table[0], nullptr); };
        const double fp32_us = time_calls(fp32_kernel, out_old, iters);
        const double tc_us = time_calls(tc_kernel, out_new, iters);
        auto gbs = [&](double us) { return distinct * static_cast<double>(expert_bytes) / us / 1e3; };
        char shape[32];
        std::snprintf(shape, sizeof shape, "[%lld x %lld]", static_cast<long long>(n), static_cast<long long>(k));
        std::printf("%-18s %-14s %4lld %5lld %6.1f %9.2f %7.0f %5.1f%% %9.2f %7.0f %5.1f%% %7.2fx", name, shape,
                    static_cast<long long>(tokens), static_cast<long long>(rows), distinct, fp32_us, gbs(fp32_us),
                    100.0 * gbs(fp32_us) / bandwidth, tc_us, gbs(tc_us), 100.0 * gbs(tc_us) / bandwidth,
                    fp32_us / tc_us);
        // The tensor-core kernel's output against the fp32 kernel's (bf16 activations: ~1e-3 expected).
        fp32_kernel(desc(out_old, 0));
        tc_kernel(desc(out_new, 0));
        {
            const std::vector<float> a = download(out_new, rows * n), b = download(out_old, rows * n);
            double diff = 0, ref = 0;
            for (int64_t i = 0; i < rows * n; ++i) {
                diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
                ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
                if (std::isnan(a[i]) != std::isnan(b[i])) diff = INFINITY;
            }
            std::printf(" %9.1e", ref > 0 ? diff / ref : diff);
        }
        if (baseline) std::printf(" %9.2f", time_calls(old_kernel, out_old, std::max(1, iters / 4)));
        std::printf("\n");
    }
    CHECK(cudaFree(ids_d));
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_new));
    CHECK(cudaFree(out_old));
    CHECK(cudaFree(table_d));
    for (Matrix& m : experts) {
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
    }
}

}  // namespace

int main(int argc, char** argv) {
    double bandwidth = 4259;
    int iters = 200;
    bool baseline = true, gemv = true, experts = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--bandwidth-gbs") && i + 1 < argc) bandwidth = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--no-baseline")) baseline = false;
        else if (!std::strcmp(argv[i], "--experts-only")) gemv = false;
        else if (!std::strcmp(argv[i], "--no-experts")) experts = false;
        else {
            std::fprintf(stderr,
                         "usage: gemv_bench [--bandwidth-gbs GBS] [--iters N] [--no-baseline] [--experts-only | "
                         "--no-experts]\n");
            return 2;
        }
    }
    // DeepSeek-V4-Flash decode products: routed experts (FP4), attention projections (FP8, 128x128 E8M0
    // blocks; one F32-scale variant), the grouped output projection, the head and the router gate (BF16).
    const std::vector<Case> cases = {
        {"expert w1/w3", 2048, 4096, 2, 0, 0, 1}, {"expert w2", 4096, 2048, 2, 0, 0, 1},
        {"wq_a", 1024, 4096, 1, 0, 0, 1},         {"wq_a f32 scales", 1024, 4096, 1, 0, 1, 1},
        {"wq_b", 32768, 1024, 1, 0, 0, 1},        {"wkv", 512, 4096, 1, 0, 0, 1},
        {"wo_b", 4096, 8192, 1, 0, 0, 1},         {"wo_a (8 groups)", 8192, 4096, 1, 0, 0, 8},
        {"head", 129280, 4096, 0, 1, 0, 1},       {"router gate", 256, 4096, 0, 1, 0, 1},
    };
    float *x = nullptr, *out_new = nullptr, *out_old = nullptr;
    const int64_t max_x = 32 * 8 * 4096, max_out = 32 * 129280;
    CHECK(cudaMalloc(&x, max_x * 4));
    CHECK(cudaMalloc(&out_new, max_out * 4));
    CHECK(cudaMalloc(&out_old, max_out * 4));
    fill_device(x, max_x * 4, 0, 7);

    auto new_kernel = [](float* o, int64_t ldc, const float* xx, int64_t lda, int rows, const WeightDesc& d,
                         int64_t row0, int64_t n) { launch_gemv(o, ldc, xx, lda, rows, d, row0, n, nullptr); };
    auto old_kernel = [](float* o, int64_t ldc, const float* xx, int64_t lda, int rows, const WeightDesc& d,
                         int64_t row0, int64_t n) { baseline::launch(o, ldc, xx, lda, rows, d, row0, n, nullptr); };

    if (gemv)
        std::printf("%-18s %-9s %-14s %4s %10s %8s %7s %10s %8s %9s\n", "shape", "dtype", "[n x k]", "rows",
                    "us/call", "GB/s", "% bw", "old us", "speedup", "rel diff");
    for (const Case& c : gemv ? cases : std::vector<Case>{}) {
        // Enough copies (>= 256 MB) that every launch reads its weights from HBM, not from the 50 MB L2.
        std::vector<Matrix> copies(1, make_matrix(c, 1));
        const int64_t bytes = copies[0].bytes + copies[0].scale_bytes;
        while (static_cast<int64_t>(copies.size()) * bytes < (int64_t{256} << 20) && copies.size() < 64)
            copies.push_back(make_matrix(c, 1 + 2 * static_cast<uint32_t>(copies.size())));
        char shape[32];
        std::snprintf(shape, sizeof shape, "[%lld x %lld]", static_cast<long long>(c.n), static_cast<long long>(c.k));
        for (int rows : {1, 8}) {
            const int64_t n_out = rows * c.n;
            if (!gemv_applies(rows, copies[0].d)) {
                std::printf("%-18s %-9s %-14s %4d   (the GEMV does not apply)\n", c.name, dtype_label(c), shape, rows);
                continue;
            }
            const double us = time_us(c, copies, out_new, x, rows, iters, new_kernel);
            const double gbs = static_cast<double>(bytes) / us / 1e3;
            std::printf("%-18s %-9s %-14s %4d %10.2f %8.0f %6.1f%%", c.name, dtype_label(c), shape, rows, us, gbs,
                        100.0 * gbs / bandwidth);
            if (baseline) {
                const double old_us = time_us(c, copies, out_old, x, rows, std::max(1, iters / 4), old_kernel);
                run_case(c, copies[0].d, out_new, x, rows, new_kernel);
                run_case(c, copies[0].d, out_old, x, rows, old_kernel);
                const std::vector<float> a = download(out_new, n_out), b = download(out_old, n_out);
                double diff = 0, ref = 0;
                for (int64_t i = 0; i < n_out; ++i) {
                    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
                    ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
                    if (std::isnan(a[i]) != std::isnan(b[i])) diff = INFINITY;
                }
                std::printf(" %10.2f %7.2fx %9.1e", old_us, old_us / us, ref > 0 ? diff / ref : diff);
            }
            std::printf("\n");
        }
        // The tensor-core GEMV at batched-decode row counts, the groups sharing a launch as in the backend.
        for (int rows : {8, 16, 32}) {
            if (!gemv_tc_applies(rows, copies[0].d)) continue;
            auto call = [&](int i) {
                const WeightDesc& d = copies[i % copies.size()].d;
                const int64_t r = c.n / c.groups;
                std::vector<GemvJob> jobs;
                for (int g = 0; g < c.groups; ++g)
                    jobs.push_back({out_new + g * r, c.n, x + g * c.k, c.groups * c.k, d, g * r, r});
                launch_gemv_tc_jobs(jobs.data(), static_cast<int>(jobs.size()), rows, nullptr);
            };
            for (int i = 0; i < 10; ++i) call(i);
            const double us = deepinfer::bench::mean_call_us(iters, call);
            const double gbs = static_cast<double>(bytes) / us / 1e3;
            std::printf("%-18s %-9s %-14s %4d %10.2f %8.0f %6.1f%%   (tensor-core GEMV)\n", c.name, dtype_label(c),
                        shape, rows, us, gbs, 100.0 * gbs / bandwidth);
        }
        for (Matrix& m : copies) {
            CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
            if (m.d.scale) CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
        }
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_new));
    CHECK(cudaFree(out_old));
    if (experts) {
        // The MoE block's calls: w1 and w3 (each token's row for its 6 slots), w2 (each slot its own row).
        std::printf("\n%-18s %-14s %4s %5s %6s %9s %7s %6s %9s %7s %6s %8s %9s%s\n", "routed experts (fp4)",
                    "[n x k]", "tok", "rows", "exp", "fp32 us", "GB/s", "% bw", "tc us", "GB/s", "% bw", "tc gain",
                    "tc diff", baseline ? "    old us" : "");
        run_experts("expert w1/w3 x256", 2048, 4096, kTopK, bandwidth, iters, baseline);
        run_experts("expert w2 x256", 4096, 2048, 1, bandwidth, iters, baseline);
    }
    return 0;
}
