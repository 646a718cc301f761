// Token selection on the device: greedy argmax and sampling per row, so a decode step downloads [R] ids instead
// of [R, vocab] logits.
#include <cooperative_groups.h>

#include <atomic>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "sample/philox_core.h"

namespace deepinfer::cuda {

namespace {

// A row of 129,280 logits walked by 256 threads one float at a time took 78 us (one load in flight per thread);
// 1024 threads with four float4 loads in flight read it in a few microseconds.
constexpr int kArgmaxThreads = 1024;

// The better of two (value, index) candidates: larger value, then lower index; index -1 is "none".
__device__ __forceinline__ void keep_better(float& v, int64_t& i, float ov, int64_t oi) {
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
        v = ov;
        i = oi;
    }
}

// Whether a row of `vocab` logits at `row` is read as float4s.
__device__ __forceinline__ bool vec_row(const float* row, int64_t vocab) {
    return vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
}

// The block's best (value, index) over row[begin, end) (kArgmaxThreads threads; begin a multiple of 4 when
// vec_row): the largest logit, the lowest index on ties, NaN entries skipped; index -1 when there is none. Every
// thread gets the result (it synchronizes the block).
__device__ void block_best(const float* row, int64_t begin, int64_t end, bool vec, float* best_value,
                           int64_t* best_index) {
    float v = 0.0f;
    int64_t idx = -1;
    if (vec) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        const int64_t n4 = end / 4;
        for (int64_t j0 = begin / 4 + threadIdx.x; j0 < n4; j0 += 4 * kArgmaxThreads) {
            float4 x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int64_t j = j0 + u * kArgmaxThreads;
                x[u] = j < n4 ? __ldg(row4 + j) : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int64_t i = 4 * (j0 + u * kArgmaxThreads);
                if (!isnan(x[u].x)) keep_better(v, idx, x[u].x, i);
                if (!isnan(x[u].y)) keep_better(v, idx, x[u].y, i + 1);
                if (!isnan(x[u].z)) keep_better(v, idx, x[u].z, i + 2);
                if (!isnan(x[u].w)) keep_better(v, idx, x[u].w, i + 3);
            }
        }
    } else {
        for (int64_t i = begin + threadIdx.x; i < end; i += kArgmaxThreads) {
            const float x = row[i];
            if (!isnan(x)) keep_better(v, idx, x, i);
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
        keep_better(v, idx, ov, oi);
    }
    __shared__ float sv[kArgmaxThreads / 32];
    __shared__ int64_t si[kArgmaxThreads / 32];
    if (threadIdx.x % 32 == 0) {
        sv[threadIdx.x / 32] = v;
        si[threadIdx.x / 32] = idx;
    }
    __syncthreads();
    for (int w = 0; w < kArgmaxThreads / 32; ++w) keep_better(v, idx, sv[w], si[w]);
    *best_value = v;
    *best_index = idx;
}

// The greedy token from a row's best (value, index): -1 where the host sampler reports an error (a NaN first logit,
// no logit above -inf).
__device__ __forceinline__ int64_t greedy_token(const float* row, float v, int64_t idx) {
    return !isnan(row[0]) && idx >= 0 && v > -INFINITY ? idx : -1;
}

// The greedy token of one row of logits, for the whole block: block_best over the row, then greedy_token.
// *top_value gets the largest logit. Every thread gets the result.
__device__ int64_t block_argmax(const float* row, int64_t vocab, float* top_value) {
    int64_t idx;
    block_best(row, 0, vocab, vec_row(row, vocab), top_value, &idx);
    return greedy_token(row, *top_value, idx);
}

