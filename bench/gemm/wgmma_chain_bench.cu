// What a consumer warpgroup's per-stage chain costs the FP8 tensor cores (sm_90a): each warpgroup loops over "stages"
// of 4 wgmma.m64n128k32 e4m3 (k 128), committed and waited for, with the other parts of the FP8 experts kernel's chain
// (backend/cuda/experts_fp8.cu) switched in one by one: the mbarrier wait, the proxy fence, the FP4 -> e4m3 decode of
// the A fragments (shared-memory loads, a table lookup, byte permutes) and the promotion (the block accumulator times
// the tokens' scales into a second one). No global memory traffic: the operands are whatever shared memory holds.
// One CTA per SM, 1 or 2 warpgroups (4 at N = 64); also A from registers against A from shared memory, bf16 for
// scale, and the chains of the next designs (the decode beside the wgmmas, narrower tiles on more warpgroups).
//
//   wgmma_chain_bench [stages]      (default 20000 a warpgroup; run in pairs, so an even number)
//
// Prints TFLOP/s (at the e4m3 or bf16 FLOPs issued) and the time a stage takes.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/bf16_mma.cuh"
#include "backend/cuda/wgmma_common.cuh"

namespace {

using namespace deepinfer::cuda::wgmma;  // the kernels' wgmma forms, descriptor, fences and mbarrier wrappers

__device__ __forceinline__ void e4m3_ss(float (&d)[64], uint64_t a, uint64_t b, uint32_t scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS64
        "}, %64, %65, p, 1, 1;\n}\n"
        : DI_WGMMA_ACC64(d)
        : "l"(a), "l"(b), "r"(scale_d));
}
// The chain's parts, as bits of kParts. kOverlap: the decode of the next stage's A runs while this stage's wgmmas do
// (into a second set of A registers), as the pipelined consumer would.
constexpr int kMbarrier = 1, kFence = 2, kDecode = 4, kPromote = 8, kSharedA = 16, kBf16 = 32, kOverlap = 64;

// The FP4 -> e4m3 decode of experts_fp8.cu's consumers: 2 rows x 4 words of 8 codes into a lane's A fragments.
__device__ __forceinline__ void decode(const uint8_t* sm, const uint2* table, int warp, int g, int c, int s,
                                       uint32_t (&a)[4][4]) {
    const int r = (warp & 3) * 16 + g;
    for (int h = 0; h < 2; ++h) {
        const uint4 w = *reinterpret_cast<const uint4*>(sm + 24 * 1024 + (r + 8 * h) * 64 + c * 16);
        const uint2 t = table[(sm[32 * 1024 + (r + 8 * h) * 4 + c] + s) & 15];
        for (int k4 = 0; k4 < 4; ++k4)
            deepinfer::cuda::chunks::fp4_word_to_e4m3(word_of(w, k4), t, a[k4][h], a[k4][h + 2]);
    }
}

// N: tokens a wgmma (128, or 64 for up to 4 warpgroups).
template <int kParts, int N = 128>
__global__ void __launch_bounds__(N == 64 ? 512 : 256, 1) chain_kernel(float* sink, int stages) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    const uint32_t base = (raw + 1023) & ~1023u;
    uint8_t* sm = smem_raw + (base - raw);  // B at 0, A at 16 KB, FP4 bytes at 24 KB, scales at 32 KB, table at 40 KB
    const uint32_t bar = base + 48 * 1024;
    for (int i = threadIdx.x; i < 12 * 1024; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = i * 2654435761u;
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_arrive(bar);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    float block[N / 2], acc[N / 2];
    for (int i = 0; i < N / 2; ++i) block[i] = acc[i] = 0.0f, pin(block[i]);
    uint32_t a[4][4], a_next[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) a[i][j] = a_next[i][j] = threadIdx.x * (i + 3) * (j + 5);
    const uint64_t bd = b_desc(base), ad = b_desc(base + 16 * 1024);
    const uint2* table = reinterpret_cast<const uint2*>(sm + 40 * 1024);
    // One stage on A fragments `cur`; with kOverlap the next stage's are decoded into `nxt` beside the wgmmas (two
    // sets of registers taking turns, so that no copy merges them and no wgmma input is redefined in flight).
    const auto stage = [&](uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4], int s) {
        if (kParts & kMbarrier) {  // a completed barrier: the wait's own cost
            mbar_wait(bar, 0);
            __syncwarp();
        }
        if (kParts & kFence) fence_proxy_async();
        float2 xs[N / 8];
        if (kParts & kPromote)
            for (int j = 0; j < N / 8; ++j)
                xs[j] = *reinterpret_cast<const float2*>(sm + 36 * 1024 + 4 * (8 * j + 2 * c));
        if ((kParts & kDecode) && !(kParts & kOverlap))
            decode(sm, table, warp, g, c, s, cur);
        else if (!(kParts & kOverlap))
            cur[0][0] += 1;  // A redefined every stage, as a decode would
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) pin(cur[i][j]);
        wgmma_fence();
        for (int k4 = 0; k4 < 4; ++k4) {
            const uint32_t scale_d = (kParts & kPromote) ? (k4 > 0) : 1u;
            const uint32_t(&f)[4] = cur[k4];
            if constexpr (N == 64)
                Wgmma8<64>::mma(block, f[0], f[1], f[2], f[3], bd + 2 * k4, scale_d);
            else if (kParts & kBf16)  // never with the promotion: always accumulating
                Wgmma<128>::mma(block, f[0], f[1], f[2], f[3], bd + 2 * k4);
            else if (kParts & kSharedA)
                e4m3_ss(block, ad + 2 * k4, bd + 2 * k4, scale_d);
            else
                Wgmma8<128>::mma(block, f[0], f[1], f[2], f[3], bd + 2 * k4, scale_d);
        }
        wgmma_commit();
        if (kParts & kOverlap) decode(sm, table, warp, g, c, s + 1, nxt);
        wgmma_wait<0>();
        if (kParts & kPromote)
            for (int j = 0; j < N / 8; ++j) {
                acc[4 * j] = fmaf(block[4 * j], xs[j].x, acc[4 * j]);
                acc[4 * j + 1] = fmaf(block[4 * j + 1], xs[j].y, acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(block[4 * j + 2], xs[j].x, acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(block[4 * j + 3], xs[j].y, acc[4 * j + 3]);
            }
    };
    for (int s = 0; s + 1 < stages; s += 2) {
        stage(a, a_next, s);
        stage(a_next, a, s + 1);
    }
    float sum = 0.0f;
    for (int i = 0; i < N / 2; ++i) sum += block[i] + acc[i];
    if (sum == 12345.0f) sink[threadIdx.x] = sum;  // keeps the work
}

