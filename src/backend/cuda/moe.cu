// Mixture-of-experts on the device: the routing (scores, hash or top-k selection, weights, slots in ascending
// expert order) and the routed experts' products (expert_linear), which read each row's expert id on the device,
// group the rows by expert on the device when many rows share experts, and stream each touched expert's weights
// (see "routed expert products" below), on fp32 FMAs or on the tensor cores. Nothing here waits for the host, so a
// decode step's MoE can run inside a CUDA graph.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/block_scan.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
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
    pdl_prologue();  // see pdl.cuh
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
//
// Work items: up to P rows routed to one expert. With P = 1 an item is a row of expert_of_row; with P > 1
// moe_group_kernel first sorts the rows by expert into a permutation and a list of items. Block (tile, item)
// multiplies the item's rows by its expert's weight rows n0 .. n0 + tile, so a weight tile is read once for all
// of the item's rows, and the items of one expert (adjacent in the grid) share it through L2.
//
// Inside a block, K is split into slices of 32 16-byte chunks of weights: lane l of a warp owns chunk 32 s + l
// of slice s, so a warp's load reads 512 contiguous bytes of a weight row. The 8 warps are slice_warps (along K)
// x feature_warps (along the tile); past 8 slices a warp takes several. A warp serves kNF features per round
// and issues the next round's loads (kNF 16-byte loads per lane) before it computes the current one. The item's
// activation rows are staged in shared memory (swizzled, conflict-free), each float4 read feeding kNF features.
//
// Reduction order of an output, fixed by K and the weight kind alone (so the op is batch invariant): within a
// chunk in element order, times the chunk's scale; over the 32 lanes of a slice by a fixed shuffle tree; over
// the slices in slice order. Neither the item's other rows, nor P, nor the tile width change it. The products
// and sums outside the explicit fmaf chains use __fmul_rn / __fadd_rn, which the compiler never contracts into
// an FMA, so the instantiations for 1..4 rows per item round alike.

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kNF = 4;                 // features per warp and round
constexpr int kMaxGroupRows = 4;       // P: rows per work item
constexpr int64_t kOneRowItems = 64;   // up to this many rows, each row is an item (no grouping launch)
constexpr int kMaxTile = 128;          // output features per block, at most
constexpr int kXBytes = 96 * 1024;     // staged activations per block: two blocks per SM
constexpr int kRedBytes = 16 * 1024;   // slice partial sums per block
constexpr int kGroupThreads = 1024;
constexpr int kGroupMaxBuckets = 2048;  // experts + 1 (bad ids): moe_group_kernel's 4 int arrays within 48 KiB

struct ExpertParams {
    ExpertLinearDesc d;
    const int32_t* perm;        // [rows] I32 row ids grouped by expert (P > 1), else null
    const int4* items;          // [work] {first perm index, rows, expert or -1 (bad ids), 0} (P > 1), else null
    const int32_t* item_count;  // [1] I32 items in `items` (P > 1), else null
    int64_t work;               // grid rows to walk: d.rows (P = 1) or the bound on items
    int chunks;                 // 16-byte chunks per weight row
    int slices;                 // ceil(chunks / 32)
    int slice_warps;            // min(slices, kWarps): warp w takes slices w % slice_warps + j * slice_warps
    int feature_warps;          // kWarps / slice_warps: warp w serves the features of group w / slice_warps
    int tile;                   // output features per block, a multiple of feature_warps * kNF
    int x_stride4;              // float4s per staged activation row: k / 4 rounded up to 8 (see swizzle())
    int scale_shift;            // FP8/FP4: log2(16-byte chunks per scale block along K)
    int x_vec4;                 // x is 16-byte aligned: float4 loads
};

// Staged activation float4 q lives at swizzle(q). A quarter warp reads float4 j of 8 consecutive chunks, which
// lie 1..8 float4s apart; the XOR (inside each aligned group of 8 float4s) spreads them over distinct banks.
__device__ __forceinline__ int swizzle(int q) { return q ^ ((q >> 3) & 7); }

// Sums v[i][t] over the warp's 32 lanes for each of the kNF features i: two halving steps (lane bit 4, then 3)
// leave each lane one feature's partial sum, (lane >> 3), then a butterfly over lane bits 2..0 completes it.
// Each sum is one fixed tree over the lanes; every lane of a group of 8 ends with the same value in v[0][t].
template <int NR>
__device__ __forceinline__ void lane_reduce(float (&v)[kNF][NR], int lane) {
    static_assert(kNF == 4, "two halving steps");
#pragma unroll
    for (int step = 0; step < 2; ++step) {
        const int m = 16 >> step, half = kNF >> (step + 1);
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
#pragma unroll
            for (int t = 0; t < NR; ++t) {
                // The lower lane keeps features [0, half), the upper [half, 2 half); each sends the other half.
                const float send = upper ? v[i][t] : v[i + half][t];
                const float keep = upper ? v[i + half][t] : v[i][t];
                v[i][t] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, m));
            }
        }
    }
#pragma unroll
    for (int m = 4; m >= 1; m >>= 1) {
#pragma unroll
        for (int t = 0; t < NR; ++t) v[0][t] = __fadd_rn(v[0][t], __shfl_xor_sync(0xffffffffu, v[0][t], m));
    }
}

