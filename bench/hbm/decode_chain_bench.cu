// What a decode step's kernels cost when nothing else does: the floors under the measured batch-1 step (1.79 ms on
// an H200 for ~300 kernels, against a 0.69 ms bandwidth floor; bench/results/decode_launch_fusion_runs44-46).
//
// 1. Chains of dependent kernels, each reading what the one before wrote (a ping-pong pair of buffers), as the step's
//    small ops do: an empty kernel (one warp: the launch and dependency floor), the backend's RMSNorm of one
//    4096-float row (cuda::launch_rms_norm: a block, 16 KB in and out) and its hc_post of one token (n 4, d 4096:
//    16 blocks, 80 KB in, 64 KB out). Each chain issued on a stream as the host gets to it (the host's launch rate
//    shows), queued behind a spin kernel (the device's own cost a kernel) and captured into a CUDA graph; every launch
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
// 3. Warming the L2 ahead of the reads: 8 layers of batch-1 weight reads (12 a layer, 200 MB) in one graph, each
//    after `gap` one-row RMSNorms, with a side-stream kernel that follows the reads' progress (each read publishes
//    its index) and asks the L2 for the weights up to a window ahead: by cp.async.bulk.prefetch.L2 hints, or by
//    real bulk copies into shared memory; against the same reads all aliasing one L2-resident 32 MB buffer (the
//    best warming could do). Also: the hint issue rate, and one read of a buffer just warmed each way.
//
//   decode_chain_bench [--kernels N] [--chains-only]   (default 256 kernels a chain; --chains-only: table 1 only)
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
#include "backend/cuda/wgmma_common.cuh"
#include "common/event_timing.cuh"

