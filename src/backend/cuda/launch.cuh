// Host-side launch helpers shared by the kernels that use thread-block clusters and large shared memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace deepinfer::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An attribute of the current device, asked of the driver once per device and attribute (launchers consult them
// on every call).
template <cudaDeviceAttr kAttr>
int cached_device_attribute() {
    static std::atomic<int> values[64] = {};  // value + 1; 0: not asked yet (a minor version may be 0)
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& cached = values[dev % 64];
    int v = cached.load(std::memory_order_relaxed) - 1;
    if (v < 0) {
        DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, kAttr, dev));
        cached.store(v + 1, std::memory_order_relaxed);
    }
    return v;
}

inline int device_sm_count() { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(); }
// Compute capability major * 10 + minor (90: Hopper's sm_90).
inline int device_compute_capability() {
    return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>() * 10 +
           cached_device_attribute<cudaDevAttrComputeCapabilityMinor>();
}

// Raises `kernel`'s dynamic shared memory limit to `bytes`, once per device (`configured`: one bit per device,
// static at the call site).
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes, std::atomic<uint64_t>& configured) {
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    if (configured.load() >> (dev % 64) & 1) return;
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    configured.fetch_or(uint64_t{1} << (dev % 64));
}

// The configuration of a launch of grid x threads blocks with `smem` bytes of dynamic shared memory on `stream`, the
// grid's x dimension in clusters of cluster_x blocks (attr: the cluster attribute's storage, alive while cfg is used).
inline cudaLaunchConfig_t cluster_config(dim3 grid, int cluster_x, int threads, int smem, cudaStream_t stream,
                                         cudaLaunchAttribute& attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster_x;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cfg;
}

// How many clusters of cluster_x blocks of one kernel (threads and smem bytes of dynamic shared memory each) the
// current device runs at once, asked of the driver once per device and cluster size (1..8). Clusters sit within one
// GPC, so with large blocks this can hold fewer blocks than the SMs (an H200 runs 30 clusters of 4
// one-block-an-SM blocks: 120 of its 132 SMs). One cache per kernel instantiation (a static at its launch site:
// instantiations of one kernel template share a function type, so the cache cannot key on it).
class ClusterFit {
public:
    template <typename Kernel>
    int max_active(Kernel kernel, int cluster_x, int threads, int smem) {
        DI_ICHECK(cluster_x >= 1 && cluster_x <= 8, "cluster of ", cluster_x, " blocks");
        int dev = 0;
        DI_CUDA_CHECK(cudaGetDevice(&dev));
        std::atomic<int>& cached = clusters_[dev % 64][cluster_x];
        int n = cached.load(std::memory_order_relaxed) - 1;
        if (n < 0) {
            cudaLaunchAttribute attr;
            const cudaLaunchConfig_t cfg = cluster_config(dim3(cluster_x), cluster_x, threads, smem, nullptr, attr);
            DI_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
            cached.store(n + 1, std::memory_order_relaxed);
        }
        return n;
    }

private:
    std::atomic<int> clusters_[64][9] = {};  // clusters + 1; 0: not asked yet
};

// kernel<<<grid, threads, smem, stream>>>(args...) with the grid's x dimension in clusters of cluster_x blocks.
template <typename Kernel, typename... Args>
void launch_clustered(Kernel kernel, dim3 grid, int cluster_x, int threads, int smem, cudaStream_t stream,
                      const Args&... args) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_config(grid, cluster_x, threads, smem, stream, attr);
    DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// launch_clustered for a kernel that begins with pdl_prologue() (pdl.cuh): programmatic serialization when on.
template <typename Kernel, typename Params>
void launch_clustered_pdl(Kernel kernel, dim3 grid, int cluster_x, int threads, int smem, cudaStream_t stream,
                          const Params& params) {
    cudaLaunchAttribute attrs[2];
    cudaLaunchConfig_t cfg = cluster_config(grid, cluster_x, threads, smem, stream, attrs[0]);
    add_pdl_attribute(cfg, attrs);
    DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, params));
}

// The distinct inputs (x, lda) of GEMV-like jobs into x[] / lda[] (the projections of one x share one; a grouped
// linear's groups do not); input_of[i] = job i's. Returns their count (at most `count`).
template <typename Job>
int distinct_inputs(const Job* jobs, int count, const float** x, int64_t* lda, int* input_of) {
    int inputs = 0;
    for (int i = 0; i < count; ++i) {
        int at = 0;
        while (at < inputs && !(x[at] == jobs[i].x && lda[at] == jobs[i].lda)) ++at;
        if (at == inputs) x[inputs] = jobs[i].x, lda[inputs] = jobs[i].lda, ++inputs;
        input_of[i] = at;
    }
    return inputs;
}

// Calls launch(first, n) for each run of consecutive jobs (those with n_out > 0, in their order) that `same`
// lets share a launch, at most max_per_launch a run.
template <typename Job, typename Same, typename Launch>
void for_each_shared_launch(const Job* jobs, int count, int max_per_launch, Same same, Launch launch) {
    std::vector<Job> live;
    for (int i = 0; i < count; ++i)
        if (jobs[i].n_out > 0) live.push_back(jobs[i]);
    for (size_t i = 0; i < live.size();) {
        size_t end = i + 1;
        while (end < live.size() && end - i < static_cast<size_t>(max_per_launch) && same(live[i], live[end])) ++end;
        launch(live.data() + i, static_cast<int>(end - i));
        i = end;
    }
}

}  // namespace deepinfer::cuda