// One work item of NR rows (rows[0 .. NR), expert e) times weight rows n0 .. n0 + tile.
template <int K, int NR>
__device__ __forceinline__ void expert_item(const ExpertParams& p, int e, const int64_t* rows, int64_t n0,
                                            float4* xs, float* red) {
    constexpr int E = kElems<K>, G = kGran<K>, Q = E / 4;  // Q: float4s of activations per chunk
    constexpr bool kScaled = K == kFP8 || K == kFP4;
    const ExpertLinearDesc& d = p.d;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int SW = p.slice_warps, FW = p.feature_warps, TN = p.tile, C = p.chunks;
    const int sw = warp % SW, fw = warp / SW;  // warps with fw >= FW (when slices is 3, 5, 6 or 7) only stage
    const int my_slices = fw < FW ? (p.slices - sw + SW - 1) / SW : 0;
    const int rounds = my_slices > 0 ? TN / (FW * kNF) : 0;  // staging-only warps load nothing
    const int steps = rounds * my_slices;                    // (round, slice) pairs, slices fastest
    const WeightDesc w = d.table[e];
    const uint4* wdata = reinterpret_cast<const uint4*>(w.data);

    struct Step {
        uint4 v[kNF];       // the lane's chunk of each feature
        uint32_t s[kNF];    // its raw scale bits
    };
    // Step (round q, slice j of the warp's): features n0 + (q * FW + fw) * kNF + i, chunk 32 (sw + j SW) + lane.
    // Past the last round, nothing. The steps are walked with counters (next_step), not divided out of a step
    // index, and a step's rows are one base address plus multiples of the row stride (ncu, one token: the division
    // and the per-feature address arithmetic were ~130 of a step's ~750 instructions).
    auto load = [&](Step& b, int q, int j) {
        const bool live = q < rounds;
        const int c = (sw + j * SW) * 32 + lane;
        const int64_t nb = n0 + static_cast<int64_t>(q * FW + fw) * kNF;
        const uint4* wp = wdata + nb * C + c;
#pragma unroll
        for (int i = 0; i < kNF; ++i) {
            const bool ok = live && nb + i < d.n && c < C;
            b.v[i] = ok ? __ldg(wp + i * C) : make_uint4(0, 0, 0, 0);
            b.s[i] = 0;
            if constexpr (kScaled) {
                if (ok) {
                    const int64_t srow = K == kFP8 ? static_cast<int>(nb + i) / w.block_rows : nb + i;
                    const int64_t si = srow * w.scale_cols + (c >> p.scale_shift);
                    b.s[i] = K == kFP8 && w.scale_f32 ? __ldg(reinterpret_cast<const uint32_t*>(w.scale) + si)
                                                      : __ldg(w.scale + si);
                }
            }
        }
    };
    const auto next_step = [&](int& q, int& j) {
        if (++j == my_slices) j = 0, ++q;
    };

    Step cur;
    int lq = 0, lj = 0;  // the step whose loads are issued next
    load(cur, lq, lj);   // in flight while the activations are staged
    next_step(lq, lj);
    const int k4 = static_cast<int>(d.k / 4);
#pragma unroll
    for (int t = 0; t < NR; ++t) {
        const float* src = d.x + rows[t] / d.rows_per_input * d.k;
        float4* dst = xs + t * p.x_stride4;
#pragma unroll 4
        for (int q = threadIdx.x; q < k4; q += kThreads)
            dst[swizzle(q)] = p.x_vec4 ? __ldg(reinterpret_cast<const float4*>(src) + q)
                                       : make_float4(src[4 * q], src[4 * q + 1], src[4 * q + 2], src[4 * q + 3]);
    }
    __syncthreads();

    for (int st = 0, q = 0, j = 0; st < steps; ++st, next_step(q, j)) {
        Step nxt;
        load(nxt, lq, lj);
        next_step(lq, lj);
        const int s = sw + j * SW;
        const int c = s * 32 + lane;
        float v[kNF][NR] = {};  // the chunk's sums per feature and row
        if (c < C) {
            // The chunk's float4s c * Q .. c * Q + Q - 1 share one swizzle key (Q divides 8).
            const int i0 = c * Q, key = (i0 >> 3) & 7;
#pragma unroll
            for (int g = 0; g < E / G; ++g) {
                float4 xv[NR][G / 4];
#pragma unroll
                for (int t = 0; t < NR; ++t) {
#pragma unroll
                    for (int h = 0; h < G / 4; ++h) xv[t][h] = xs[t * p.x_stride4 + ((i0 + g * (G / 4) + h) ^ key)];
                }
#pragma unroll
                for (int i = 0; i < kNF; ++i) {
                    float wf[G];
                    decode<K>(cur.v[i], g, wf);
#pragma unroll
                    for (int t = 0; t < NR; ++t) {
#pragma unroll
                        for (int h = 0; h < G / 4; ++h) {
                            float& a = v[i][t];
                            a = fmaf(wf[4 * h], xv[t][h].x, a);
                            a = fmaf(wf[4 * h + 1], xv[t][h].y, a);
                            a = fmaf(wf[4 * h + 2], xv[t][h].z, a);
                            a = fmaf(wf[4 * h + 3], xv[t][h].w, a);
                        }
                    }
                }
            }
            if constexpr (kScaled) {
#pragma unroll
                for (int i = 0; i < kNF; ++i) {
                    const uint32_t sb = cur.s[i];
                    const float sc =
                        K == kFP8 && w.scale_f32 ? __uint_as_float(sb) : e8m0_to_f32(static_cast<uint8_t>(sb));
#pragma unroll
                    for (int t = 0; t < NR; ++t) v[i][t] = __fmul_rn(v[i][t], sc);
                }
            }
        }
        lane_reduce<NR>(v, lane);
        if ((lane & 7) == 0) {
            const int f = (q * FW + fw) * kNF + (lane >> 3);
#pragma unroll
            for (int t = 0; t < NR; ++t) red[(s * TN + f) * NR + t] = v[0][t];
        }
        cur = nxt;
    }
    __syncthreads();

    // The slices' sums in slice order, each output written once.
    const float post = K == kFP4 ? 64.0f : 1.0f;  // undo the FP4 decode's 2^-6
#pragma unroll
    for (int t = 0; t < NR; ++t) {
        for (int f = threadIdx.x; f < TN && n0 + f < d.n; f += kThreads) {
            float a = red[f * NR + t];
            for (int s = 1; s < p.slices; ++s) a = __fadd_rn(a, red[(s * TN + f) * NR + t]);
            d.out[rows[t] * d.n + n0 + f] = __fmul_rn(a, post);
        }
    }
    __syncthreads();  // xs and red are rewritten by the block's next item
}