// A cluster of kArgmaxCluster blocks per row of logits [rows, vocab] (grid (kArgmaxCluster, rows)): rank r takes
// the r-th of equal slices (whole float4s when vec_row) and rank 0 keeps the best of the ranks' results. One block
// read a 129,280-logit row in ~18 us at one SM's bandwidth (ncu, H200); the order of the candidates does not
// matter (keep_better is a total order), so the result is the one-block result.
constexpr int kArgmaxCluster = 8;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(int32_t* __restrict__ ids, const float* __restrict__ logits, int64_t vocab) {
    namespace cg = cooperative_groups;
    const float* row = logits + static_cast<int64_t>(blockIdx.y) * vocab;
    const bool vec = vec_row(row, vocab);
    const int64_t unit = vec ? 4 : 1, units = vocab / unit, per = (units + gridDim.x - 1) / gridDim.x;
    const int64_t begin = min(vocab, blockIdx.x * per * unit), end = min(vocab, begin + per * unit);
    float v;
    int64_t idx;
    block_best(row, begin, end, vec, &v, &idx);
    __shared__ float rank_value;
    __shared__ int64_t rank_index;
    if (threadIdx.x == 0) rank_value = v, rank_index = idx;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (unsigned q = 1; q < gridDim.x; ++q)
            keep_better(v, idx, *cluster.map_shared_rank(&rank_value, q), *cluster.map_shared_rank(&rank_index, q));
        ids[blockIdx.y] = static_cast<int32_t>(greedy_token(row, v, idx));
    }
    cluster.sync();  // the other ranks' shared memory stays until rank 0 has read it
}

// ---- Sampling (Backend::sample_rows), one block per row, the rules of sample_token() -------------------------
//
// The filters become thresholds on a rank key (larger logit = larger key, -0 = +0, so equal logits have equal
// keys and ties are broken by id as the host ranks them):
//  - top_k: the key tk of the k-th candidate by rank, and among the candidates with key tk the id of the
//    (k - #{key > tk})-th in id order, tk_cut;
//  - top_p: over what top_k keeps, the key tp of the candidate whose inclusive prefix mass (in rank order) first
//    reaches top_p of the total, and among key-tp ties the id where it does, tp_cut.
// Each key is found bit by bit (the largest key whose "mass of keys >= it" still reaches the target): 32 passes,
// each a predicated sum per item, over the row (coalesced loads; it stays in L2) or, usually, over the few tokens
// near the top that the filters can keep, compacted into shared memory (see sample_rows_kernel). Walks in id
// order (ties, the draw) give each thread a contiguous run of items: its sequential sum, then a block scan.
// Weights are summed in double in an order fixed by the thread layout, so a row's draw is repeatable.
// H200: 157 us for one row of 129,280 logits (top_p 0.9, a peaked row), 190 us for 128 rows.
constexpr int kSampleThreads = kArgmaxThreads, kSampleWarps = kSampleThreads / 32;

__device__ __forceinline__ uint32_t rank_key(float x) {
    const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Block-wide sum, the same value to every thread, in a fixed order. scratch: kSampleWarps doubles.
__device__ double block_sum(double v, double* scratch) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();  // scratch free from any earlier use
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0;
    for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
    return total;
}

// Exclusive prefix of v over threads in thread order (fixed order); *total gets the sum. scratch: kSampleWarps.
__device__ double block_exclusive_scan(double v, double* scratch, double* total) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double incl = v;
    for (int off = 1; off < 32; off *= 2) {
        const double o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    double before = 0, all = 0;
    for (int w = 0; w < kSampleWarps; ++w) {
        if (w < warp) before += scratch[w];
        all += scratch[w];
    }
    *total = all;
    return before + incl - v;
}

// The lowest thread index for which pred holds, or kSampleThreads; the same to every thread.
__device__ int block_first(bool pred, int* scratch) {
    const unsigned ballot = __ballot_sync(0xffffffffu, pred);
    __syncthreads();
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = ballot ? (threadIdx.x & ~31) + __ffs(ballot) - 1 : kSampleThreads;
    __syncthreads();
    int first = kSampleThreads;
    for (int w = 0; w < kSampleWarps; ++w) first = min(first, scratch[w]);
    return first;
}

struct SampleScratch {
    double sums[kSampleWarps];
    int ints[kSampleWarps];
};

