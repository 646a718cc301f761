// Mixture-of-experts on the device: the routing (scores, hash or top-k selection, weights, slots in ascending
// expert order) and the routed experts' products for few rows, which read each row's expert id on the device.
// Nothing here waits for the host, so a decode step's MoE can run inside a CUDA graph.
//
// Routed products (expert_linear): block (tile, y) serves row y's expert when y is the first row routed to it
// (otherwise it exits at once), in passes of up to kPassRows of that expert's rows, so rows that share an expert
// share each weight read. The weight streams as in gemv.cu: the 8 lanes of a group read 128 contiguous bytes of a
// weight row per step and dequantize them in registers, a group owns 2 of the block's 64 output features, and
// each lane keeps the next steps' loads in flight while it computes. K is never split: a row's sum runs in one
// fixed order whatever the other rows are, so the op is batch invariant.
#include <algorithm>
#include <climits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

namespace {

using namespace chunks;

// ---- routing ----

constexpr int kRouteThreads = 256;
constexpr int64_t kRouteMaxExperts = 12 * 1024;  // the row's scores live in 48 KiB of shared memory

// The CPU's scores (backend/cpu/moe.cpp): torch's softplus (linear above 20), under a square root; the
// sigmoid; softmax is normalised over the row afterwards.
__device__ __forceinline__ float route_score(int scoring, float x) {
    if (scoring == 0) return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
    if (scoring == 2) return 1.0f / (1.0f + expf(-x));
    return x;
}

// (va, ia) ranks before (vb, ib): the larger value, ties to the lower expert id.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// One block per row of logits [rows, e].
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(int32_t* __restrict__ experts,
                                                                  float* __restrict__ weights,
                                                                  const float* __restrict__ logits, int64_t e,
                                                                  const MoeRouteDesc r) {
    extern __shared__ float s[];  // [e] the row's scores
    __shared__ int sel[kMoeRouteMaxK];
    __shared__ float part_v[kRouteThreads / 32], sel_w[kMoeRouteMaxK];
    __shared__ int part_i[kRouteThreads / 32];
    __shared__ float total;
    const int64_t row = blockIdx.x;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, K = r.k;
    const float* lg = logits + row * e;
    for (int64_t i = tid; i < e; i += kRouteThreads)
        s[i] = route_score(r.scoring, r.gate_temp == 1.0f ? lg[i] : lg[i] / r.gate_temp);
    __syncthreads();

    if (r.scoring == 1) {
        // Softmax: the maximum (exact in any order), the exponentials in parallel, their sum in expert order as
        // the CPU adds them.
        float mx = -INFINITY;
        for (int64_t i = tid; i < e; i += kRouteThreads) mx = fmaxf(mx, s[i]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) part_v[warp] = mx;
        __syncthreads();
        mx = part_v[0];
        for (int w = 1; w < kRouteThreads / 32; ++w) mx = fmaxf(mx, part_v[w]);
        for (int64_t i = tid; i < e; i += kRouteThreads) s[i] = expf(s[i] - mx);
        __syncthreads();
        if (tid == 0) {
            float sum = 0;
            for (int64_t i = 0; i < e; ++i) sum += s[i];
            total = sum;
        }
        __syncthreads();
        for (int64_t i = tid; i < e; i += kRouteThreads) s[i] /= total;
        __syncthreads();
    }

    if (r.tid2eid) {
        if (tid < K) {
            const int32_t token = r.tokens[row];
            const int32_t id = token >= 0 && token < r.vocab ? r.tid2eid[static_cast<int64_t>(token) * K + tid] : -1;
            sel[tid] = id >= 0 && id < e ? id : -1;
        }
    } else {
        // K rounds of a block-wide arg-max of score + bias over the experts not yet taken: the selection order of
        // the CPU's partial sort.
        for (int j = 0; j < K; ++j) {
            float bv = -INFINITY;
            int bi = INT_MAX;
            for (int64_t i = tid; i < e; i += kRouteThreads) {
                bool taken = false;
                for (int q = 0; q < j; ++q) taken |= sel[q] == i;
                const float v = s[i] + (r.bias ? r.bias[i] : 0.0f);
                if (!taken && ranks_before(v, static_cast<int>(i), bv, bi)) bv = v, bi = static_cast<int>(i);
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
            }
            if (lane == 0) part_v[warp] = bv, part_i[warp] = bi;
            __syncthreads();
            if (tid == 0) {
                for (int w = 1; w < kRouteThreads / 32; ++w)
                    if (ranks_before(part_v[w], part_i[w], bv, bi)) bv = part_v[w], bi = part_i[w];
                sel[j] = bi == INT_MAX ? -1 : bi;  // no candidate ranks (NaN scores)
            }
            __syncthreads();
        }
    }
    __syncthreads();

    if (tid == 0) {
        int32_t* out_e = experts + row * K;
        float* out_w = weights + row * K;
        bool ok = true;
        for (int k = 0; k < K; ++k) ok &= sel[k] >= 0;
        if (!ok) {  // a token outside tid2eid, an id outside [0, e), or NaN scores
            for (int k = 0; k < K; ++k) out_e[k] = -1, out_w[k] = __int_as_float(0x7fc00000);
            return;
        }
        // Weights from the sum in selection order, then the slots sorted by expert id (stable insertion sort).
        float sum = 0;
        for (int k = 0; k < K; ++k) sum += s[sel[k]];
        for (int k = 0; k < K; ++k) sel_w[k] = s[sel[k]] / (sum + 1e-20f) * r.routed_scaling;
        for (int k = 1; k < K; ++k) {
            const int id = sel[k];
            const float w = sel_w[k];
            int q = k;
            for (; q > 0 && sel[q - 1] > id; --q) sel[q] = sel[q - 1], sel_w[q] = sel_w[q - 1];
            sel[q] = id, sel_w[q] = w;
        }
        for (int k = 0; k < K; ++k) out_e[k] = sel[k], out_w[k] = sel_w[k];
    }
}

// ---- routed expert products ----

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
                            const float sc = K == kFP8 && w.scale_f32 ? __uint_as_float(sb) : e8m0_to_f32(static_cast<uint8_t>(sb));
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

// Any layout: one thread per output element, element-wise decode.
__global__ void expert_linear_plain_kernel(const ExpertLinearDesc d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.rows * d.n) return;
    const int64_t r = i / d.n, n = i % d.n;
    const int e = d.expert_of_row[r];
    if (e < 0 || e >= d.num_experts) {
        d.out[i] = __int_as_float(0x7fc00000);
        return;
    }
    const WeightDesc w = d.table[e];
    const float* xr = d.x + (r / d.rows_per_input) * d.k;
    float acc = 0;
    for (int64_t k = 0; k < d.k; ++k) acc = fmaf(xr[k], weight_at(w, n, k), acc);
    d.out[i] = acc;
}

}  // namespace

