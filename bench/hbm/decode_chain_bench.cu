// What a decode step's kernels cost when nothing else does: the floors under the measured batch-1 step (1.79 ms on
// an H200 for ~300 kernels, against a 0.69 ms bandwidth floor; bench/results/decode_launch_fusion_runs44-46).
//
// 1. Chains of dependent kernels, each reading what the one before wrote (a ping-pong pair of buffers), as the step's
//    small ops do: an empty kernel (one warp: the launch and dependency floor), the backend's RMSNorm of one
//    4096-float row (cuda::launch_rms_norm: a block, 16 KB in and out) and its hc_post of one token (n 4, d 4096:
//    16 blocks, 80 KB in, 64 KB out). Each chain issued on a stream and captured into a CUDA graph; every launch
//    goes through pdl.cuh, so programmatic dependent launch is on unless DEEPINFER_CUDA_PDL=0 (run the bench once
//    each way to compare). Prints us per kernel.
// 2. One wave of weight reads at one activation row, the fp32 GEMV's pattern (gemv.cu: 256 threads, a row per 8
//    lanes, 32 rows a block, each 8 lanes reading 16-byte chunks l8, l8 + 8, ... of their row's slice), D 16-byte
//    loads in flight per lane; against the same bytes laid out tile by tile (each block's 32 rows x slice chunks
//    contiguous, lane t reading chunks t, t + 256, ...). Sizes: wo_b's 33.5 MB ([4096 x 8192] FP8: 128 tiles x 2
//    ranks, one wave of 2 blocks an SM), then 4x and 32x that (more waves). Rotating copies keep the reads off the
//    L2. Prints us per read and GB/s. The GEMV reads wo_b in 14.2 us (55% of 4.26 TB/s) with D = 2; neither
//    D = 16 (a cp.async ring) nor an L2 prefetch of the tile made it faster (runs 39-43): this says what the
//    pattern alone allows.
//
//   decode_chain_bench [--kernels N]   (default 256 kernels a chain)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "common/event_timing.cuh"

namespace deepinfer::cuda {
namespace {

// ---- 1. chains ----------------------------------------------------------------------------------------------

__global__ void empty_kernel(const float* in, float* out) {
    pdl_prologue();                                            // see pdl.cuh
    if (threadIdx.x == 0 && in[0] == 12345.0f) out[0] = 1.0f;  // a read of the kernel before's output
}

// One op of a chain: reads `in`, writes `out` (both 16384 floats), on `stream`.
using ChainOp = std::function<void(const float* in, float* out, cudaStream_t stream)>;

// us per kernel of a chain of n ops, best of 5 after a warm-up; graph: captured once, then replayed. Negative
// where the graph cannot be made (the error printed).
double time_chain(const ChainOp& op, const char* name, int n, bool graph, float* a, float* b, cudaStream_t stream) {
    auto issue = [&] {
        for (int i = 0; i < n; ++i) op(i % 2 ? b : a, i % 2 ? a : b, stream);
    };
    cudaGraphExec_t exec = nullptr;
    if (graph) {
        cudaGraph_t g = nullptr;
        DI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        try {
            issue();
        } catch (const std::exception& e) {
            cudaStreamEndCapture(stream, &g);
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            std::fprintf(stderr, "decode_chain_bench: graph of %s: %s\n", name, e.what());
            return -1.0;
        }
        DI_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
        const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        if (err != cudaSuccess) {
            cudaGetLastError();
            std::fprintf(stderr, "decode_chain_bench: graph of %s: %s\n", name, cudaGetErrorString(err));
            return -1.0;
        }
    }
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {  // the first is a warm-up
        // `stream` is a blocking stream: the default stream's events bracket its work.
        const double us = bench::mean_call_us(1, [&](int) {
            if (exec)
                DI_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            else
                issue();
        });
        if (rep > 0 && us < best) best = us;
    }
    if (exec) DI_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return best / n;
}

// ---- 2. one-wave weight reads ---------------------------------------------------------------------------------

constexpr int kThreads = 256, kRows = 32;  // rows a block (a row per 8 lanes)

// Grid (ranks, tiles). Row layout: row r = 32 tile + lane / 8 holds row_chunks 16-byte chunks; rank k reads chunks
// [k slice, (k + 1) slice) of it, lane l8 the chunks l8 + 8 j. Tile layout (tiled): block (k, tile)'s 32 x slice
// chunks are contiguous, lane t reading chunks t + 256 j. Either way a lane reads slice / 8 chunks, D at a time.
template <int D>
__global__ void __launch_bounds__(kThreads)
    read_rows_kernel(const uint4* __restrict__ w, int64_t row_chunks, int slice, bool tiled, uint4* sink) {
    const int l8 = threadIdx.x % 8, g = threadIdx.x / 8;
    const uint4* base;
    int64_t step;
    if (tiled) {
        base = w + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kRows * slice + threadIdx.x;
        step = kThreads;
    } else {
        base = w + (static_cast<int64_t>(blockIdx.y) * kRows + g) * row_chunks +
               static_cast<int64_t>(blockIdx.x) * slice + l8;
        step = 8;
    }
    const int n = slice / 8;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int j = 0; j < n; j += D) {
        uint4 v[D];
#pragma unroll
        for (int u = 0; u < D; ++u) v[u] = j + u < n ? __ldg(base + (j + u) * step) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < D; ++u) {
            acc.x ^= v[u].x;
            acc.y ^= v[u].y;
            acc.z ^= v[u].z;
            acc.w ^= v[u].w;
        }
    }
    if ((acc.x & acc.y & acc.z & acc.w) == 0xdeadbeefu) *sink = acc;  // keeps the loads
}