// The tokens a row's selection works over, as (id, logit) items in id order: the whole row of logits, or the
// items compacted into shared memory (ids < 2^31).
struct FullRow {
    const float* row;
    int64_t n;
    __device__ int64_t id(int64_t j) const { return j; }
    __device__ float logit(int64_t j) const { return __ldg(row + j); }
    // f(id, logit) for every item, the block's loads coalesced (float4 where aligned), each thread in a fixed order.
    template <typename F>
    __device__ void strided(F f) const {
        if (n % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
            const float4* row4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
            for (int64_t j = threadIdx.x; j < n / 4; j += kSampleThreads) {
                const float4 x = __ldg(row4 + j);
                f(4 * j, x.x);
                f(4 * j + 1, x.y);
                f(4 * j + 2, x.z);
                f(4 * j + 3, x.w);
            }
        } else {
            for (int64_t j = threadIdx.x; j < n; j += kSampleThreads) f(j, __ldg(row + j));
        }
    }
};
struct CompactItems {
    const int* ids;
    const float* logits;
    int64_t n;
    __device__ int64_t id(int64_t j) const { return ids[j]; }
    __device__ float logit(int64_t j) const { return logits[j]; }
    template <typename F>
    __device__ void strided(F f) const {
        for (int64_t j = threadIdx.x; j < n; j += kSampleThreads) f(ids[j], logits[j]);
    }
};

// This thread's contiguous run of items [j0, j1) for walks in id order.
__device__ __forceinline__ void thread_run(int64_t n, int64_t* j0, int64_t* j1) {
    const int64_t seg = (n + kSampleThreads - 1) / kSampleThreads;
    *j0 = min(n, static_cast<int64_t>(threadIdx.x) * seg);
    *j1 = min(n, *j0 + seg);
}

// The block-wide sum of weight(id, logit) over the items, in a fixed order.
template <typename Items, typename W>
__device__ double items_sum(const Items& it, W weight, SampleScratch& sh) {
    double s = 0;
    it.strided([&](int64_t i, float l) { s += weight(i, l); });
    return block_sum(s, sh.sums);
}

// The id where, walking the items in id order from `base`, the running sum of weight(id, logit) first reaches
// `target` (acc >= target; acc > target when strict), or -1 if it never does. Weights are >= 0; items of weight
// 0 are never the answer.
template <typename Items, typename W>
__device__ int64_t first_reaching(const Items& it, W weight, double base, double target, bool strict,
                                  SampleScratch& sh) {
    int64_t j0, j1;
    thread_run(it.n, &j0, &j1);
    double seg = 0;
    for (int64_t j = j0; j < j1; ++j) seg += weight(it.id(j), it.logit(j));
    double total;
    const double before = base + block_exclusive_scan(seg, sh.sums, &total);
    const double after = before + seg;
    const bool crosses = seg > 0 && (strict ? after > target : after >= target);
    const int owner = block_first(crosses, sh.ints);
    if (owner == kSampleThreads) return -1;
    __shared__ int64_t found;
    if (static_cast<int>(threadIdx.x) == owner) {
        double acc = before;
        int64_t last = -1;
        found = -1;
        for (int64_t j = j0; j < j1 && found < 0; ++j) {
            const double w = weight(it.id(j), it.logit(j));
            if (w <= 0) continue;
            acc += w;
            last = it.id(j);
            if (strict ? acc > target : acc >= target) found = last;
        }
        if (found < 0) found = last;  // the walk's own rounding fell short of the block sum's
    }
    __syncthreads();
    const int64_t id = found;
    __syncthreads();
    return id;
}

// The largest key kv such that the sum of weight(id, logit) over keys >= kv reaches target (kv is then the key
// of the element where a rank-order walk reaches it), or 0 when none does; *above gets the sum over keys > kv.
template <typename Items, typename W>
__device__ uint32_t largest_key_reaching(const Items& it, W weight, double target, SampleScratch& sh,
                                         double* above) {
    uint32_t kv = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const uint32_t trial = kv | (1u << bit);
        if (items_sum(it, [&](int64_t i, float l) { return rank_key(l) >= trial ? weight(i, l) : 0.0; }, sh) >=
            target)
            kv = trial;
    }
    *above = items_sum(it, [&](int64_t i, float l) { return rank_key(l) > kv ? weight(i, l) : 0.0; }, sh);
    return kv;
}

struct RowChoice {
    float mx, inv_t, min_logit;  // the largest logit, 1 / temperature, min_p's floor (-inf without)
    int top_k;                   // 0: off
    float top_p;
    uint64_t seed, token_index;
    double p_total;  // top_p's total mass when the items hold only part of the candidates, else < 0 (sum them)
};