// Grid (tiles, min(work, 65535)); block (x, y) serves tile x of items y, y + gridDim.y, ... One-row items need
// fewer registers (no grouped rows to hold): three blocks per SM then, two otherwise.
template <int K, int P>
__global__ void __launch_bounds__(kThreads, P == 1 ? 3 : 2) expert_linear_kernel(const ExpertParams p) {
    pdl_prologue();  // see pdl.cuh
    extern __shared__ float4 smem[];
    float4* xs = smem;                                              // [P, x_stride4] f32, swizzled rows
    float* red = reinterpret_cast<float*>(smem + P * p.x_stride4);  // [slices, tile, rows] f32
    const ExpertLinearDesc& d = p.d;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * p.tile;
    for (int64_t y = blockIdx.y; y < p.work; y += gridDim.y) {
        int e = 0, nr = 1;
        int64_t rows[P];
        if constexpr (P == 1) {
            e = d.expert_of_row[y];
            rows[0] = y;
        } else {
            if (y >= *p.item_count) break;  // the same for the whole block
            const int4 it = p.items[y];
            nr = it.y;
            e = it.z;
#pragma unroll
            for (int t = 0; t < P; ++t) rows[t] = t < nr ? p.perm[it.x + t] : 0;
        }
        if (e < 0 || e >= d.num_experts) {  // a bad id: NaN rows
#pragma unroll
            for (int t = 0; t < P; ++t) {
                if (t >= nr) break;
                for (int f = threadIdx.x; f < p.tile && n0 + f < d.n; f += kThreads)
                    d.out[rows[t] * d.n + n0 + f] = __int_as_float(0x7fc00000);
            }
            continue;
        }
        switch (nr) {
            case 1: expert_item<K, 1>(p, e, rows, n0, xs, red); break;
            case 2: if constexpr (P >= 2) expert_item<K, 2>(p, e, rows, n0, xs, red); break;
            case 3: if constexpr (P >= 3) expert_item<K, 3>(p, e, rows, n0, xs, red); break;
            default: if constexpr (P >= 4) expert_item<K, 4>(p, e, rows, n0, xs, red); break;
        }
    }
}

// One block: a counting sort of the rows by expert (bucket num_experts: bad ids) into perm [rows], then each
// bucket's items of up to P rows into items, and their number into *count. Rows within a bucket come in the
// order of the atomics, which does not matter: a row's result does not depend on the rows it shares an item with.
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(int32_t* count, int32_t* perm, int4* items,
                                                                  const int32_t* ids, int64_t rows, int num_experts,
                                                                  int P) {
    extern __shared__ int sh[];  // [4, B]: rows per bucket, first row, first item, rows placed
    const int B = num_experts + 1;
    int *cnt = sh, *row0 = sh + B, *item0 = sh + 2 * B, *placed = sh + 3 * B;
    for (int b = threadIdx.x; b < B; b += kGroupThreads) cnt[b] = 0, placed[b] = 0;
    __syncthreads();
    auto bucket = [&](int32_t id) { return id >= 0 && id < num_experts ? id : num_experts; };
    for (int64_t r = threadIdx.x; r < rows; r += kGroupThreads) atomicAdd(&cnt[bucket(ids[r])], 1);
    __syncthreads();
    // Each thread scans a run of consecutive buckets; the block scan orders the runs.
    const int per = (B + kGroupThreads - 1) / kGroupThreads;
    const int lo = min(B, static_cast<int>(threadIdx.x) * per), hi = min(B, lo + per);
    int2 at = make_int2(0, 0);  // (rows, items) before this thread's run
    for (int b = lo; b < hi; ++b) at.x += cnt[b], at.y += (cnt[b] + P - 1) / P;
    const int2 total = block_exclusive_scan<kGroupThreads>(at);
    for (int b = lo; b < hi; ++b) {
        row0[b] = at.x, item0[b] = at.y;
        at.x += cnt[b], at.y += (cnt[b] + P - 1) / P;
    }
    __syncthreads();
    for (int64_t r = threadIdx.x; r < rows; r += kGroupThreads) {
        const int b = bucket(ids[r]);
        perm[row0[b] + atomicAdd(&placed[b], 1)] = static_cast<int32_t>(r);
    }
    for (int b = threadIdx.x; b < B; b += kGroupThreads)
        for (int j = 0; j * P < cnt[b]; ++j)
            items[item0[b] + j] = make_int4(row0[b] + j * P, min(P, cnt[b] - j * P), b < num_experts ? b : -1, 0);
    if (threadIdx.x == 0) *count = total.y;
}