namespace deepinfer::cuda {
namespace {

// ---- 1. chains ----------------------------------------------------------------------------------------------

__global__ void empty_kernel(const float* in, float* out) {
    pdl_prologue();                                            // see pdl.cuh
    if (threadIdx.x == 0 && in[0] == 12345.0f) out[0] = 1.0f;  // a read of the kernel before's output
}

// Busy for `ns` nanoseconds of the GPU's global timer: holds a stream while the host queues what follows.
__global__ void spin_kernel(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// One op of a chain: reads `in`, writes `out` (both 16384 floats), on `stream`.
using ChainOp = std::function<void(const float* in, float* out, cudaStream_t stream)>;

// How a chain is issued: launched one by one as the host gets to them (kStream: the host's launch rate shows when
// it is slower than the kernels), launched one by one while a spin kernel holds the stream (kHeld: the whole chain
// is queued before the GPU reaches it, so the figure is the device's own cost a kernel), or replayed as a graph.
enum class Issue { kStream, kHeld, kGraph };

// us per kernel of a chain of n ops, best of 5 after a warm-up; graph: captured once, then replayed. Negative
// where the graph cannot be made (the error printed).
double time_chain(const ChainOp& op, const char* name, int n, Issue how, float* a, float* b, cudaStream_t stream) {
    const bool graph = how == Issue::kGraph;
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
    if (how == Issue::kHeld) {
        cudaEvent_t start, stop;
        DI_CUDA_CHECK(cudaEventCreate(&start));
        DI_CUDA_CHECK(cudaEventCreate(&stop));
        for (int rep = 0; rep < 6; ++rep) {
            spin_kernel<<<1, 32, 0, stream>>>(static_cast<long long>(n) * 20000);  // 20 us a launch to queue
            DI_CUDA_LAUNCH_CHECK();
            DI_CUDA_CHECK(cudaEventRecord(start, stream));
            issue();
            DI_CUDA_CHECK(cudaEventRecord(stop, stream));
            DI_CUDA_CHECK(cudaEventSynchronize(stop));
            float ms = 0;
            DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
            if (rep > 0 && 1000.0 * ms < best) best = 1000.0 * ms;
        }
        DI_CUDA_CHECK(cudaEventDestroy(start));
        DI_CUDA_CHECK(cudaEventDestroy(stop));
        return best / n;
    }
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
__device__ __forceinline__ void read_rows(const uint4* __restrict__ w, int64_t row_chunks, int slice, bool tiled,
                                          uint4* sink) {
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

template <int D>
__global__ void __launch_bounds__(kThreads)
    read_rows_kernel(const uint4* __restrict__ w, int64_t row_chunks, int slice, bool tiled, uint4* sink) {
    read_rows<D>(w, row_chunks, slice, tiled, sink);
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

// ---- 3. a layer's weights streamed between small-op chains, with a side-stream L2 prefetcher ---------------------

// read_rows_kernel's rows layout at D = 2 as a PDL kernel that publishes which weight of the sequence it is
// (`seq`, written once the kernel before has finished) for the prefetcher to follow.
__global__ void __launch_bounds__(kThreads) read_weight_kernel(const uint4* __restrict__ w, int64_t row_chunks,
                                                               int slice, uint4* sink, int* progress, int seq) {
    pdl_prologue();
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *reinterpret_cast<volatile int*>(progress) = seq;
    read_rows<2>(w, row_chunks, slice, false, sink);
}

struct WeightRange {
    const char* data;
    int64_t begin, end;  // byte offsets in the whole sequence
};

// The index of the weight the consumer has started (its published progress) once range r ends within `window` bytes
// of that weight's start, polled with a back-off so that the polling does not load the L2 slice that holds it; -1
// after ~1 s without it (a consumer that never comes).
__device__ int wait_within_window(const WeightRange* weights, const WeightRange& r, const int* progress,
                                  int64_t window) {
    const long long t0 = clock64();
    while (true) {
        const int j = *reinterpret_cast<const volatile int*>(progress);
        if (j >= 0 && r.end - weights[j].begin <= window) return j;
        if (clock64() - t0 > 2000000000LL) return -1;
        __nanosleep(256);
    }
}

// One persistent kernel on a stream of its own: weight k of the sequence is asked of the L2 (bulk prefetches of
// `chunk` bytes spread over all lanes) once the consumer has started a weight j with end(k) - begin(j) <= window.
// One thread a block polls the consumer's progress (wait_within_window).
__global__ void l2_prefetcher_kernel(const WeightRange* weights, int count, const int* progress, int64_t window,
                                     int64_t chunk) {
    const int lanes = gridDim.x * blockDim.x, lane = blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ int seen_j;
    int j = -1;
    for (int k = 0; k < count; ++k) {
        const WeightRange r = weights[k];
        if (j < 0 || r.end - weights[j].begin > window) {
            if (threadIdx.x == 0) seen_j = wait_within_window(weights, r, progress, window);
            __syncthreads();
            j = seen_j;
            __syncthreads();
            if (j < 0) return;
        }
        for (int64_t at = static_cast<int64_t>(lane) * chunk; at < r.end - r.begin;
             at += static_cast<int64_t>(lanes) * chunk) {
            const uint32_t bytes = static_cast<uint32_t>(min(chunk, r.end - r.begin - at));
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.data + at), "r"(bytes) : "memory");
        }
    }
}

void print_us(double us) {
    if (us < 0)
        std::printf(" %10s", "n/a");
    else
        std::printf(" %10.2f", us);
}

// The same schedule with real reads instead of prefetch hints (which the memory system may drop): one thread a
// block streams its share of weight k through kWarmSlots shared-memory slots of `chunk` bytes with bulk copies
// (cp.async.bulk, completion on an mbarrier a slot), discarding the bytes; the reads leave them in the L2.
constexpr int kWarmSlots = 4;
__global__ void l2_warm_kernel(const WeightRange* weights, int count, const int* progress, int64_t window,
                               int64_t chunk) {
    extern __shared__ __align__(128) uint8_t warm_buf[];  // [kWarmSlots, chunk]
    __shared__ __align__(8) uint64_t bars[kWarmSlots];
    if (threadIdx.x != 0) return;
    const uint32_t buf = static_cast<uint32_t>(__cvta_generic_to_shared(warm_buf));
    const uint32_t bar0 = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
    for (int i = 0; i < kWarmSlots; ++i) wgmma::mbar_init(bar0 + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    int64_t issued = 0;
    int j = -1;
    for (int k = 0; k < count; ++k) {
        const WeightRange r = weights[k];
        if (j < 0 || r.end - weights[j].begin > window) {
            j = wait_within_window(weights, r, progress, window);
            if (j < 0) return;
        }
        for (int64_t at = static_cast<int64_t>(blockIdx.x) * chunk; at < r.end - r.begin;
             at += static_cast<int64_t>(gridDim.x) * chunk, ++issued) {
            const int slot = static_cast<int>(issued % kWarmSlots);
            const uint32_t bar = bar0 + 8 * slot;
            if (issued >= kWarmSlots) wgmma::mbar_wait(bar, static_cast<uint32_t>((issued / kWarmSlots - 1) & 1));
            const uint32_t bytes = static_cast<uint32_t>(min(chunk, r.end - r.begin - at));
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    buf + slot * static_cast<uint32_t>(chunk)),
                "l"(r.data + at), "r"(bytes), "r"(bar)
                : "memory");
        }
    }
    for (int64_t n = issued > kWarmSlots ? issued - kWarmSlots : 0; n < issued; ++n)  // the last copies land
        wgmma::mbar_wait(bar0 + 8 * static_cast<int>(n % kWarmSlots), static_cast<uint32_t>((n / kWarmSlots) & 1));
}

// A layer of the 8-layer batch-1 step as its weight reads (rows of 8192 B: wq_a, wq_b, wkv, wo_a, wo_b, the router
// gate, the shared expert's three, the six routed experts' three: 200 MB), each read preceded by `gap` one-row
// RMSNorms (the small ops between two linears). Captured into one graph for all layers; `window` > 0 runs the L2
// prefetcher beside it. Returns us per sequence (best of 5 after a warm-up).
// warm_blocks > 0: l2_warm_kernel on that many blocks (chunk bytes a copy) instead of the prefetch hints.
double time_layers(const char* base, int layers, int gap, int64_t window, int64_t chunk, bool hot, int warm_blocks,
                   uint4* sink, float* a, float* b, const float* consts, cudaStream_t stream, cudaStream_t side) {
    const int64_t layer_rows[] = {512, 4096, 256, 4096, 4096, 256, 1024, 1024, 1024, 3072, 3072, 3072};
    constexpr int64_t kRowBytes = 8192, kRowChunks = kRowBytes / 16;
    std::vector<WeightRange> ranges;
    int64_t at = 0;
    for (int l = 0; l < layers; ++l)
        for (int64_t rows : layer_rows) {
            ranges.push_back({base + (hot ? 0 : at), at, at + rows * kRowBytes});  // hot: all in the first 32 MB
            at += rows * kRowBytes;
        }
    WeightRange* d_ranges = nullptr;
    int* progress = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&d_ranges, ranges.size() * sizeof(WeightRange)));
    DI_CUDA_CHECK(cudaMalloc(&progress, sizeof(int)));
    DI_CUDA_CHECK(cudaMemcpy(d_ranges, ranges.data(), ranges.size() * sizeof(WeightRange), cudaMemcpyHostToDevice));

