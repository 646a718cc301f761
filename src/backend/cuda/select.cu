// The lightning indexer's top-k selection on the device, so a CSA layer needs no host round trip: one block
// per query row finds the k-th largest score by a 4-pass radix select over order-preserving 32-bit keys, then
// compacts the chosen entries in index order (ties at the threshold go to the lowest indices, as on the CPU).
#include <cub/block/block_scan.cuh>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kSelectThreads = 512;

// Float -> unsigned key with the same order: flip all bits of negatives, set the sign bit of non-negatives.
// As on the CPU, NaN ranks as -inf and -0 equals +0.
__device__ __forceinline__ uint32_t order_key(float f) {
    if (isnan(f)) f = -INFINITY;
    if (f == 0.0f) f = 0.0f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// scores [T, E]; row t picks min(k, limits[t]) of its first limits[t] entries and writes base + entry (bases[t]
// + entry when bases is given) to dst[starts[t] ...] in ascending entry order.
__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_kernel(int32_t* __restrict__ dst, const int32_t* __restrict__ starts,
                          const float* __restrict__ scores, int64_t entries, const int32_t* __restrict__ limits, int k,
                          int32_t base, const int32_t* __restrict__ bases) {
    pdl_prologue();  // see pdl.cuh
    using Scan = cub::BlockScan<int, kSelectThreads>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining, s_carry_eq, s_carry_out;

    const int64_t row = blockIdx.x;
    if (bases) base = bases[row];
    const int n = min(static_cast<int64_t>(limits[row]), entries);
    const int m = min(k, n);
    int32_t* out = dst + starts[row];
    const float* sr = scores + row * entries;
    if (m == 0) return;
    if (n <= k) {  // every visible entry
        for (int i = threadIdx.x; i < n; i += kSelectThreads) out[i] = base + i;
        return;
    }

    // Radix select, 8 bits a pass from the top: after the passes `prefix` is the m-th largest key and
    // `remaining` the number of entries equal to it that belong to the top m.
    uint32_t prefix = 0, mask = 0;
    int remaining = m;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kSelectThreads) hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += kSelectThreads) {
            const uint32_t key = order_key(sr[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
        }
        __syncthreads();
        // The bin holding the remaining-th largest key: bin b with above(b) < remaining <= above(b) + hist[b],
        // above(b) = the count in bins b+1 .. 255. One thread per bin, suffix counts by a block scan over the
        // bins in descending order (a serial walk of 256 bins by one thread took ~4 us a pass).
        {
            const int b = 255 - threadIdx.x;  // threads 0..255: bins 255..0
            const int count = threadIdx.x < 256 ? hist[b] : 0;
            int above, total;
            Scan(scan_storage).ExclusiveSum(count, above, total);
            if (threadIdx.x < 256 && above < remaining && remaining <= above + count) {
                s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
                s_remaining = remaining - above;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 0xffu << shift;
        __syncthreads();  // hist is reset next pass
    }

    // Compaction in index order: keys above the threshold, and the first `remaining` keys equal to it.
    if (threadIdx.x == 0) s_carry_eq = s_carry_out = 0;
    __syncthreads();
    for (int chunk = 0; chunk < n; chunk += kSelectThreads) {
        const int i = chunk + threadIdx.x;
        const uint32_t key = i < n ? order_key(sr[i]) : 0;
        const int eq = i < n && key == prefix;
        int eq_rank, eq_total;
        Scan(scan_storage).ExclusiveSum(eq, eq_rank, eq_total);
        __syncthreads();
        const int take = i < n && (key > prefix || (eq && s_carry_eq + eq_rank < remaining));
        int pos, taken;
        Scan(scan_storage).ExclusiveSum(take, pos, taken);
        if (take) out[s_carry_out + pos] = base + i;
        __syncthreads();
        if (threadIdx.x == 0) {
            s_carry_eq += eq_total;
            s_carry_out += taken;
        }
        __syncthreads();
    }
}

}  // namespace

void launch_indexer_select(int32_t* dst, const int32_t* starts, const float* scores, int64_t rows, int64_t entries,
                           const int32_t* limits, int k, int32_t base, cudaStream_t stream, const int32_t* bases) {
    if (rows == 0) return;
    launch_pdl(indexer_select_kernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream, dst, starts, scores, entries,
                                                                                      limits, k, base, bases);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
