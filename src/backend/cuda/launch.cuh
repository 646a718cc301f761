// Host-side launch helpers shared by the kernels that use thread-block clusters and large shared memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The current device's SM count, asked of the driver once per device (launchers size their grids by it on
// every call).
inline int device_sm_count() {
    static std::atomic<int> counts[64] = {};
    int dev = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& cached = counts[dev % 64];
    int n = cached.load(std::memory_order_relaxed);
    if (n == 0) {
        DI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
        cached.store(n, std::memory_order_relaxed);
    }
    return n;
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

// kernel<<<grid, threads, smem, stream>>>(params) with the grid's x dimension in clusters of cluster_x blocks.
template <typename Kernel, typename Params>
void launch_clustered(Kernel kernel, dim3 grid, int cluster_x, int threads, int smem, cudaStream_t stream,
                      const Params& params) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster_x;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, params));
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