    cudaGraph_t g = nullptr;
    cudaGraphExec_t exec = nullptr;
    DI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    int flip = 0;
    for (size_t k = 0; k < ranges.size(); ++k) {
        for (int i = 0; i < gap; ++i, flip ^= 1)
            launch_rms_norm(flip ? a : b, flip ? b : a, consts, 1, 4096, 1e-6f, false, stream);
        const int64_t rows = (ranges[k].end - ranges[k].begin) / kRowBytes, tiles = rows / kRows;
        int ranks = 1;
        while (ranks < 16 && ranks * tiles < 264) ranks *= 2;
        launch_pdl(read_weight_kernel, dim3(ranks, static_cast<unsigned>(tiles)), kThreads, 0, stream,
                   reinterpret_cast<const uint4*>(ranges[k].data), kRowChunks, static_cast<int>(kRowChunks / ranks),
                   sink, progress, static_cast<int>(k));
    }
    DI_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    DI_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    DI_CUDA_CHECK(cudaGraphDestroy(g));
    cudaEvent_t reset;
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&reset, cudaEventDisableTiming));
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {
        const double us = bench::mean_call_us(1, [&](int) {
            DI_CUDA_CHECK(cudaMemsetAsync(progress, 0xff, sizeof(int), stream));  // -1: nothing started
            if (window > 0) {
                DI_CUDA_CHECK(cudaEventRecord(reset, stream));
                DI_CUDA_CHECK(cudaStreamWaitEvent(side, reset));
                if (warm_blocks > 0)
                    l2_warm_kernel<<<warm_blocks, 32, kWarmSlots * chunk, side>>>(
                        d_ranges, static_cast<int>(ranges.size()), progress, window, chunk);
                else
                    l2_prefetcher_kernel<<<16, 32, 0, side>>>(d_ranges, static_cast<int>(ranges.size()), progress,
                                                              window, chunk);
                DI_CUDA_LAUNCH_CHECK();
            }
            DI_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        });
        DI_CUDA_CHECK(cudaDeviceSynchronize());
        if (rep > 0 && us < best) best = us;
    }
    DI_CUDA_CHECK(cudaEventDestroy(reset));
    DI_CUDA_CHECK(cudaGraphExecDestroy(exec));
    DI_CUDA_CHECK(cudaFree(d_ranges));
    DI_CUDA_CHECK(cudaFree(progress));
    return best;
}

