// Sparse attention and lightning-indexer micro-benchmark at DeepSeek-V4-Flash shapes (64 heads x 512 shared
// K=V; indexer 64 heads x 128), decode (1..128 query rows, 128 window keys + 512 selected entries per row) and
// a 2048-token prefill. Timed with CUDA events over back-to-back launches; the inputs stay in the 50 MB L2, as
// they do in the model, where gather_rows has just written the key table. Prints us per call, GB/s of the bytes
// the op must move (queries, distinct keys, indices, outputs), TFLOP/s (a multiply-add is 2), and a reference
// with the speedup over it and the relative difference of the outputs:
//  - sparse_attention fp32: the SIMT kernel of DEEPINFER_CUDA_GEMM=tiled, against the kernel it replaced (kept
//    below as the baseline);
//  - sparse_attention tc: the tensor-core kernel of the bf16 modes (its own choice of key staging), then with
//    the other staging forced ("tc gather": fp32 keys gathered per tile; "tc table": a bf16 copy of the table
//    first), each against the fp32 kernel (the difference is the bf16 rounding, ~3e-3); at prefill "tc" is the
//    wgmma kernel (attention_wgmma.cu) and "tc mma.sync" the mma.sync one it replaces there, and a line compares
//    the two outputs; "rotary" is the model's call there (the queries normed and rotated and the output
//    rotated back inside the wgmma kernel) against the norm, RoPE, attention and inverse RoPE as four kernels
//    (the reference column; the difference of the two outputs, 0 when bitwise); "T=16384 prefill"
//    is one CSA layer of an 8 x 2048 prefill as one sequence;
//  - indexer_scores fp32: the SIMT kernel of DEEPINFER_CUDA_GEMM=tiled, against a naive one (below); "indexer_scores
//    tc": the tensor-core kernel the bf16 modes run, against the fp32 kernel (the difference is the bf16 rounding
//    of q and keys, ~3e-3 of the largest score). The decode shapes score T rows against one sequence's entries;
//    "rows" is indexer_scores_rows at a prefill of 8 sequences x 2048 rows with 512 entries each (its 537 MB of
//    queries come from HBM; no naive reference).
//   attention_bench [--iters N] [--no-baseline]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "common/event_timing.cuh"

namespace deepinfer::cuda {
namespace baseline {

constexpr int kAttnThreads = 128;
constexpr int kMaxPerThread = 8;

// One block per (query row, head), two block-wide reductions per key.
__global__ void __launch_bounds__(kAttnThreads)
    sparse_attention_kernel(float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ keys,
                            const int32_t* __restrict__ offsets, const int32_t* __restrict__ indices,
                            const float* __restrict__ sinks, int64_t heads, int64_t d, float scale) {
    const int64_t th = blockIdx.x, r = th / heads, h = th % heads;
    const float* qv = q + th * d;
    float qreg[kMaxPerThread], acc[kMaxPerThread];
    int count = 0;
    for (int64_t c = threadIdx.x; c < d; c += kAttnThreads) {
        qreg[count] = qv[c];
        acc[count] = 0;
        ++count;
    }
    float m = -INFINITY, denom = 0;
    for (int32_t i = offsets[r]; i < offsets[r + 1]; ++i) {
        const float* kv = keys + static_cast<int64_t>(indices[i]) * d;
        float dot = 0;
        for (int j = 0; j < count; ++j) dot += qreg[j] * kv[threadIdx.x + j * kAttnThreads];
        const float s = block_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float rescale = expf(m - m_new), p = expf(s - m_new);
        denom = denom * rescale + p;
        for (int j = 0; j < count; ++j) acc[j] = acc[j] * rescale + p * kv[threadIdx.x + j * kAttnThreads];
        m = m_new;
    }
    const float sink = sinks[h];
    const float m_final = fmaxf(m, sink);
    const float rescale = expf(m - m_final);
    denom = denom * rescale + expf(sink - m_final);
    float* ov = out + th * d;
    for (int j = 0; j < count; ++j) ov[threadIdx.x + j * kAttnThreads] = acc[j] * rescale / denom;
}

// One thread per (row, entry).
__global__ void indexer_scores_kernel(float* __restrict__ scores, const float* __restrict__ q,
                                      const float* __restrict__ keys, const float* __restrict__ weights, int64_t rows,
                                      int64_t heads, int64_t c, int64_t entries, float scale) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * entries) return;
    const int64_t r = i / entries, e = i % entries;
    const float* kv = keys + e * c;
    float acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
        const float* qv = q + (r * heads + h) * c;
        float dot = 0;
        for (int64_t k = 0; k < c; ++k) dot += qv[k] * kv[k];
        acc += fmaxf(dot, 0.0f) * scale * weights[r * heads + h];
    }
    scores[i] = acc;
}

}  // namespace baseline

