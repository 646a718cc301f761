// The last step of both sparse-attention kernels (attention.cu, attention_tc.cu).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

namespace deepinfer::cuda {

// The blocks of a cluster (one, or the `splits` blocks that share a (row, head group)'s key list) each hold, for
// the group's nh heads, their output over their share of the keys, unnormalised (part [nh, ld] f32 in shared
// memory), with its running max and denominator (ml [2, HG]: m at [h], l at [HG + h]). Writes orow [nh, d] =
// sum_r exp(m_r - M) part_r / L, with the sink (sinks [nh]) joining M and L, summed in rank order over
// distributed shared memory: deterministic. Rank r writes the elements (float4s where d, ld and the pointers
// allow) r * THREADS + tid, stepping by splits * THREADS (THREADS = blockDim.x). wts: [splits, HG] shared scratch.
// Called by every thread of every block of the cluster.
template <int HG, int THREADS>
__device__ __forceinline__ void merge_cluster_outputs(float* orow, float* part, int ld, float* ml, float* wts,
                                                      const float* sinks, int nh, int d, int splits, int rank) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int tid = threadIdx.x;
    cluster.sync();
    if (tid < nh) {
        const float sink = sinks[tid];
        float m = sink;
        for (int r = 0; r < splits; ++r) m = fmaxf(m, cluster.map_shared_rank(ml, r)[tid]);
        float l = expf(sink - m);
        for (int r = 0; r < splits; ++r) {
            const float* o = cluster.map_shared_rank(ml, r);
            l += o[HG + tid] * expf(o[tid] - m);
        }
        for (int r = 0; r < splits; ++r) wts[r * HG + tid] = expf(cluster.map_shared_rank(ml, r)[tid] - m) / l;
    }
    __syncthreads();
    // Each output element is fmaf(w_r, part_r, .) over r = 0..splits-1 in order, on either path below. The
    // distributed-shared-memory loads take a few hundred cycles each: the float4 path keeps kUnroll of them in flight
    // per rank step (one at a time, the merge took ~15 us a call at 64 heads x 512, more than the key tiles).
    const bool vec4 = d % 4 == 0 && ld % 4 == 0 && reinterpret_cast<uintptr_t>(orow) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(part) % 16 == 0;
    if (vec4) {
        constexpr int kUnroll = 4;
        const int per_row = d / 4, n4 = nh * per_row, step = splits * THREADS;
        for (int i0 = rank * THREADS + tid; i0 < n4; i0 += kUnroll * step) {
            float4 o[kUnroll];
            int at[kUnroll], h[kUnroll];
            bool live[kUnroll];  // element i0 + u step exists (a thread may hold a single one)
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                live[u] = i0 + u * step < n4;
                const int i = min(i0 + u * step, n4 - 1);  // past the end: a valid element, neither read nor stored
                h[u] = i / per_row;
                at[u] = h[u] * ld + 4 * (i - h[u] * per_row);
                o[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            for (int r = 0; r < splits; ++r) {
                const float* src = cluster.map_shared_rank(part, r);
                float4 v[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; ++u)
                    v[u] =
                        live[u] ? *reinterpret_cast<const float4*>(src + at[u]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const float w = wts[r * HG + h[u]];
                    o[u].x = fmaf(w, v[u].x, o[u].x), o[u].y = fmaf(w, v[u].y, o[u].y);
                    o[u].z = fmaf(w, v[u].z, o[u].z), o[u].w = fmaf(w, v[u].w, o[u].w);
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (live[u]) reinterpret_cast<float4*>(orow)[i0 + u * step] = o[u];
        }
    } else {
        for (int i = rank * THREADS + tid; i < nh * d; i += splits * THREADS) {
            const int h = i / d, c = i - h * d;
            float o = 0.0f;
            for (int r = 0; r < splits; ++r) o = fmaf(wts[r * HG + h], cluster.map_shared_rank(part, r)[h * ld + c], o);
            orow[i] = o;
        }
    }
    cluster.sync();  // the other ranks may still read this block's part and ml
}

}  // namespace deepinfer::cuda