// sample_token()'s filters and draw over items that hold every token the filters can keep (the candidates are
// the items with logit > -inf and >= min_logit). Returns the id, or -1 when no item is a candidate.
template <typename Items>
__device__ int64_t choose(const Items& it, const RowChoice& o, SampleScratch& sh) {
    const float mx = o.mx, inv_t = o.inv_t, min_logit = o.min_logit;
    auto candidate = [=](float l) { return l > -INFINITY && l >= min_logit; };
    auto ones = [=](int64_t, float l) { return candidate(l) ? 1.0 : 0.0; };
    const double count = items_sum(it, ones, sh);
    if (count == 0) return -1;

    // top_k
    const bool use_k = o.top_k > 0 && o.top_k < count;
    uint32_t tk = 0;
    int64_t tk_cut = INT64_MAX;
    if (use_k) {
        double above;
        tk = largest_key_reaching(it, ones, o.top_k, sh, &above);
        tk_cut = first_reaching(
            it, [=](int64_t, float l) { return candidate(l) && rank_key(l) == tk ? 1.0 : 0.0; }, above, o.top_k,
            false, sh);
    }
    auto weight_k = [=](int64_t i, float l) {
        if (!candidate(l)) return 0.0;
        const uint32_t k = rank_key(l);
        const bool kept = !use_k || k > tk || (k == tk && i <= tk_cut);
        return kept ? static_cast<double>(expf((l - mx) * inv_t)) : 0.0;
    };

    // top_p
    const bool use_p = o.top_p < 1.0f;
    uint32_t tp = 0;
    int64_t tp_cut = INT64_MAX;
    if (use_p) {
        const double need = static_cast<double>(o.top_p) * (o.p_total >= 0 ? o.p_total : items_sum(it, weight_k, sh));
        double above;
        tp = largest_key_reaching(it, weight_k, need, sh, &above);
        tp_cut = first_reaching(
            it, [=](int64_t i, float l) { return rank_key(l) == tp ? weight_k(i, l) : 0.0; }, above, need, false, sh);
        if (tp_cut < 0) tp = 0, tp_cut = INT64_MAX;  // rounding: the mass never reached need, keep everything
    }
    auto weight = [=](int64_t i, float l) {
        const double w = weight_k(i, l);
        if (!use_p || w == 0) return w;
        const uint32_t k = rank_key(l);
        return k > tp || (k == tp && i <= tp_cut) ? w : 0.0;
    };

    // The draw: u in [0, sum) over the kept tokens in id order.
    const double sum = items_sum(it, weight, sh);
    const double u = static_cast<double>(philox_core::uniform24(o.seed, 0, o.token_index)) * sum;
    const int64_t id = first_reaching(it, weight, 0.0, u, true, sh);
    if (id >= 0) return id;
    // u at the very end by rounding: the last kept token, as the host's walk ends.
    int64_t last = -1;
    it.strided([&](int64_t i, float l) {
        if (weight(i, l) > 0) last = max(last, i);
    });
    __shared__ int best;
    if (threadIdx.x == 0) best = -1;
    __syncthreads();
    if (last >= 0) atomicMax(&best, static_cast<int>(last));
    __syncthreads();
    return best;
}

// Compaction: the filters keep only tokens within some distance of the largest logit, and a trained model's
// row has few of those, so the 32-pass searches run over them in shared memory instead of over the row. One pass
// counts the candidates (and sums their weights) above each of kBounds logit floors mx - T * 2^(j - 1); the
// chosen floor is the highest one that provably holds every token the filters keep:
//  - top_k: the k largest candidates, so any floor with >= k candidates above it;
//  - top_p alone: the rank-order prefix whose mass first reaches need, so any floor whose mass above it
//    reaches need (with a margin for the order of the sums);
//  - neither: every candidate (min_p alone may leave few).
// When that many items fit, they are copied (in id order) and chosen from; else the whole row is.
constexpr int kBounds = 6;  // floors 0.5 .. 16 nats below the top
constexpr int kCompactCap = 16384;  // (id, logit) pairs: 128 KB of dynamic shared memory