void launch_moe_route(int32_t* experts, float* weights, const float* logits, int64_t rows, int64_t e,
                      const MoeRouteDesc& r, cudaStream_t stream) {
    if (rows == 0) return;
    DI_ICHECK(e > 0 && e <= kRouteMaxExperts && r.k > 0 && r.k <= kMoeRouteMaxK && r.k <= e, "moe_route: ", e,
              " experts, k ", r.k);
    moe_route_kernel<<<static_cast<unsigned>(rows), kRouteThreads, static_cast<size_t>(e) * 4, stream>>>(
        experts, weights, logits, e, r);
    DI_CUDA_LAUNCH_CHECK();
}

bool expert_linear_streams(const WeightDesc* table, int64_t num_experts) {
    if (num_experts == 0) return false;
    const WeightDesc& f = table[0];
    const int kind = kind_of(f), e = elems_of(kind);
    for (int64_t i = 0; i < num_experts; ++i) {
        const WeightDesc& w = table[i];
        if (kind_of(w) != kind || w.rows != f.rows || w.cols != f.cols || w.block_cols != f.block_cols) return false;
        // Whole 16-byte chunks per row, each inside one scale block, a power-of-two number of them per block.
        if (w.cols % e != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
        if (w.format != 0) {
            const int cpb = w.block_cols / e;
            if (w.block_cols % e != 0 || (cpb & (cpb - 1)) != 0) return false;
        }
    }
    return true;
}

void launch_expert_linear(const ExpertLinearDesc& d, const WeightDesc& first, bool fast, cudaStream_t stream) {
    if (d.rows * d.n == 0) return;
    if (!fast) {
        expert_linear_plain_kernel<<<static_cast<unsigned>((d.rows * d.n + 255) / 256), 256, 0, stream>>>(d);
        DI_CUDA_LAUNCH_CHECK();
        return;
    }
    const int kind = kind_of(first), e = elems_of(kind);
    DI_ICHECK(d.rows / d.rows_per_input * d.k < INT_MAX, "expert_linear: ", d.rows / d.rows_per_input, " x ", d.k,
              " inputs");
    StreamParams p{d, 0, reinterpret_cast<uintptr_t>(d.x) % 16 == 0 ? 1 : 0};
    if (first.format != 0) p.scale_shift = __builtin_ctz(static_cast<unsigned>(first.block_cols / e));
    const dim3 grid(static_cast<unsigned>((d.n + kTile - 1) / kTile),
                    static_cast<unsigned>(std::min<int64_t>(d.rows, 65535)));
    switch (kind) {
        case kF32: expert_linear_kernel<kF32><<<grid, kThreads, 0, stream>>>(p); break;
        case kBF16: expert_linear_kernel<kBF16><<<grid, kThreads, 0, stream>>>(p); break;
        case kF16: expert_linear_kernel<kF16><<<grid, kThreads, 0, stream>>>(p); break;
        case kFP8: expert_linear_kernel<kFP8><<<grid, kThreads, 0, stream>>>(p); break;
        default: expert_linear_kernel<kFP4><<<grid, kThreads, 0, stream>>>(p); break;
    }
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