using ReadKernel = void (*)(const uint4*, int64_t, int, bool, uint4*);

// us per read of `rows` rows of row_chunks chunks (ranks x slice = row_chunks), rotating over the slots; the best
// of 4 means of 32 reads.
double time_reads(ReadKernel kernel, const std::vector<uint4*>& slots, int64_t rows, int64_t row_chunks, int ranks,
                  bool tiled, uint4* sink) {
    const int slice = static_cast<int>(row_chunks / ranks);
    const dim3 grid(ranks, static_cast<unsigned>(rows / kRows));
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
        const double us = bench::mean_call_us(
            32, [&](int i) { kernel<<<grid, kThreads>>>(slots[i % slots.size()], row_chunks, slice, tiled, sink); });
        if (us < best) best = us;
    }
    DI_CUDA_LAUNCH_CHECK();
    return best;
}

void print_us(double us) {
    if (us < 0)
        std::printf(" %10s", "n/a");
    else
        std::printf(" %10.2f", us);
}

int run(int n) {
    cudaStream_t stream;
    DI_CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the default stream's timing events
    constexpr int64_t kFloats = 16384;         // a token's 4 streams of 4096
    float *a = nullptr, *b = nullptr, *consts = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&a, kFloats * sizeof(float)));
    DI_CUDA_CHECK(cudaMalloc(&b, kFloats * sizeof(float)));
    DI_CUDA_CHECK(cudaMalloc(&consts, kFloats * sizeof(float)));  // y, the norm weight, post, comb: ones
    const std::vector<float> ones(kFloats, 1.0f);
    for (float* p : {a, b, consts}) DI_CUDA_CHECK(cudaMemcpy(p, ones.data(), kFloats * 4, cudaMemcpyHostToDevice));

    std::printf("chains of %d dependent kernels, us a kernel (best of 5); PDL %s (DEEPINFER_CUDA_PDL)\n", n,
                pdl_enabled() ? "on" : "off");
    std::printf("%-42s %10s %10s\n", "kernel", "stream", "graph");
    const struct {
        const char* name;
        ChainOp op;
    } chains[] = {
        {"empty (1 x 32 threads)",
         [](const float* in, float* out, cudaStream_t s) {
             launch_pdl(empty_kernel, 1, 32, 0, s, in, out);
             DI_CUDA_LAUNCH_CHECK();
         }},
        {"rms_norm, one row of 4096 (launch_rms_norm)",
         [&](const float* in, float* out, cudaStream_t s) {
             launch_rms_norm(out, in, consts, 1, 4096, 1e-6f, false, s);
         }},
        {"hc_post, one token, n 4, d 4096",
         [&](const float* in, float* out, cudaStream_t s) {
             launch_hc_post(out, consts, consts, consts, in, 1, 4, 4096, s);
         }},
    };
    for (const auto& c : chains) {
        std::printf("%-42s", c.name);
        print_us(time_chain(c.op, c.name, n, false, a, b, stream));
        print_us(time_chain(c.op, c.name, n, true, a, b, stream));
        std::printf("\n");
    }

    // wo_b's shape: 4096 rows of 8192 bytes (512 chunks), 2 ranks; then 4x and 32x the rows.
    const int64_t row_chunks = 512;
    const int64_t max_rows = 4096 * 32, bytes = max_rows * row_chunks * 16;
    std::vector<uint4*> copies(2);  // 2 x 1 GiB: consecutive reads of the small sizes rotate through 64 slots
    for (uint4*& c : copies) {
        DI_CUDA_CHECK(cudaMalloc(&c, bytes));
        DI_CUDA_CHECK(cudaMemset(c, 1, bytes));
    }
    uint4* sink = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint4)));
    std::printf(
        "\none wave of weight reads (rows x 8192 B, 2 ranks of 4 KB a row, 256 threads a block), us a read "
        "(GB/s)\n");
    std::printf("%-10s %-6s", "rows", "layout");
    const int depths[] = {1, 2, 4, 8, 16};
    for (int d : depths) std::printf("    D=%-2d          ", d);
    std::printf("\n");
    const ReadKernel kernels[] = {read_rows_kernel<1>, read_rows_kernel<2>, read_rows_kernel<4>, read_rows_kernel<8>,
                                  read_rows_kernel<16>};
    for (int64_t rows : {int64_t{4096}, int64_t{16384}, max_rows}) {
        // Slots of `rows` rows inside the two copies, so that consecutive reads miss the L2.
        std::vector<uint4*> slots;
        for (uint4* c : copies)
            for (int64_t at = 0; at + rows <= max_rows && slots.size() < 64; at += rows)
                slots.push_back(c + at * row_chunks);
        for (const bool tiled : {false, true}) {
            std::printf("%-10lld %-6s", static_cast<long long>(rows), tiled ? "tiled" : "rows");
            for (const ReadKernel k : kernels) {
                const double us = time_reads(k, slots, rows, row_chunks, 2, tiled, sink);
                std::printf(" %7.2f (%5.0f)", us, rows * row_chunks * 16 / (us * 1e3));
            }
            std::printf("\n");
        }
    }
    for (uint4* c : copies) DI_CUDA_CHECK(cudaFree(c));
    for (void* p : {static_cast<void*>(sink), static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(consts)})
        DI_CUDA_CHECK(cudaFree(p));
    DI_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

}  // namespace
}  // namespace deepinfer::cuda

int main(int argc, char** argv) {
    int n = 256;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--kernels") == 0 && i + 1 < argc) {
            n = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: decode_chain_bench [--kernels N]\n");
            return 2;
        }
    }
    try {
        return deepinfer::cuda::run(n < 2 ? 2 : n);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "decode_chain_bench: %s\n", e.what());
        return 1;
    }
}