__global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(int32_t* __restrict__ ids, const float* __restrict__ logits, int64_t vocab,
                       const SampleRowDesc* __restrict__ rows) {
    const FullRow row{logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab};
    const SampleRowDesc o = rows[blockIdx.x];
    __shared__ SampleScratch sh;
    extern __shared__ int compact_ids[];  // [kCompactCap] ids, then [kCompactCap] logits

    // The greedy token, as argmax_rows_kernel picks it.
    float v;
    const int64_t top = block_argmax(row.row, vocab, &v);
    if (top < 0) {
        if (threadIdx.x == 0) ids[blockIdx.x] = -1;
        return;
    }
    if (o.temperature == 0.0f) {
        if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(top);
        return;
    }
    RowChoice rc{v, 1.0f / o.temperature, v + o.min_p_offset, o.top_k, o.top_p, o.seed, o.token_index, -1.0};

    // Candidates (and their weights) above each floor; j = kBounds: all of them.
    int counted[kBounds + 1] = {};
    double count[kBounds + 1], mass[kBounds + 1] = {};
    row.strided([&](int64_t, float l) {
        if (!(l > -INFINITY && l >= rc.min_logit)) return;
        const float nats = (rc.mx - l) * rc.inv_t;  // >= 0
        const double w = expf((l - rc.mx) * rc.inv_t);
#pragma unroll
        for (int j = 0; j <= kBounds; ++j)
            if (j == kBounds || nats <= 0.5f * static_cast<float>(1 << j)) counted[j] += 1, mass[j] += w;
    });
#pragma unroll
    for (int j = 0; j <= kBounds; ++j) {
        count[j] = block_sum(counted[j], sh.sums);
        mass[j] = block_sum(mass[j], sh.sums);
    }
    const bool use_k = rc.top_k > 0 && rc.top_k < count[kBounds], use_p = rc.top_p < 1.0f;
    const double need = static_cast<double>(rc.top_p) * mass[kBounds] * (1.0 + 1e-9);
    int bound = kBounds;
    for (int j = kBounds - 1; j >= 0; --j) {
        const bool holds = use_k ? count[j] >= rc.top_k : use_p ? mass[j] >= need : false;
        if (holds) bound = j;
    }
    int64_t id;
    if (count[bound] <= kCompactCap) {
        const float floor_nats = bound == kBounds ? INFINITY : 0.5f * static_cast<float>(1 << bound);
        auto inside = [&](float l) {
            return l > -INFINITY && l >= rc.min_logit && (rc.mx - l) * rc.inv_t <= floor_nats;
        };
        int64_t j0, j1;
        thread_run(vocab, &j0, &j1);
        double mine = 0;
        for (int64_t i = j0; i < j1; ++i) mine += inside(row.logit(i)) ? 1.0 : 0.0;
        double total;
        int64_t at = static_cast<int64_t>(block_exclusive_scan(mine, sh.sums, &total));
        float* compact_logits = reinterpret_cast<float*>(compact_ids + kCompactCap);
        for (int64_t i = j0; i < j1; ++i) {
            const float l = row.logit(i);
            // The counting pass's predicate, so total <= kCompactCap; the check only guards shared memory.
            if (inside(l) && at < kCompactCap) compact_ids[at] = static_cast<int>(i), compact_logits[at++] = l;
        }
        total = min(total, static_cast<double>(kCompactCap));
        __syncthreads();
        if (!use_k && bound < kBounds) rc.p_total = mass[kBounds];  // top_p over every candidate, not the items
        id = choose(CompactItems{compact_ids, compact_logits, static_cast<int64_t>(total)}, rc, sh);
    } else {
        id = choose(row, rc, sh);
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = static_cast<int32_t>(id >= 0 ? id : top);
}

}  // namespace

void launch_sample_rows(int32_t* ids, const float* logits, int64_t rows, int64_t vocab, const SampleRowDesc* params,
                        cudaStream_t stream) {
    if (rows == 0) return;
    constexpr int smem = kCompactCap * 8;
    static std::atomic<uint64_t> configured{0};
    allow_smem(sample_rows_kernel, smem, configured);
    sample_rows_kernel<<<static_cast<unsigned>(rows), kSampleThreads, smem, stream>>>(ids, logits, vocab, params);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_argmax_rows(int32_t* ids, const float* logits, int64_t rows, int64_t vocab, cudaStream_t stream) {
    if (rows == 0) return;
    DI_CHECK(rows <= 65535, "argmax_rows: ", rows, " rows");
    launch_clustered(argmax_rows_kernel, dim3(kArgmaxCluster, static_cast<unsigned>(rows)), kArgmaxCluster,
                     kArgmaxThreads, 0, stream, ids, logits, vocab);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