// Any layout: one thread per output element, element-wise decode.
__global__ void expert_linear_plain_kernel(const ExpertLinearDesc d) {
    pdl_prologue();  // see pdl.cuh
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

// ---- routed expert products on the tensor cores ----
//
// The same work items as above (single rows, or up to kTcRows = 16 rows of one expert from moe_group_kernel) and
// grid: block (tile, item) multiplies the item's rows by weight rows n0 .. n0 + tile with mma.sync m16n8k16, as
// gemv_tc.cu does: A = the item's activation rows (zero past them), B = W^T, the k positions of each MMA step
// fed by the lanes' 16-byte weight chunks; weights dequantized to bf16 in registers (FP4 x E8M0 exactly and without
// conversion instructions: fp4_word_to_bf16), activations rounded to bf16 once as they are staged. An item's weight
// tile is read once for all its rows, and each MMA serves 16 rows.
//
// Block: 8 warps, 2 along features x 4 along K. The tile is walked in sub-tiles of kTcSub = 32 features: warp
// (wf, wk) takes features wf * 16 .. wf * 16 + 15 of each (two n8 groups sharing every A fragment) and the k blocks
// (4 chunks: k positions 4E) wk, wk + 4, ...; each lane loads one chunk per group and k block, kTcDepth (FP4:
// kTcFp4Depth) k blocks ahead across sub-tiles, the first ones while the item's rows are staged. A sub-tile's four K-quarter sums meet
// in shared memory (double buffered: one barrier per sub-tile).
//
// Reduction order of an output, fixed by K and the weight kind alone: the chain of MMA steps over the k blocks of
// each quarter in k order (inside a step the tensor core's sum, which reads only that output's row of A and
// column of B), then the quarters in order 0..3. Neither the item's other rows, nor their number, nor the tile
// change it: the op is batch invariant, and its one-row and grouped launches agree bitwise.
//
// Staged activations, per row: k block kb holds E/2 pieces of 8 bf16; piece kb * E/2 + q * 4 + c is what lane c
// reads for the q-th pair of MMA steps of its chunk: the chunk's activations 8q .. 8q + 7, in the order the decode
// yields the weights (FP4: 0, 4, 1, 5, 2, 6, 3, 7; other kinds 0..7). F32 weights (4 a chunk: one step) stage in k
// order and read 8 bytes a step. The row stride is 64 bytes past a multiple of 128, so that the 8 lanes of a
// quarter warp (rows g, g + 1; chunks 0..3) read 128 distinct bytes.

constexpr int kTcKWarps = 4, kTcFeatureWarps = 2, kTcGroups = 2;
constexpr int kTcSub = kTcFeatureWarps * kTcGroups * 8;  // features per sub-tile
constexpr int kTcRows = 16;                               // rows per item at most (the MMA's M)
constexpr int kTcMaxTile = 256;                           // features per block, at most
// k blocks of weight loads in flight per warp (a k block: 1 KB a warp). FP4 experts, the model's, keep 4: H200,
// V4-Flash decode batch 32 10.83 -> 10.49 ms a step, the op 5-7% faster from 8 to 128 tokens; 6 spills and
// was slower. Other kinds keep 2 (not measured at 4).
constexpr int kTcDepth = 2, kTcFp4Depth = 4;
constexpr int kTcRedStride = 40;  // floats per row of quarter sums: a half warp's float2 stores hit distinct banks
constexpr int kTcRedBytes = 2 * kTcKWarps * kTcRows * kTcRedStride * 4;  // [2][quarter][row][stride] f32
constexpr int kTcHeadBytes = kTcRedBytes + kTcRows * 8;                   // then the item's row ids [16] I64
constexpr int kTcXBytes = 66 * 1024;      // staged rows of a grouped launch: 16 x 2048 or 8 x 4096 (2 blocks/SM)
constexpr int kTcMaxXBytes = 100 * 1024;  // one staged row at most (one-row items)

struct ExpertTcParams {
    ExpertLinearDesc d;
    const int32_t* perm;        // [rows] I32 row ids grouped by expert (P > 1), else null
    const int4* items;          // [work] {first perm index, rows, expert or -1, 0} (P > 1), else null
    const int32_t* item_count;  // [1] I32 (P > 1), else null
    int64_t work;               // grid rows to walk: d.rows (P = 1) or the bound on items
    int chunks;                 // 16-byte chunks per weight row
    int kblocks;                // k blocks (4 chunks) per weight row, the last one possibly partial
    int kw_steps;               // ceil(kblocks / 4): the steps of each K warp per sub-tile (idle past kblocks)
    int subtiles;               // sub-tiles per block tile
    int x_stride;               // bf16 per staged row
    int scale_shift;            // FP8/FP4: log2(16-byte chunks per scale block along K)
    int x_vec4;                 // x is 16-byte aligned: float4 loads
};

// Rows rows[0 .. nr) of x as bf16 in the staged layout, zero past k (a partial last k block).
template <int K>
__device__ __forceinline__ void tc_stage(const ExpertTcParams& p, const int64_t* rows, int nr, uint16_t* xs) {
    constexpr int E = kElems<K>, KB = 4 * E;
    const ExpertLinearDesc& d = p.d;
    const int groups = p.kblocks * (KB / 8);  // groups of 8 activations per row
#pragma unroll 2
    for (int i = threadIdx.x; i < nr * groups; i += kThreads) {
        const int t = i / groups, gi = i - t * groups;
        const int64_t k0 = int64_t{gi} * 8;
        const float* src = d.x + rows[t] / d.rows_per_input * d.k + k0;
        float f[8];
        if (p.x_vec4 && k0 + 8 <= d.k) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(src)), b = __ldg(reinterpret_cast<const float4*>(src) + 1);
            f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) f[j] = k0 + j < d.k ? src[j] : 0.0f;
        }
        int at = gi;  // piece index
        if constexpr (E >= 16) {
            const int kb = gi / (E / 2), r = gi - kb * (E / 2);
            at = kb * (E / 2) + (r % (E / 8)) * 4 + r / (E / 8);
        }
        const uint4 v = K == kFP4 ? make_uint4(pack_bf16(f[0], f[4]), pack_bf16(f[1], f[5]), pack_bf16(f[2], f[6]),
                                               pack_bf16(f[3], f[7]))
                                  : make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]),
                                               pack_bf16(f[6], f[7]));
        *reinterpret_cast<uint4*>(xs + t * p.x_stride + at * 8) = v;
    }
}