template <int kParts, int N = 128>
void run(const char* name, int warpgroups, int stages, float* sink, int sms) {
    constexpr int kSmem = 50 * 1024;
    cudaFuncSetAttribute(chain_kernel<kParts, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    chain_kernel<kParts, N><<<sms, 128 * warpgroups, kSmem>>>(sink, 16);  // warm-up
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    chain_kernel<kParts, N><<<sms, 128 * warpgroups, kSmem>>>(sink, stages);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double k = (kParts & kBf16) ? 16 : 32;
    const double flop = 2.0 * sms * warpgroups * stages * 4 * 64 * N * k;
    std::printf("%-48s N %3d, %d warpgroup(s): %6.0f TFLOP/s, %6.1f ns a stage  (%s)\n", name, N, warpgroups,
                flop / ms * 1e-9, ms * 1e6 / stages, cudaGetErrorString(cudaGetLastError()));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

}  // namespace

int main(int argc, char** argv) {
    const int stages = argc > 1 ? std::atoi(argv[1]) : 20000;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float* sink = nullptr;
    cudaMalloc(&sink, 4096);
    for (int wgs = 1; wgs <= 2; ++wgs) {
        run<0>("e4m3, A in registers", wgs, stages, sink, sms);
        run<kSharedA>("e4m3, A in shared memory", wgs, stages, sink, sms);
        run<kBf16>("bf16 (k16), A in registers", wgs, stages, sink, sms);
    }
    run<kFence>("+ proxy fence", 2, stages, sink, sms);
    run<kMbarrier>("+ mbarrier wait", 2, stages, sink, sms);
    run<kDecode>("+ FP4 decode into A", 2, stages, sink, sms);
    run<kPromote>("+ promotion", 2, stages, sink, sms);
    run<kDecode | kPromote>("+ decode, promotion", 2, stages, sink, sms);
    run<kMbarrier | kDecode | kPromote>("+ mbarrier, decode, promotion", 2, stages, sink, sms);
    run<kMbarrier | kFence | kDecode | kPromote>("+ all (experts_fp8.cu's chain)", 2, stages, sink, sms);
    run<kMbarrier | kFence | kDecode | kPromote>("+ all (experts_fp8.cu's chain)", 1, stages, sink, sms);
    // What the next designs would leave: the decode beside the wgmmas; narrower tiles on more warpgroups.
    constexpr int kAll = kMbarrier | kFence | kDecode | kPromote;
    run<kAll | kOverlap>("+ all, the decode beside the wgmmas", 2, stages, sink, sms);
    run<kAll | kOverlap>("+ all, the decode beside the wgmmas", 1, stages, sink, sms);
    for (int wgs = 2; wgs <= 4; wgs += 2) {
        run<kAll, 64>("+ all (N 64)", wgs, stages, sink, sms);
        run<kAll | kOverlap, 64>("+ all, the decode beside the wgmmas (N 64)", wgs, stages, sink, sms);
    }
    cudaFree(sink);
    return 0;
}
