// The last step of both sparse-attention kernels (attention.cu, attention_tc.cu).
#pragma once

#include <cooperative_groups.h>

namespace deepinfer::cuda {

// The blocks of a cluster (one, or the `splits` blocks that share a (row, head group)'s key list) each hold, for
// the group's nh heads, their output over their share of the keys, unnormalised (part [nh, ld] f32 in shared
// memory), with its running max and denominator (ml [2, HG]: m at [h], l at [HG + h]). Writes orow [nh, d] =
// sum_r exp(m_r - M) part_r / L, with the sink (sinks [nh]) joining M and L, summed in rank order over
// distributed shared memory: deterministic. Rank r writes the elements r * THREADS + tid, stepping by
// splits * THREADS (THREADS = blockDim.x). wts: [splits, HG] shared scratch. Called by every thread of every block
// of the cluster.
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
    for (int i = rank * THREADS + tid; i < nh * d; i += splits * THREADS) {
        const int h = i / d, c = i - h * d;
        float o = 0.0f;
        for (int r = 0; r < splits; ++r) o = fmaf(wts[r * HG + h], cluster.map_shared_rank(part, r)[h * ld + c], o);
        orow[i] = o;
    }
    cluster.sync();  // the other ranks may still read this block's part and ml
}

}  // namespace deepinfer::cuda