struct TcStep {
    uint4 v[kTcGroups];      // the lane's chunk of each group's feature
    uint32_t s[kTcGroups];   // its raw scale bits (neutral where nothing was loaded)
};

// The MMA steps of one k block: A fragments of rows g and g + 8 (zero where the item has no such row) from the
// staged rows, B from the lane's chunks, into acc[group].
template <int K>
struct TcBlock {
    const uint16_t* xg;   // staged row g
    const uint16_t* xg8;  // staged row g + 8
    bool row_g, row_g8;
    int scale_f32;        // FP8: scales are F32

    __device__ __forceinline__ uint4 piece(const uint16_t* row, bool live, int at) const {
        return live ? *reinterpret_cast<const uint4*>(row + at * 8) : make_uint4(0, 0, 0, 0);
    }

    template <bool kSlow>
    __device__ __forceinline__ void fp4(const TcStep& w, int kb, int c, float (&acc)[kTcGroups][4]) const {
        Fp4Scale sc[kTcGroups];
#pragma unroll
        for (int f = 0; f < kTcGroups; ++f) sc[f] = fp4_scale<kSlow>(w.s[f]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int at = kb * 16 + q * 4 + c;
            const uint4 a = piece(xg, row_g, at), a8 = piece(xg8, row_g8, at);
#pragma unroll
            for (int f = 0; f < kTcGroups; ++f) {
                const uint32_t word = q == 0 ? w.v[f].x : q == 1 ? w.v[f].y : q == 2 ? w.v[f].z : w.v[f].w;
                uint32_t b[4];
                fp4_word_to_bf16<kSlow>(word, sc[f], b);
                mma_bf16(acc[f], a.x, a8.x, a.y, a8.y, b[0], b[1]);
                mma_bf16(acc[f], a.z, a8.z, a.w, a8.w, b[2], b[3]);
            }
        }
    }

    __device__ __forceinline__ void operator()(const TcStep& w, int kb, int c, float (&acc)[kTcGroups][4]) const {
        constexpr int E = kElems<K>;
        if constexpr (K == kFP4) {
            // Scales whose bf16 constants are not normal take the slower decode, the whole warp together.
            bool slow = false;
#pragma unroll
            for (int f = 0; f < kTcGroups; ++f) slow |= !fp4_fast_scale(w.s[f]);
            if (__any_sync(0xffffffffu, slow)) fp4<true>(w, kb, c, acc);
            else fp4<false>(w, kb, c, acc);
        } else {
            uint32_t o[kTcGroups][E / 2];
#pragma unroll
            for (int f = 0; f < kTcGroups; ++f) {
                const float s = K != kFP8 ? 1.0f : scale_f32 ? __uint_as_float(w.s[f])
                                                             : e8m0_to_f32(static_cast<uint8_t>(w.s[f]));
                chunk_to_bf16<K>(w.v[f], s, o[f]);
            }
            if constexpr (E == 4) {
                const int at = kb * 16 + c * 4;
                const uint2 a = row_g ? *reinterpret_cast<const uint2*>(xg + at) : make_uint2(0, 0);
                const uint2 a8 = row_g8 ? *reinterpret_cast<const uint2*>(xg8 + at) : make_uint2(0, 0);
#pragma unroll
                for (int f = 0; f < kTcGroups; ++f) mma_bf16(acc[f], a.x, a8.x, a.y, a8.y, o[f][0], o[f][1]);
            } else {
#pragma unroll
                for (int q = 0; q < E / 8; ++q) {
                    const int at = kb * (E / 2) + q * 4 + c;
                    const uint4 a = piece(xg, row_g, at), a8 = piece(xg8, row_g8, at);
#pragma unroll
                    for (int f = 0; f < kTcGroups; ++f) {
                        mma_bf16(acc[f], a.x, a8.x, a.y, a8.y, o[f][4 * q], o[f][4 * q + 1]);
                        mma_bf16(acc[f], a.z, a8.z, a.w, a8.w, o[f][4 * q + 2], o[f][4 * q + 3]);
                    }
                }
            }
        }
    }
};

