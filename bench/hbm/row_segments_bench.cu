// HBM read rate of weight tiles streamed in stages, by the bytes a stage reads from each weight row.
//
// The weight-streaming kernels read a tile of rows in stages of k: per stage, a run of S contiguous bytes from each
// row, at the row stride (FP4 experts: 64 bytes a row a 128-k stage, or 128 in the paired stages, at a 2048-byte
// stride for D 4096 and 1024 for I 2048; FP8 GEMV: 128 bytes). This reads 2 GiB in 16 KB stages, each stage S bytes
// from each of 16384 / S rows of a tile (row stride P, a tile read whole after P / S stages), against the same bytes
// read as contiguous 16 KB stages, at 1-8 CTAs of 256 threads per SM with 4 independent 16-byte loads in flight per
// thread a stage. Results: bench/results/hbm_row_segments_*.txt.
//
//   row_segments_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kStageBytes = 16 * 1024, kThreads = 256;
constexpr int64_t kContiguousTileBytes = 512 * 1024;

// A tile: kStageBytes / seg rows of `stride` bytes, read in stride / seg stages (seg = 0: contiguous stages).
int64_t tile_bytes(int seg, int stride) {
    return seg == 0 ? kContiguousTileBytes : int64_t{kStageBytes} / seg * stride;
}

// seg = 0: contiguous stages; else `seg` bytes (a multiple of 16) from each of kStageBytes / seg rows a stage, the
// rows `stride` bytes apart.
__global__ void __launch_bounds__(kThreads) read_tiles(const uint4* __restrict__ w, int64_t tiles, int64_t tile_size,
                                                       int seg, int stride, uint4* __restrict__ sink) {
    uint4 acc = {0, 0, 0, 0};
    const int chunks_per_row = seg / 16, stages = static_cast<int>(tile_size / kStageBytes);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const uint8_t* base = reinterpret_cast<const uint8_t*>(w) + tile * tile_size;
        for (int s = 0; s < stages; ++s) {
#pragma unroll
            for (int i = 0; i < kStageBytes / 16 / kThreads; ++i) {
                const int c = threadIdx.x + kThreads * i;  // 16-byte chunk of the stage
                const uint8_t* p = seg == 0
                                       ? base + s * kStageBytes + c * 16
                                       : base + (c / chunks_per_row) * stride + s * seg + (c % chunks_per_row) * 16;
                const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
                acc.x ^= v.x;
                acc.y ^= v.y;
                acc.z ^= v.z;
                acc.w ^= v.w;
            }
        }
    }
    if ((acc.x & acc.y & acc.z & acc.w) == 0xdeadbeefu) *sink = acc;  // keeps the loads
}

}  // namespace

int main() {
    const int64_t bytes = int64_t{2} << 30;
    uint4 *w = nullptr, *sink = nullptr;
    if (cudaMalloc(&w, bytes) != cudaSuccess || cudaMalloc(&sink, sizeof(uint4)) != cudaSuccess) {
        std::fprintf(stderr, "row_segments_bench: cannot allocate 2 GiB on the GPU\n");
        return 1;
    }
    cudaMemset(w, 1, bytes);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::printf("%-34s %10s %10s %10s %10s   (GB/s, best of 5; 2 GiB read)\n", "bytes a row a stage (row stride)",
                "1 CTA/SM", "2", "4", "8");
    const int cases[][2] = {{0, 0},      {32, 1024},  {64, 2048},  {64, 1024},  {128, 4096},
                            {128, 2048}, {128, 1024}, {256, 8192}, {256, 2048}, {512, 16384}};
    for (const auto& [seg, stride] : cases) {
        const int64_t tile = tile_bytes(seg, stride), tiles = bytes / tile;
        char label[64];
        if (seg == 0)
            std::snprintf(label, sizeof label, "contiguous 16 KB stages");
        else
            std::snprintf(label, sizeof label, "%d B (%d B stride)", seg, stride);
        std::printf("%-34s", label);
        for (int per_sm : {1, 2, 4, 8}) {
            float best = 1e30f;
            for (int rep = 0; rep < 5; ++rep) {
                cudaEventRecord(a);
                read_tiles<<<sms * per_sm, kThreads>>>(w, tiles, tile, seg, stride, sink);
                cudaEventRecord(b);
                cudaEventSynchronize(b);
                float ms = 0;
                cudaEventElapsedTime(&ms, a, b);
                if (ms < best) best = ms;
            }
            std::printf(" %10.0f", tiles * tile / (best * 1e6));
        }
        std::printf("\n");
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        std::fprintf(stderr, "row_segments_bench: %s\n", cudaGetErrorString(err));
        return 1;
    }
    return 0;
}
