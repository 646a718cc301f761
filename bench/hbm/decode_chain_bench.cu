// What a decode step's kernels cost when nothing else does: the floors under the measured batch-1 step (1.79 ms on
// an H200 for ~300 kernels, against a 0.69 ms bandwidth floor; bench/results/decode_launch_fusion_runs44-46).
//
// 1. Chains of dependent kernels, each waiting for the one before (a ping-pong pair of buffers), as the step's small
//    ops do. Per kernel: nothing (one warp); one 4096-float row read, normed by a block sum and written (an RMSNorm
//    of one token); 32 blocks each reading 512 floats of 16384 and writing a partial (the mHC mix dots). Each chain
//    on a stream without and with programmatic dependent launch (PDL: griddepcontrol.wait first, as pdl.cuh's
//    prologue), and captured into a CUDA graph with PDL edges. Prints us per kernel.
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
#include <vector>

namespace {

#define CHECK(expr)                                                                              \
    do {                                                                                         \
        const cudaError_t e_ = (expr);                                                           \
        if (e_ != cudaSuccess) {                                                                 \
            std::fprintf(stderr, "decode_chain_bench: %s: %s\n", #expr, cudaGetErrorString(e_)); \
            std::exit(1);                                                                        \
        }                                                                                        \
    } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// ---- 1. chains ----------------------------------------------------------------------------------------------

__global__ void empty_kernel(const float* in, float* out) {
    pdl_wait();
    pdl_launch();
    if (threadIdx.x == 0 && in[0] == 12345.0f) out[0] = 1.0f;  // a read of the kernel before's output
}

// out [4096] = in * rsqrt(mean square): one block of 256 threads, 4 float4 a thread (rms_norm_vec_kernel's shape).
__global__ void __launch_bounds__(256) row_norm_kernel(const float* in, float* out) {
    pdl_wait();
    pdl_launch();
    __shared__ float part[8];
    const float4* x = reinterpret_cast<const float4*>(in);
    float4 v[4];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        v[u] = x[threadIdx.x + 256 * u];
        ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < 8; ++w) total += part[w];
    const float inv = rsqrtf(total / 4096.0f + 1e-6f);
    float4* y = reinterpret_cast<float4*>(out);
#pragma unroll
    for (int u = 0; u < 4; ++u)
        y[threadIdx.x + 256 * u] = make_float4(v[u].x * inv, v[u].y * inv, v[u].z * inv, v[u].w * inv);
}

// 32 blocks: block c reads floats [512 c, 512 c + 512) of in [16384], writes their block sum to out[c] and copies its
// slice (so that the next kernel has 16384 floats to read).
__global__ void __launch_bounds__(256) chunk_dots_kernel(const float* in, float* out) {
    pdl_wait();
    pdl_launch();
    __shared__ float part[8];
    const int c = blockIdx.x;
    const float2 v = reinterpret_cast<const float2*>(in + 512 * c)[threadIdx.x];
    float s = v.x * v.x + v.y * v.y;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < 8; ++w) total += part[w];
    reinterpret_cast<float2*>(out + 512 * c)[threadIdx.x] = make_float2(v.x + total * 1e-9f, v.y);
}

struct ChainKind {
    const char* name;
    void (*kernel)(const float*, float*);
    unsigned blocks, threads;
};

cudaError_t launch(const ChainKind& k, const float* in, float* out, bool pdl, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(k.blocks);
    cfg.blockDim = dim3(k.threads);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (pdl) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, k.kernel, in, out);
}