// One work item: rows[0 .. nr) (nr <= kTcRows) of expert e times weight rows n0 .. n0 + subtiles * kTcSub, with
// DEPTH k blocks of weight loads in flight per warp.
template <int K, int DEPTH>
__device__ __forceinline__ void tc_item(const ExpertTcParams& p, int e, int nr, const int64_t* rows, int64_t n0,
                                        uint16_t* xs, float* red) {
    constexpr bool kScaled = K == kFP8 || K == kFP4;
    const ExpertLinearDesc& d = p.d;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c = lane % 4, wf = warp % kTcFeatureWarps, wk = warp / kTcFeatureWarps;
    const int kw = p.kw_steps;
    const int subtiles = static_cast<int>(min(static_cast<int64_t>(p.subtiles), (d.n - n0 + kTcSub - 1) / kTcSub));
    const WeightDesc w = d.table[e];
    const uint4* wdata = reinterpret_cast<const uint4*>(w.data);
    // Neutral scale bits where nothing is loaded (keeps FP4 on its fast decode).
    const uint32_t neutral = K == kFP8 && w.scale_f32 ? 0x3f800000u : 127u;

    int ls = 0, li = 0;  // sub-tile and step of the next load
    auto load_next = [&](TcStep& b) {
        const int kb = wk + kTcKWarps * li, chunk = kb * 4 + c;
#pragma unroll
        for (int f = 0; f < kTcGroups; ++f) {
            const int64_t n = n0 + ls * kTcSub + wf * 16 + f * 8 + g;
            const bool ok = ls < subtiles && kb < p.kblocks && chunk < p.chunks && n < d.n;
            b.v[f] = ok ? __ldg(wdata + n * p.chunks + chunk) : make_uint4(0, 0, 0, 0);
            b.s[f] = neutral;
            if constexpr (kScaled) {
                if (ok) {
                    const int64_t srow = K == kFP8 ? n / w.block_rows : n;
                    const int64_t si = srow * w.scale_cols + (chunk >> p.scale_shift);
                    b.s[f] = K == kFP8 && w.scale_f32 ? __ldg(reinterpret_cast<const uint32_t*>(w.scale) + si)
                                                      : __ldg(w.scale + si);
                }
            }
        }
        if (++li == kw) li = 0, ++ls;
    };

    TcStep ring[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) load_next(ring[j]);  // in flight while the rows are staged
    tc_stage<K>(p, rows, nr, xs);
    __syncthreads();

    const TcBlock<K> mma_block{xs + g * p.x_stride, xs + (g + 8) * p.x_stride, g < nr, g + 8 < nr, w.scale_f32};
    float acc[kTcGroups][4] = {};
    int cs = 0, ci = 0;  // sub-tile and step being computed
    int buf = 0;         // red buffer of the current sub-tile
    const int steps = subtiles * kw;
    for (int st0 = 0; st0 < steps; st0 += DEPTH) {
#pragma unroll
        for (int j = 0; j < DEPTH; ++j) {
            if (st0 + j >= steps) break;  // the same for the whole block
            const TcStep cur = ring[j];
            load_next(ring[j]);
            const int kb = wk + kTcKWarps * ci;
            if (kb < p.kblocks) mma_block(cur, kb, c, acc);  // the same for the whole warp
            if (ci == kw - 1) {
                // The sub-tile's quarter sums: acc[f][0..1] row g, features wf * 16 + f * 8 + 2c (+1); [2..3] row
                // g + 8. Summed in quarter order, each output written once.
                float* r = red + buf * (kTcKWarps * kTcRows * kTcRedStride);
#pragma unroll
                for (int f = 0; f < kTcGroups; ++f) {
                    const int col = wf * 16 + f * 8 + 2 * c;
                    *reinterpret_cast<float2*>(r + (wk * kTcRows + g) * kTcRedStride + col) =
                        make_float2(acc[f][0], acc[f][1]);
                    *reinterpret_cast<float2*>(r + (wk * kTcRows + g + 8) * kTcRedStride + col) =
                        make_float2(acc[f][2], acc[f][3]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[f][i] = 0.0f;
                }
                __syncthreads();
                const int64_t f0 = n0 + cs * kTcSub;
                for (int o = threadIdx.x; o < nr * kTcSub; o += kThreads) {
                    const int t = o / kTcSub, col = o % kTcSub;
                    if (f0 + col >= d.n) continue;
                    float a = r[t * kTcRedStride + col];
#pragma unroll
                    for (int q = 1; q < kTcKWarps; ++q) a = __fadd_rn(a, r[(q * kTcRows + t) * kTcRedStride + col]);
                    d.out[rows[t] * d.n + f0 + col] = a;
                }
                buf ^= 1;  // the next sub-tile writes the other buffer; this one again only past the next barrier
            }
            if (++ci == kw) ci = 0, ++cs;
        }
    }
    __syncthreads();  // xs, red and the row ids are rewritten by the block's next item
}

// Grid (tiles, min(work, 65535)); block (x, y) serves tile x of items y, y + gridDim.y, ...
template <int K, int DEPTH>
__global__ void __launch_bounds__(kThreads, 2) expert_tc_kernel(const __grid_constant__ ExpertTcParams p) {
    pdl_prologue();  // see pdl.cuh
    extern __shared__ __align__(16) uint8_t tc_smem[];
    float* red = reinterpret_cast<float*>(tc_smem);
    int64_t* rows = reinterpret_cast<int64_t*>(tc_smem + kTcRedBytes);
    uint16_t* xs = reinterpret_cast<uint16_t*>(tc_smem + kTcHeadBytes);  // [P, x_stride] bf16
    const ExpertLinearDesc& d = p.d;
    const int64_t tile = int64_t{p.subtiles} * kTcSub, n0 = blockIdx.x * tile;
    for (int64_t y = blockIdx.y; y < p.work; y += gridDim.y) {
        int e = 0, nr = 1;
        if (p.items) {
            if (y >= *p.item_count) break;  // the same for the whole block
            const int4 it = p.items[y];
            nr = it.y;
            e = it.z;
            if (threadIdx.x < nr) rows[threadIdx.x] = p.perm[it.x + threadIdx.x];
        } else {
            e = d.expert_of_row[y];
            if (threadIdx.x == 0) rows[0] = y;
        }
        __syncthreads();
        if (e < 0 || e >= d.num_experts) {  // a bad id: NaN rows
            for (int64_t o = threadIdx.x; o < nr * tile; o += kThreads) {
                const int64_t t = o / tile, f = n0 + o % tile;
                if (f < d.n) d.out[rows[t] * d.n + f] = __int_as_float(0x7fc00000);
            }
            __syncthreads();
            continue;
        }
        tc_item<K, DEPTH>(p, e, nr, rows, n0, xs, red);
    }
}



template <int K, int P>
void launch_products(const ExpertParams& p, int64_t tiles, size_t smem, cudaStream_t stream) {
    auto kernel = expert_linear_kernel<K, P>;
    static std::atomic<uint64_t> configured{0};  // one bit per device
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    if (!(configured.load() >> (dev % 64) & 1)) {
        DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kXBytes + kRedBytes));
        configured.fetch_or(uint64_t{1} << (dev % 64));
    }
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min<int64_t>(p.work, 65535)));
    launch_pdl(kernel, grid, kThreads, smem, stream, p);
    DI_CUDA_LAUNCH_CHECK();
}