int run(int n, bool chains_only) {
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
    std::printf("%-42s %10s %10s %10s\n", "kernel", "stream", "held", "graph");
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
        for (const Issue how : {Issue::kStream, Issue::kHeld, Issue::kGraph})
            print_us(time_chain(c.op, c.name, n, how, a, b, stream));
        std::printf("\n");
    }
    if (chains_only) {
        for (float* p : {a, b, consts}) DI_CUDA_CHECK(cudaFree(p));
        DI_CUDA_CHECK(cudaStreamDestroy(stream));
        return 0;
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

    {
        constexpr int kLayers = 8;
        char* base = nullptr;
        DI_CUDA_CHECK(cudaMalloc(&base, int64_t{8192} * 25600 * kLayers));
        DI_CUDA_CHECK(cudaMemset(base, 1, int64_t{8192} * 25600 * kLayers));
        cudaStream_t side;
        DI_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        const double floor_us = 8192.0 * 25600 * kLayers / 4.26e6;
        std::printf(
            "\n%d layers of batch-1 weight reads (12 a layer, 200 MB; floor %.1f us at 4.26 TB/s), each after `gap` "
            "one-row RMSNorms, one graph; us a sequence, with an L2 prefetcher on a side stream `window` MB ahead\n",
            kLayers, floor_us);
        {  // the prefetcher alone (everything allowed at once), and hot re-reads of one weight
            int* started = nullptr;
            WeightRange* all = nullptr;
            const WeightRange whole{base, 0, int64_t{8192} * 25600 * kLayers};
            DI_CUDA_CHECK(cudaMalloc(&started, sizeof(int)));
            DI_CUDA_CHECK(cudaMalloc(&all, sizeof(WeightRange)));
            DI_CUDA_CHECK(cudaMemset(started, 0, sizeof(int)));
            DI_CUDA_CHECK(cudaMemcpy(all, &whole, sizeof(WeightRange), cudaMemcpyHostToDevice));
            for (int blocks : {16, 132, 528}) {
                double best = 1e30;
                for (int rep = 0; rep < 4; ++rep) {
                    const double us = bench::mean_call_us(1, [&](int) {
                        l2_prefetcher_kernel<<<blocks, 32>>>(all, 1, started, int64_t{1} << 62, 16384);
                    });
                    if (us < best) best = us;
                }
                std::printf("prefetcher alone, %d blocks of 32: %.1f us for %.0f MB (%.0f GB/s)\n", blocks, best,
                            whole.end / 1e6, whole.end / (best * 1e3));
            }
            DI_CUDA_CHECK(cudaFree(started));
            DI_CUDA_CHECK(cudaFree(all));
            DI_CUDA_CHECK(
                cudaFuncSetAttribute(l2_warm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWarmSlots * 32768));
            for (int64_t rows : {int64_t{512}, int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
                const int64_t tiles = rows / kRows;
                int ranks = 1;
                while (ranks < 16 && ranks * tiles < 264) ranks *= 2;
                const std::vector<uint4*> hot{reinterpret_cast<uint4*>(base)};
                std::vector<uint4*> cold;
                for (int i = 0; i < 32; ++i) cold.push_back(reinterpret_cast<uint4*>(base) + i * rows * 512);
                // A read just after the whole buffer went through l2_warm_kernel (bulk copies) or the prefetch hints.
                WeightRange* one = nullptr;
                int* zero = nullptr;
                DI_CUDA_CHECK(cudaMalloc(&one, sizeof(WeightRange)));
                DI_CUDA_CHECK(cudaMalloc(&zero, sizeof(int)));
                DI_CUDA_CHECK(cudaMemset(zero, 0, sizeof(int)));
                const dim3 grid(ranks, static_cast<unsigned>(tiles));
                auto after = [&](bool warm) {
                    double sum = 0;
                    for (int i = 0; i < 8; ++i) {
                        const char* at = reinterpret_cast<const char*>(cold[i]);
                        const WeightRange r{at, 0, rows * 8192};
                        DI_CUDA_CHECK(cudaMemcpy(one, &r, sizeof r, cudaMemcpyHostToDevice));
                        DI_CUDA_CHECK(cudaDeviceSynchronize());
                        // Queued back to back, so that the timing starts when the warming ends.
                        if (warm)
                            l2_warm_kernel<<<132, 32, kWarmSlots * 16384>>>(one, 1, zero, int64_t{1} << 62, 16384);
                        else
                            l2_prefetcher_kernel<<<132, 32>>>(one, 1, zero, int64_t{1} << 62, 16384);
                        sum += bench::mean_call_us(1, [&](int) {
                            read_rows_kernel<2><<<grid, kThreads>>>(reinterpret_cast<const uint4*>(at), 512,
                                                                    static_cast<int>(512 / ranks), false, sink);
                        });
                    }
                    return sum / 8;
                };
                std::printf(
                    "read of %5.1f MB (%d ranks): L2-hot %.2f us, cold %.2f us, after bulk copies %.2f us, after "
                    "prefetch hints %.2f us\n",
                    rows * 8192 / 1e6, ranks, time_reads(read_rows_kernel<2>, hot, rows, 512, ranks, false, sink),
                    time_reads(read_rows_kernel<2>, cold, rows, 512, ranks, false, sink), after(true), after(false));
                DI_CUDA_CHECK(cudaFree(one));
                DI_CUDA_CHECK(cudaFree(zero));
            }
        }
        DI_CUDA_CHECK(
            cudaFuncSetAttribute(l2_warm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWarmSlots * 32768));
        std::printf("%-6s %10s %10s %10s %10s %10s %10s %10s %10s\n", "gap", "none", "hint 32MB", "all hot",
                    "warm 33x16K", "66x16K", "132x16K", "132x32K", "132x16K 48MB");
        for (int gap : {0, 2, 4, 8}) {
            std::printf("%-6d", gap);
            const struct {
                int64_t window_mb, chunk;
                bool hot;
                int warm;
            } cols[] = {{0, 0, false, 0},        {32, 16384, false, 0},  {0, 0, true, 0},
                        {32, 16384, false, 33},  {32, 16384, false, 66}, {32, 16384, false, 132},
                        {32, 32768, false, 132}, {48, 16384, false, 132}};
            for (const auto& c : cols)
                std::printf(" %10.1f", time_layers(base, kLayers, gap, c.window_mb << 20, c.chunk, c.hot, c.warm, sink,
                                                   a, b, consts, stream, side));
            std::printf("\n");
        }
        DI_CUDA_CHECK(cudaStreamDestroy(side));
        DI_CUDA_CHECK(cudaFree(base));
    }
    for (void* p : {static_cast<void*>(sink), static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(consts)})
        DI_CUDA_CHECK(cudaFree(p));
    DI_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

}  // namespace
}  // namespace deepinfer::cuda

int main(int argc, char** argv) {
    int n = 256;
    bool chains_only = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--kernels") == 0 && i + 1 < argc) {
            n = std::atoi(argv[++i]);
        } else if (std::strcmp(argv[i], "--chains-only") == 0) {
            chains_only = true;
        } else {
            std::fprintf(stderr, "usage: decode_chain_bench [--kernels N] [--chains-only]\n");
            return 2;
        }
    }
    try {
        return deepinfer::cuda::run(n < 2 ? 2 : n, chains_only);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "decode_chain_bench: %s\n", e.what());
        return 1;
    }
}