namespace {

#define CHECK(expr)                                                                                       \
    do {                                                                                                  \
        cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            std::exit(1);                                                                                 \
        }                                                                                                 \
    } while (0)

constexpr int kHeads = 64, kHeadDim = 512, kWindow = 128, kTopK = 512, kRopeDim = 64;
constexpr int kIndexHeads = 64, kIndexDim = 128;

// A device buffer of n values uniform in [-a, a].
float* random_device(int64_t n, float a, uint32_t seed) {
    std::vector<float> h(static_cast<size_t>(n));
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (float& x : h) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = a * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
    }
    float* p = nullptr;
    CHECK(cudaMalloc(&p, std::max<int64_t>(n, 1) * 4));
    CHECK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
    return p;
}

template <class T>
T* to_device(const std::vector<T>& v) {
    T* p = nullptr;
    CHECK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
    CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

// Mean us per call over `iters` calls after 3 warm-up calls; iters shrinks so slow kernels take ~0.5 s.
double time_us(const std::function<void()>& call, int iters) {
    for (int i = 0; i < 3; ++i) call();
    auto each = [&](int) { call(); };
    const double once = deepinfer::bench::mean_call_us(1, each);
    iters = std::max(1, std::min(iters, static_cast<int>(500e3 / std::max(once, 1.0))));
    const double us = deepinfer::bench::mean_call_us(iters, each);
    CHECK(cudaGetLastError());
    return us;
}

double max_rel_diff(const float* a_dev, const float* b_dev, int64_t n) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    CHECK(cudaMemcpy(a.data(), a_dev, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), b_dev, n * 4, cudaMemcpyDeviceToHost));
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
    }
    return ref > 0 ? diff / ref : diff;
}

struct Options {
    int iters = 100;
    bool baseline = true;
};

void report(const char* op, const char* shape, double us, double bytes, double flops, const Options& o,
            const std::function<void()>& old_call, const std::function<double()>& diff) {
    std::printf("%-24s %-26s %9.2f %8.0f %8.1f", op, shape, us, bytes / us / 1e3, flops / us / 1e6);
    if (o.baseline) {
        const double old_us = time_us(old_call, std::max(1, o.iters / 4));
        std::printf(" %10.1f %8.1fx %9.1e", old_us, old_us / us, diff());
    }
    std::printf("\n");
}
// A line against a reference already timed (ref_us).
void report_vs(const char* op, const char* shape, double us, double bytes, double flops, double ref_us, double diff) {
    std::printf("%-24s %-26s %9.2f %8.0f %8.1f %10.1f %8.1fx %9.1e\n", op, shape, us, bytes / us / 1e3,
                flops / us / 1e6, ref_us, ref_us / us, diff);
}