template <int K>
void launch_products(const ExpertParams& p, int P, int64_t tiles, size_t smem, cudaStream_t stream) {
    switch (P) {
        case 1: launch_products<K, 1>(p, tiles, smem, stream); break;
        case 2: launch_products<K, 2>(p, tiles, smem, stream); break;
        default: launch_products<K, 4>(p, tiles, smem, stream); break;
    }
}

// The rows sorted by expert into items of up to P rows (moe_group_kernel), in stream-ordered scratch that the
// caller frees after its products: [16 B] item count, [rows] perm, [work] items.
struct Grouping {
    uint8_t* ws = nullptr;
    const int32_t* count = nullptr;
    const int32_t* perm = nullptr;
    const int4* items = nullptr;
    int64_t work = 0;  // bound on the items
};

Grouping group_rows(const ExpertLinearDesc& d, int P, cudaStream_t stream) {
    const int64_t buckets = int64_t{d.num_experts} + 1;
    Grouping g;
    // Items: sum over the touched buckets of ceil(rows / P) <= (rows + (P - 1) * buckets touched) / P.
    g.work = (d.rows + (P - 1) * std::min(d.rows, buckets)) / P;
    const int64_t perm_bytes = ceil_div(d.rows * 4, 16) * 16;
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&g.ws), 16 + perm_bytes + g.work * 16, stream));
    int32_t* count = reinterpret_cast<int32_t*>(g.ws);
    int32_t* perm = reinterpret_cast<int32_t*>(g.ws + 16);
    int4* list = reinterpret_cast<int4*>(g.ws + 16 + perm_bytes);
    moe_group_kernel<<<1, kGroupThreads, static_cast<size_t>(4 * buckets) * 4, stream>>>(
        count, perm, list, d.expert_of_row, d.rows, d.num_experts, P);
    DI_CUDA_LAUNCH_CHECK();
    g.count = count, g.perm = perm, g.items = list;
    return g;
}

// Bytes per staged row of the tensor-core kernel: whole k blocks of bf16, 64 past a multiple of 128.
int64_t tc_row_bytes(int64_t k, int e) { return ceil_div(ceil_div(k, 4 * e) * 4 * e * 2, 128) * 128 + 64; }

template <int K, int DEPTH = K == kFP4 ? kTcFp4Depth : kTcDepth>
void launch_tc(const ExpertTcParams& p, int64_t tiles, size_t smem, cudaStream_t stream) {
    auto kernel = expert_tc_kernel<K, DEPTH>;
    static std::atomic<uint64_t> configured{0};
    allow_smem(kernel, kTcHeadBytes + kTcMaxXBytes, configured);
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min<int64_t>(p.work, 65535)));
    launch_pdl(kernel, grid, kThreads, smem, stream, p);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_expert_tc(const ExpertLinearDesc& d, const WeightDesc& first, cudaStream_t stream) {
    const int kind = kind_of(first), e = elems_of(kind);
    const int64_t row_bytes = tc_row_bytes(d.k, e);
    ExpertTcParams p{};
    p.d = d;
    p.chunks = static_cast<int>(d.k / e);
    p.kblocks = static_cast<int>(ceil_div(p.chunks, 4));
    p.kw_steps = static_cast<int>(std::max<int64_t>(1, ceil_div(p.kblocks, kTcKWarps)));  // k = 0: zero rows
    p.x_stride = static_cast<int>(row_bytes / 2);
    p.x_vec4 = reinterpret_cast<uintptr_t>(d.x) % 16 == 0 ? 1 : 0;
    if (first.format != 0) p.scale_shift = __builtin_ctz(static_cast<unsigned>(first.block_cols / e));

    // Rows per item: one while rows rarely share an expert (no grouping launch), else up to 16 (an MMA costs the
    // same for 1 row or 16), as far as their staged rows fit two blocks per SM.
    const int64_t buckets = int64_t{d.num_experts} + 1;
    int P = d.rows <= kOneRowItems || buckets > kGroupMaxBuckets ? 1 : kTcRows;
    while (P > 1 && P * row_bytes > kTcXBytes) P /= 2;

    // Tile: one sub-tile of 32 features, doubled up to 256 while the grid keeps 6 blocks per SM (a small batch's
    // few items then still spread over the card, a large batch's stage each row for fewer tiles).
    const int64_t items = P == 1 ? d.rows : std::min<int64_t>(d.rows, d.num_experts);  // roughly
    const int64_t min_blocks = 6 * static_cast<int64_t>(device_sm_count());
    int tile = kTcSub;
    while (tile < kTcMaxTile && items * ceil_div(d.n, 2 * tile) >= min_blocks) tile *= 2;
    p.subtiles = tile / kTcSub;
    const int64_t tiles = ceil_div(d.n, tile);
    DI_ICHECK(tiles <= INT32_MAX, "expert_linear: ", d.n, " outputs");
    const size_t smem = static_cast<size_t>(kTcHeadBytes + P * row_bytes);

    const Grouping gr = P == 1 ? Grouping{} : group_rows(d, P, stream);
    p.work = P == 1 ? d.rows : gr.work;
    p.item_count = gr.count, p.perm = gr.perm, p.items = gr.items;
    switch (kind) {
        case kF32: launch_tc<kF32>(p, tiles, smem, stream); break;
        case kBF16: launch_tc<kBF16>(p, tiles, smem, stream); break;
        case kF16: launch_tc<kF16>(p, tiles, smem, stream); break;
        case kFP8: launch_tc<kFP8>(p, tiles, smem, stream); break;
        default: launch_tc<kFP4>(p, tiles, smem, stream); break;
    }
    if (gr.ws) DI_CUDA_CHECK(cudaFreeAsync(gr.ws, stream));
}

}  // namespace