// us per kernel of a chain of n (best of 5), mode 0: stream, 1: stream + PDL, 2: graph + PDL; negative where the
// graph could not be made (the error printed).
double time_chain(const ChainKind& k, int n, int mode, float* a, float* b, cudaStream_t stream) {
    cudaGraphExec_t exec = nullptr;
    auto issue = [&] {
        cudaError_t err = cudaSuccess;
        for (int i = 0; i < n && err == cudaSuccess; ++i)
            err = launch(k, i % 2 ? b : a, i % 2 ? a : b, mode > 0, stream);
        return err;
    };
    if (mode == 2) {
        cudaGraph_t graph = nullptr;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        const cudaError_t launched = issue();
        const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
        cudaError_t err = launched != cudaSuccess ? launched : ended;
        if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (err != cudaSuccess) {
            std::fprintf(stderr, "decode_chain_bench: graph of %s: %s\n", k.name, cudaGetErrorString(err));
            cudaGetLastError();
            return -1.0;
        }
    }
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int rep = 0; rep < 6; ++rep) {  // the first is a warm-up
        CHECK(cudaEventRecord(e0, stream));
        if (exec)
            CHECK(cudaGraphLaunch(exec, stream));
        else
            CHECK(issue());
        CHECK(cudaEventRecord(e1, stream));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0 && ms < best) best = ms;
    }
    if (exec) CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return best * 1e3 / n;
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

// us per read of `rows` rows of row_chunks chunks (ranks x slice = row_chunks), rotating over `copies` copies.
double time_reads(ReadKernel kernel, const std::vector<uint4*>& copies, int64_t rows, int64_t row_chunks, int ranks,
                  bool tiled, uint4* sink) {
    const int slice = static_cast<int>(row_chunks / ranks);
    const dim3 grid(ranks, static_cast<unsigned>(rows / kRows));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const int iters = 32;
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
        CHECK(cudaEventRecord(e0));
        for (int i = 0; i < iters; ++i)
            kernel<<<grid, kThreads>>>(copies[i % copies.size()], row_chunks, slice, tiled, sink);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CHECK(cudaGetLastError());
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return best * 1e3 / iters;
}

}  // namespace

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
    if (n < 2) n = 2;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float *a = nullptr, *b = nullptr;
    CHECK(cudaMalloc(&a, 16384 * sizeof(float)));
    CHECK(cudaMalloc(&b, 16384 * sizeof(float)));
    std::vector<float> ones(16384, 1.0f);
    CHECK(cudaMemcpy(a, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));

    std::printf("chains of %d dependent kernels, us a kernel (best of 5)\n", n);
    std::printf("%-40s %10s %10s %10s\n", "kernel", "stream", "+PDL", "graph+PDL");
    const ChainKind kinds[] = {{"empty (1 x 32 threads)", empty_kernel, 1, 32},
                               {"row norm (1 x 256, 16 KB in and out)", row_norm_kernel, 1, 256},
                               {"chunk dots (32 x 256, 64 KB in and out)", chunk_dots_kernel, 32, 256}};
    for (const ChainKind& k : kinds) {
        std::printf("%-40s", k.name);
        for (int mode = 0; mode < 3; ++mode) {
            const double us = time_chain(k, n, mode, a, b, stream);
            if (us < 0)
                std::printf(" %10s", "n/a");
            else
                std::printf(" %10.2f", us);
        }
        std::printf("\n");
    }

    // wo_b's shape: 4096 rows of 8192 bytes (512 chunks), 2 ranks; then 4x and 32x the rows.
    const int64_t row_chunks = 512;
    const int64_t max_rows = 4096 * 32, bytes = max_rows * row_chunks * 16;
    std::vector<uint4*> copies(2);  // 2 x 1 GiB: consecutive reads of the small sizes rotate through 64 slots
    for (uint4*& c : copies) {
        CHECK(cudaMalloc(&c, bytes));
        CHECK(cudaMemset(c, 1, bytes));
    }
    uint4* sink = nullptr;
    CHECK(cudaMalloc(&sink, sizeof(uint4)));
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
            for (int i = 0; i < 5; ++i) {
                const double us = time_reads(kernels[i], slots, rows, row_chunks, 2, tiled, sink);
                std::printf(" %7.2f (%5.0f)", us, rows * row_chunks * 16 / (us * 1e3));
            }
            std::printf("\n");
        }
    }
    for (uint4* c : copies) CHECK(cudaFree(c));
    CHECK(cudaFree(sink));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 0;
}