// Query rows t < rows, each with a list of key rows: decode (its own 128 window rows, then 512 distinct
// entries of `entries`) or prefill (position t's sliding window and every entry visible to it, one per 4
// positions, at most 512: a 2048-token prompt sees them all).
void bench_attention(int rows, bool prefill, const Options& o) {
    const int entries = prefill ? rows / 4 : 1024;
    const int64_t window_rows = prefill ? rows : static_cast<int64_t>(rows) * kWindow;
    const int64_t nkeys = window_rows + entries;
    std::vector<int32_t> offsets = {0}, indices, order(entries);
    std::mt19937 rng(rows);
    for (int t = 0; t < rows; ++t) {
        if (prefill) {
            for (int k = std::max(0, t - kWindow + 1); k <= t; ++k) indices.push_back(k);
            for (int e = 0; e < std::min((t + 1) / 4, kTopK); ++e) indices.push_back(static_cast<int32_t>(rows + e));
        } else {
            for (int k = 0; k < kWindow; ++k) indices.push_back(t * kWindow + k);
            for (int e = 0; e < entries; ++e) order[e] = e;
            std::shuffle(order.begin(), order.end(), rng);
            for (int e = 0; e < kTopK; ++e) indices.push_back(static_cast<int32_t>(window_rows + order[e]));
        }
        offsets.push_back(static_cast<int32_t>(indices.size()));
    }
    std::vector<char> used(static_cast<size_t>(nkeys), 0);
    for (int32_t i : indices) used[i] = 1;
    const int64_t distinct = std::count(used.begin(), used.end(), 1), pairs = static_cast<int64_t>(indices.size());
    const int64_t qn = static_cast<int64_t>(rows) * kHeads * kHeadDim;
    float* q = random_device(qn, 1.0f, 1);
    float* keys = random_device(nkeys * kHeadDim, 1.0f, 2);
    float* sinks = random_device(kHeads, 1.0f, 3);
    float *out = nullptr, *out_old = nullptr, *out_tc = nullptr;
    CHECK(cudaMalloc(&out, qn * 4));
    CHECK(cudaMalloc(&out_old, qn * 4));
    CHECK(cudaMalloc(&out_tc, qn * 4));
    int32_t* off_d = to_device(offsets);
    int32_t* idx_d = to_device(indices);
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

    const double bytes = 4.0 * (2 * qn + distinct * kHeadDim + pairs + rows + 1 + kHeads);
    const double flops = 4.0 * kHeads * kHeadDim * pairs;  // Q K^T and P V
    const double us = time_us([&] {
        launch_sparse_attention(out, q, keys, off_d, idx_d, sinks, rows, kHeads, kHeadDim, scale, false, nullptr);
    }, o.iters);
    char shape[64];
    std::snprintf(shape, sizeof shape, "T=%d %s %.0f keys/row", rows, prefill ? "prefill" : "decode",
                  static_cast<double>(pairs) / rows);
    auto old_call = [&] {
        baseline::sparse_attention_kernel<<<rows * kHeads, baseline::kAttnThreads>>>(out_old, q, keys, off_d, idx_d,
                                                                                     sinks, kHeads, kHeadDim, scale);
    };
    report("sparse_attention fp32", shape, us, bytes, flops, o, old_call,
           [&] { return max_rel_diff(out, out_old, qn); });
    // The tensor-core kernel: its own choice of key staging, then the other one.
    auto tc_call = [&](AttnKeyStaging staging) {
        return [&, staging] {
            launch_sparse_attention_tc(out_tc, q, keys, nkeys, off_d, idx_d, sinks, rows, kHeads, kHeadDim, scale,
                                       false, nullptr, staging);
        };
    };
    const bool table = sparse_attention_tc_copies_table(nkeys, rows);
    struct Variant {
        const char* name;
        AttnKeyStaging staging;
        bool wgmma;  // false: DEEPINFER_CUDA_ATTN_WGMMA=0 (the mma.sync kernel where the wgmma one would apply)
    };
    std::vector<Variant> variants = {{"sparse_attention tc", AttnKeyStaging::kAuto, true},
                                     {table ? "sparse_attention tc gather" : "sparse_attention tc table",
                                      table ? AttnKeyStaging::kGather : AttnKeyStaging::kTable, true}};
    if (table) variants.push_back({"sparse_attention tc mma.sync", AttnKeyStaging::kTable, false});
    for (const Variant& v : variants) {
        if (!v.wgmma) setenv("DEEPINFER_CUDA_ATTN_WGMMA", "0", 1);
        const double tc_us = time_us(tc_call(v.staging), o.iters);
        report_vs(v.name, shape, tc_us, bytes, flops, us, max_rel_diff(out_tc, out, qn));
        unsetenv("DEEPINFER_CUDA_ATTN_WGMMA");
    }
    if (table) {  // the wgmma kernel (kAuto) against the mma.sync one on the same bf16 inputs
        float* out_mma = nullptr;
        int32_t* pos_d = nullptr;
        float* freq_d = nullptr;
        CHECK(cudaMalloc(&out_mma, qn * 4));
        setenv("DEEPINFER_CUDA_ATTN_WGMMA", "0", 1);
        tc_call(AttnKeyStaging::kTable)();
        unsetenv("DEEPINFER_CUDA_ATTN_WGMMA");
        CHECK(cudaMemcpy(out_mma, out_tc, qn * 4, cudaMemcpyDeviceToDevice));
        tc_call(AttnKeyStaging::kAuto)();
        CHECK(cudaDeviceSynchronize());
        std::printf("%-24s %-28s wgmma against mma.sync: max rel diff %.2e\n", "sparse_attention tc", shape,
                    max_rel_diff(out_tc, out_mma, qn));
        // The model's call (Backend::rotary_attention_rows), where the wgmma kernel takes it: the queries' per-head
        // RMSNorm and RoPE and the output's inverse RoPE inside the kernel, against the three ops around it (the
        // queries normed in place each call: RMSNorm and RoPE leave their scale, so the timing holds), and the
        // two outputs from the same queries compared.
        std::vector<int32_t> positions(static_cast<size_t>(rows));
        for (int t = 0; t < rows; ++t) positions[t] = t;
        std::vector<float> inv_freq(kRopeDim / 2);
        for (int i = 0; i < kRopeDim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / kRopeDim);
        pos_d = to_device(positions);
        freq_d = to_device(inv_freq);
        if (sparse_attention_wgmma_applies(rows, kHeads, kHeadDim, false, true, q, out_tc) &&
            sparse_attention_wgmma_takes_rope(kRopeDim)) {
            const AttnRope rope{pos_d, freq_d, kRopeDim, 1.0f, 1e-6f};
            auto fused = [&] {
                launch_sparse_attention_tc(out_tc, q, keys, nkeys, off_d, idx_d, sinks, rows, kHeads, kHeadDim, scale,
                                           false, nullptr, AttnKeyStaging::kTable, nullptr, &rope);
            };
            auto apart = [&] {
                launch_rms_norm(q, q, nullptr, static_cast<int64_t>(rows) * kHeads, kHeadDim, 1e-6f, false, nullptr);
                launch_rope(q, pos_d, freq_d, rows, kHeads, kHeadDim, kRopeDim, 1.0f, false, nullptr);
                tc_call(AttnKeyStaging::kTable)();
                launch_rope(out_tc, pos_d, freq_d, rows, kHeads, kHeadDim, kRopeDim, 1.0f, true, nullptr);
            };
            CHECK(cudaMemcpy(out_mma, q, qn * 4, cudaMemcpyDeviceToDevice));  // the queries as drawn
            fused();
            CHECK(cudaMemcpy(out, out_tc, qn * 4, cudaMemcpyDeviceToDevice));
            apart();
            const double diff = max_rel_diff(out, out_tc, qn);
            CHECK(cudaMemcpy(q, out_mma, qn * 4, cudaMemcpyDeviceToDevice));
            const double apart_us = time_us(apart, o.iters), fused_us = time_us(fused, o.iters);
            report_vs("sparse_attention rotary", shape, fused_us, bytes, flops, apart_us, diff);
        }
        CHECK(cudaFree(out_mma));
        CHECK(cudaFree(pos_d));
        CHECK(cudaFree(freq_d));
    }
    for (void* p : {static_cast<void*>(q), static_cast<void*>(keys), static_cast<void*>(sinks),
                    static_cast<void*>(out), static_cast<void*>(out_old), static_cast<void*>(out_tc),
                    static_cast<void*>(off_d), static_cast<void*>(idx_d)})
        CHECK(cudaFree(p));
}