void launch_moe_route(int32_t* experts, float* weights, const float* logits, int64_t rows, int64_t e,
                      const MoeRouteDesc& r, cudaStream_t stream) {
    if (rows == 0) return;
    DI_ICHECK(e > 0 && e <= kRouteMaxExperts && r.k > 0 && r.k <= kMoeRouteMaxK && r.k <= e, "moe_route: ", e,
              " experts, k ", r.k);
    launch_pdl(moe_route_kernel, static_cast<unsigned>(rows), kRouteThreads, static_cast<size_t>(e) * 4, stream, experts, weights, logits, e, r);
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

void launch_expert_linear(const ExpertLinearDesc& d, const WeightDesc& first, bool fast, bool tensor_cores,
                          cudaStream_t stream) {
    if (d.rows * d.n == 0) return;
    const int kind = kind_of(first), e = elems_of(kind);
    if (fast && tensor_cores && tc_row_bytes(d.k, e) <= kTcMaxXBytes) {
        launch_expert_tc(d, first, stream);
        return;
    }
    const int64_t stride4 = ceil_div(d.k / 4, 8) * 8;  // fast: k is whole chunks, so a multiple of 4
    if (!fast || stride4 * 16 > kXBytes) {
        launch_pdl(expert_linear_plain_kernel, static_cast<unsigned>((d.rows * d.n + 255) / 256), 256, 0, stream, d);
        DI_CUDA_LAUNCH_CHECK();
        return;
    }
    ExpertParams p{};
    p.d = d;
    p.chunks = static_cast<int>(d.k / e);
    p.slices = static_cast<int>(ceil_div(p.chunks, 32));
    p.slice_warps = std::min(p.slices, kWarps);
    p.feature_warps = kWarps / p.slice_warps;
    p.x_stride4 = static_cast<int>(stride4);
    p.x_vec4 = reinterpret_cast<uintptr_t>(d.x) % 16 == 0 ? 1 : 0;
    if (first.format != 0) p.scale_shift = __builtin_ctz(static_cast<unsigned>(first.block_cols / e));

    // Rows per item: one while rows rarely share an expert (decode at small batches: no grouping launch), then
    // 2 or 4, as far as their activations fit in shared memory.
    const int64_t buckets = int64_t{d.num_experts} + 1;
    int P = d.rows <= kOneRowItems ? 1 : d.rows <= 4 * kOneRowItems ? 2 : kMaxGroupRows;
    while (P > 1 && P * stride4 * 16 > kXBytes) P /= 2;
    if (buckets > kGroupMaxBuckets) P = 1;

    // Tile: at least 32 features (64 with grouping), so that staging the activations (a block reads k floats per
    // row, from L2) stays a fraction of the tile's weight bytes; doubled while that still leaves 8 blocks per SM
    // (the blocks of a small batch, few and short, then spread evenly); the slices' partial sums must fit.
    const int unit = p.feature_warps * kNF;
    const int64_t items = P == 1 ? d.rows : std::min<int64_t>(d.rows, d.num_experts);  // roughly
    const int64_t min_blocks = 8 * static_cast<int64_t>(device_sm_count());
    auto red_bytes = [&](int64_t tile) { return int64_t{p.slices} * tile * P * 4; };
    int tile = std::max(unit, P == 1 ? 32 : 64);
    while (tile > unit && red_bytes(tile) > kRedBytes) tile /= 2;
    while (tile < kMaxTile && red_bytes(2 * tile) <= kRedBytes && items * ceil_div(d.n, 2 * tile) >= min_blocks)
        tile *= 2;
    DI_ICHECK(red_bytes(tile) <= kRedBytes, "expert_linear: ", p.slices, " slices");
    p.tile = tile;
    const int64_t tiles = ceil_div(d.n, tile);
    DI_ICHECK(tiles <= INT32_MAX, "expert_linear: ", d.n, " outputs");
    const size_t smem = static_cast<size_t>(P * stride4 * 16 + red_bytes(tile));

    const Grouping gr = P == 1 ? Grouping{} : group_rows(d, P, stream);
    p.work = P == 1 ? d.rows : gr.work;
    p.item_count = gr.count, p.perm = gr.perm, p.items = gr.items;
    switch (kind) {
        case kF32: launch_products<kF32>(p, P, tiles, smem, stream); break;
        case kBF16: launch_products<kBF16>(p, P, tiles, smem, stream); break;
        case kF16: launch_products<kF16>(p, P, tiles, smem, stream); break;
        case kFP8: launch_products<kFP8>(p, P, tiles, smem, stream); break;
        default: launch_products<kFP4>(p, P, tiles, smem, stream); break;
    }
    if (gr.ws) DI_CUDA_CHECK(cudaFreeAsync(gr.ws, stream));
}

}  // namespace deepinfer::cuda