// `seqs` sequences of `rows` query rows each, scoring their sequence's `entries` keys: one sequence through
// indexer_scores, several through the rows form (per row its key range, scores [T, entries]).
void bench_indexer(int seqs, int rows, int entries, const Options& o) {
    const int64_t t = static_cast<int64_t>(seqs) * rows, qn = t * kIndexHeads * kIndexDim, sn = t * entries;
    const int64_t kn = static_cast<int64_t>(seqs) * entries * kIndexDim;
    float* q = random_device(qn, 1.0f, 4);
    float* keys = random_device(kn, 1.0f, 5);
    float* w = random_device(t * kIndexHeads, 1.0f, 6);
    std::vector<int32_t> begin, count;
    for (int64_t r = 0; r < t; ++r) {
        begin.push_back(static_cast<int32_t>(r / rows * entries));
        count.push_back(entries);
    }
    int32_t* begin_d = seqs > 1 ? to_device(begin) : nullptr;
    int32_t* count_d = seqs > 1 ? to_device(count) : nullptr;
    float *s = nullptr, *s_old = nullptr, *s_tc = nullptr;
    CHECK(cudaMalloc(&s, sn * 4));
    CHECK(cudaMalloc(&s_old, sn * 4));
    CHECK(cudaMalloc(&s_tc, sn * 4));
    const float scale = 1.0f / std::sqrt(static_cast<float>(kIndexDim));
    const double bytes = 4.0 * (qn + static_cast<double>(kn) + t * kIndexHeads + sn);
    const double flops = 2.0 * qn * entries;
    const double us = time_us([&] {
        launch_indexer_scores(s, q, keys, w, t, kIndexHeads, kIndexDim, entries, scale, nullptr, begin_d, count_d);
    }, o.iters);
    char shape[64];
    if (seqs > 1) std::snprintf(shape, sizeof shape, "rows %dx%d E=%d", seqs, rows, entries);
    else std::snprintf(shape, sizeof shape, "T=%d E=%d", rows, entries);
    auto old_call = [&] {
        baseline::indexer_scores_kernel<<<static_cast<unsigned>((sn + 255) / 256), 256>>>(
            s_old, q, keys, w, t, kIndexHeads, kIndexDim, entries, scale);
    };
    Options fp32 = o;
    fp32.baseline = o.baseline && seqs == 1;
    report("indexer_scores fp32", shape, us, bytes, flops, fp32, old_call, [&] { return max_rel_diff(s, s_old, sn); });
    const double tc_us = time_us(
        [&] {
            launch_indexer_scores_tc(s_tc, q, keys, w, t, kIndexHeads, kIndexDim, entries, scale, nullptr, begin_d,
                                     count_d, static_cast<int64_t>(seqs) * entries);
        },
        o.iters);
    report_vs("indexer_scores tc", shape, tc_us, bytes, flops, us, max_rel_diff(s_tc, s, sn));
    for (void* p : {static_cast<void*>(q), static_cast<void*>(keys), static_cast<void*>(w), static_cast<void*>(s),
                    static_cast<void*>(s_old), static_cast<void*>(s_tc), static_cast<void*>(begin_d),
                    static_cast<void*>(count_d)})
        CHECK(cudaFree(p));
}

}  // namespace
}  // namespace deepinfer::cuda

int main(int argc, char** argv) {
    using namespace deepinfer::cuda;
    Options o;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--no-baseline")) o.baseline = false;
        else {
            std::fprintf(stderr, "usage: attention_bench [--iters N] [--no-baseline]\n");
            return 2;
        }
    }
    std::printf("%-24s %-26s %9s %8s %8s %10s %9s %9s\n", "op", "shape", "us/call", "GB/s", "TFLOP/s", "ref us",
                "speedup", "rel diff");
    for (int rows : {1, 8, 32, 128}) bench_attention(rows, false, o);
    bench_attention(2048, true, o);
    bench_attention(16384, true, o);  // one CSA layer of an 8 x 2048 prefill, as one 16k sequence
    for (int rows : {1, 8, 32, 128})
        for (int entries : {1024, 16384}) bench_indexer(1, rows, entries, o);
    bench_indexer(1, 2048, 512, o);
    bench_indexer(8, 2048, 512, o);
    // Decode: one row from each of several sequences, each scoring its own 1024 entries (context 4096).
    for (int seqs : {8, 32}) bench_indexer(seqs, 1, 1024, o);
    return 0;
}
