// GEMV micro-benchmark: the decode products of DeepSeek-V4-Flash on the fp32 GEMV (1 and 8 activation rows) and
// the tensor-core GEMV (8, 16 and 32 rows), timed with CUDA events over many launches that rotate through enough
// weight copies to miss the L2 cache. Prints us per call, GB/s of weight + scale bytes and the share of
// --bandwidth-gbs, and at 8 rows the relative difference of the two GEMVs' outputs. FP8 weights with 128 x 128 scale
// blocks also take the wgmma GEMV (8, 16 and 32 rows, on a compute capability 9.0 device), printed with its output's
// relative difference from the tensor-core GEMV's and the tensor-core GEMV's time over its own.
// Then the routed experts (expert_linear over 256 FP4 experts, top-6 of each token) at 1, 8, 32 and 128 tokens,
// rotating through 8 random routings so that consecutive calls touch different experts; GB/s counts the weight +
// scale bytes of the distinct experts a call touches. Both kernels of launch_expert_linear are timed: fp32 FMAs
// (DEEPINFER_CUDA_GEMM=tiled) and tensor cores (the bf16 modes), with the tensor-core output's relative difference
// from the fp32 one. Last the whole routed FFN (w1, w3, SwiGLU, w2) of those tokens: the backend's default sequence
// (expert_linear x 3 + swiglu, each on the kernel the default mode picks for its rows) against the fused wgmma
// kernels planned on the device (launch_routed_experts_wgmma, Backend::routed_experts on Hopper), GB/s over the three
// weights of the distinct experts, and the two outputs' relative difference; at 1-8 tokens also the few-token kernels
// (launch_routed_experts_few_tokens, which the backend takes up to kRoutedFewTokensMax tokens) and their output's
// difference, and where the experts' scales let them (experts_fp8_prepare) the FP8 decode products
// (launch_routed_experts_wgmma with an FP8 table, DEEPINFER_CUDA_FP8_DECODE_EXPERTS) with their output's difference
// from the bf16 rings'.
// FP8 weights also take the FP8 mma GEMV at 1, 2 and 4 rows, against the fp32 GEMV (1 row) or the wgmma GEMV.
// --wgmma-plans instead times each launch plan of the wgmma GEMV (run_wgmma_plans), --gemv-splits each split of the
// fp32 GEMV (run_gemv_splits).
// --only NAME keeps the GEMV products whose name contains NAME.
// --routed-only: the whole routed FFN only.
//   gemv_bench [--bandwidth-gbs 4259] [--iters 200] [--experts-only | --routed-only | --no-experts | --wgmma-plans]
//              [--gemv-splits] [--only NAME]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_chunks.cuh"
#include "common/event_timing.cuh"

namespace deepinfer::cuda {}  // namespace deepinfer::cuda

namespace {

using namespace deepinfer::cuda;

#define CHECK(expr) DI_CUDA_CHECK(expr)

// --only: the products whose name contains this text (all when null), e.g. to profile one shape under ncu.
const char* g_only = nullptr;
bool selected(const char* name) { return !g_only || std::strstr(name, g_only); }

__device__ __forceinline__ uint32_t hash(uint64_t i, uint32_t seed) {
    uint64_t h = (i + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return static_cast<uint32_t>(h >> 32);
}

// Random but finite contents: mode 0 f32 in [-0.5, 0.5), 1 bf16 / 2 f16 in +-[0.5, 1), 3 e4m3 (no NaN), 4 e2m1,
// 5 E8M0 scales 2^-7 .. 2^0, 6 f32 scales 2^-8.
__global__ void fill(uint8_t* p, int64_t bytes, int mode, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += int64_t{gridDim.x} * blockDim.x) {
        const uint32_t h = hash(i, seed);
        if (mode == 0 || mode == 6) {
            if (i % 4 != 0) continue;
            const float v = mode == 0 ? static_cast<float>(h % 1000) / 1000.0f - 0.5f : 1.0f / 256;
            *reinterpret_cast<float*>(p + i) = v;
        } else if (mode == 1 || mode == 2) {
            if (i % 2 != 0) continue;
            *reinterpret_cast<uint16_t*>(p + i) = mode == 1 ? (h & 0x807f) | 0x3f00 : (h & 0x83ff) | 0x3800;
        } else if (mode == 3) {
            p[i] = static_cast<uint8_t>(h & 0xbf);
        } else if (mode == 4) {
            p[i] = static_cast<uint8_t>(h);
        } else {
            p[i] = static_cast<uint8_t>(120 + h % 8);
        }
    }
}

void fill_device(void* p, int64_t bytes, int mode, uint32_t seed) {
    fill<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, mode, seed);
    DI_CUDA_LAUNCH_CHECK();
}

struct Case {
    const char* name;
    int64_t n, k;
    int format, dtype, scale_f32;  // as in WeightDesc
    int groups;                    // grouped_linear: n / groups outputs per group over k inputs each
};

const char* dtype_label(const Case& c) {
    if (c.format == 2) return "fp4";
    if (c.format == 1) return c.scale_f32 ? "fp8/f32" : "fp8/e8m0";
    return c.dtype == 0 ? "f32" : c.dtype == 1 ? "bf16" : "f16";
}

struct Matrix {
    WeightDesc d;
    int64_t bytes = 0, scale_bytes = 0;
};

Matrix make_matrix(const Case& c, uint32_t seed) {
    Matrix m;
    WeightDesc& d = m.d;
    d = WeightDesc{};
    d.rows = c.n, d.cols = c.k, d.format = c.format, d.dtype = c.dtype, d.scale_f32 = c.scale_f32;
    int data_mode = 0, scale_mode = 5;
    if (c.format == 0) {
        m.bytes = c.n * c.k * (c.dtype == 0 ? 4 : 2);
        data_mode = c.dtype == 0 ? 0 : c.dtype == 1 ? 1 : 2;
    } else if (c.format == 1) {
        d.block_rows = d.block_cols = 128;
        d.scale_cols = (c.k + 127) / 128;
        m.bytes = c.n * c.k;
        m.scale_bytes = (c.n + 127) / 128 * d.scale_cols * (c.scale_f32 ? 4 : 1);
        data_mode = 3;
        scale_mode = c.scale_f32 ? 6 : 5;
    } else {
        d.block_cols = 32;
        d.scale_cols = c.k / 32;
        m.bytes = c.n * c.k / 2;
        m.scale_bytes = c.n * d.scale_cols;
        data_mode = 4;
    }
    uint8_t* data = nullptr;
    CHECK(cudaMalloc(&data, m.bytes));
    fill_device(data, m.bytes, data_mode, seed);
    d.data = data;
    if (m.scale_bytes) {
        uint8_t* scale = nullptr;
        CHECK(cudaMalloc(&scale, m.scale_bytes));
        fill_device(scale, m.scale_bytes, scale_mode, seed + 1);
        d.scale = scale;
    }
    return m;
}

// The same groups as the jobs of one launch (the backend's GEMV launches: Backend::linears, grouped_linear).
std::vector<GemvJob> case_jobs(const Case& c, const WeightDesc& d, float* out, const float* x) {
    const int64_t r = c.n / c.groups;
    std::vector<GemvJob> jobs;
    for (int g = 0; g < c.groups; ++g) jobs.push_back({out + g * r, c.n, x + g * c.k, c.groups * c.k, d, g * r, r});
    return jobs;
}

// A GEMV's jobs launcher (launch_gemv_jobs, launch_gemv_tc_jobs, launch_gemv_wgmma_jobs).
using JobsLaunch = void (*)(const GemvJob*, int, int64_t, cudaStream_t);

// One call of the case's jobs (weight d) on `launch`.
void run_jobs(JobsLaunch launch, const Case& c, const WeightDesc& d, float* out, const float* x, int rows) {
    const std::vector<GemvJob> jobs = case_jobs(c, d, out, x);
    launch(jobs.data(), static_cast<int>(jobs.size()), rows, nullptr);
}

// Mean us a call of the case's jobs on `launch`, rotating through its weight copies, after 5 warm-up calls.
double time_jobs(JobsLaunch launch, const Case& c, const std::vector<Matrix>& copies, float* out, const float* x,
                 int rows, int iters) {
    auto call = [&](int i) { run_jobs(launch, c, copies[i % copies.size()].d, out, x, rows); };
    for (int i = 0; i < 5; ++i) call(i);
    return deepinfer::bench::mean_call_us(iters, call);
}

// "[n x k]", the tables' shape column.
std::string shape_label(int64_t n, int64_t k) {
    char s[48];
    std::snprintf(s, sizeof s, "[%lld x %lld]", static_cast<long long>(n), static_cast<long long>(k));
    return s;
}

std::vector<float> download(const float* p, int64_t n) {
    std::vector<float> v(n);
    CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
}

// max |a - b| / max |b| of two device arrays of n floats; infinite where one of them alone is NaN.
double rel_diff(const float* a_dev, const float* b_dev, int64_t n) {
    const std::vector<float> a = download(a_dev, n), b = download(b_dev, n);
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
        if (std::isnan(a[i]) != std::isnan(b[i])) diff = INFINITY;
    }
    return ref > 0 ? diff / ref : diff;
}

// ---- routed experts ----

// expert_linear over kExperts experts of [n x k] FP4, top-kTopK routing of `tokens` tokens (slot (t, j) reads
// token row t when rows_per_input is kTopK, its own row when it is 1), as the MoE block's w1/w3 and w2 calls.
constexpr int kExperts = 256, kTopK = 6, kRoutings = 8;

// kRoutings routings of `tokens` tokens, one after the other in ids: kTopK distinct experts a token, ascending, as
// moe_route leaves them; distinct: the mean number of experts a routing touches.
struct Routings {
    std::vector<int32_t> ids;
    double distinct = 0;
};
Routings make_routings(std::mt19937& rng, int64_t tokens) {
    Routings r;
    std::vector<int32_t> all(kExperts);
    for (int i = 0; i < kRoutings; ++i) {
        std::vector<bool> touched(kExperts);
        for (int64_t t = 0; t < tokens; ++t) {
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            std::sort(all.begin(), all.begin() + kTopK);
            for (int j = 0; j < kTopK; ++j) r.ids.push_back(all[j]), touched[all[j]] = true;
        }
        r.distinct += static_cast<double>(std::count(touched.begin(), touched.end(), true)) / kRoutings;
    }
    return r;
}

void run_experts(const char* name, int64_t n, int64_t k, int rows_per_input, double bandwidth, int iters) {
    const Case c{name, n, k, 2, 0, 0, 1};
    std::vector<Matrix> experts;
    std::vector<WeightDesc> table;
    for (int e = 0; e < kExperts; ++e) {
        experts.push_back(make_matrix(c, 1000 + 2 * static_cast<uint32_t>(e)));
        table.push_back(experts.back().d);
    }
    const int64_t expert_bytes = experts[0].bytes + experts[0].scale_bytes;
    WeightDesc* table_d = nullptr;
    CHECK(cudaMalloc(&table_d, table.size() * sizeof(WeightDesc)));
    CHECK(cudaMemcpy(table_d, table.data(), table.size() * sizeof(WeightDesc), cudaMemcpyHostToDevice));
    const bool fast = expert_linear_streams(table.data(), kExperts);

    const int64_t max_tokens = 128, max_rows = max_tokens * kTopK;
    float *x = nullptr, *out_tc = nullptr, *out_fp32 = nullptr;
    CHECK(cudaMalloc(&x, max_rows * k * 4));
    CHECK(cudaMalloc(&out_tc, max_rows * n * 4));
    CHECK(cudaMalloc(&out_fp32, max_rows * n * 4));
    fill_device(x, max_rows * k * 4, 0, 11);
    int32_t* ids_d = nullptr;
    CHECK(cudaMalloc(&ids_d, kRoutings * max_rows * 4));

    std::mt19937 rng(5);
    for (int64_t tokens : {1, 2, 4, 8, 32, 128}) {
        const int64_t rows = tokens * kTopK;
        const Routings routings = make_routings(rng, tokens);
        const double distinct = routings.distinct;
        CHECK(cudaMemcpy(ids_d, routings.ids.data(), routings.ids.size() * 4, cudaMemcpyHostToDevice));
        auto desc = [&](float* out, int r) {
            return ExpertLinearDesc{out, x, ids_d + r * rows, table_d, rows, n, k, kExperts, rows_per_input};
        };
        auto time_calls = [&](auto launch, float* out, int count) {
            for (int i = 0; i < kRoutings; ++i) launch(desc(out, i % kRoutings));
            return deepinfer::bench::mean_call_us(count, [&](int i) { launch(desc(out, i % kRoutings)); });
        };
        auto fp32_kernel = [&](const ExpertLinearDesc& d) { launch_expert_linear(d, table[0], fast, false, nullptr); };
        auto tc_kernel = [&](const ExpertLinearDesc& d) { launch_expert_linear(d, table[0], fast, true, nullptr); };
        const double fp32_us = time_calls(fp32_kernel, out_fp32, iters);
        const double tc_us = time_calls(tc_kernel, out_tc, iters);
        auto gbs = [&](double us) { return distinct * static_cast<double>(expert_bytes) / us / 1e3; };
        std::printf("%-18s %-14s %4lld %5lld %6.1f %9.2f %7.0f %5.1f%% %9.2f %7.0f %5.1f%% %7.2fx", name,
                    shape_label(n, k).c_str(), static_cast<long long>(tokens), static_cast<long long>(rows), distinct,
                    fp32_us, gbs(fp32_us), 100.0 * gbs(fp32_us) / bandwidth, tc_us, gbs(tc_us),
                    100.0 * gbs(tc_us) / bandwidth, fp32_us / tc_us);
        // The tensor-core kernel's output against the fp32 kernel's (bf16 activations: ~1e-3 expected).
        fp32_kernel(desc(out_fp32, 0));
        tc_kernel(desc(out_tc, 0));
        std::printf(" %9.1e\n", rel_diff(out_tc, out_fp32, rows * n));
    }
    CHECK(cudaFree(ids_d));
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_tc));
    CHECK(cudaFree(out_fp32));
    CHECK(cudaFree(table_d));
    for (Matrix& m : experts) {
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
    }
}

// The backend keeps freed blocks in the stream-ordered pool; so does this process, as the wgmma GEMV and both
// routed FFN paths take scratch.
void keep_freed_blocks() {
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

// The routed FFN of `tokens` tokens (kTopK slots each) over kExperts experts of w1, w3 [inter x d] and w2 [d x inter]:
// the default sequence, then the fused kernels, each over kRoutings routings in turn.
void run_routed(int64_t d, int64_t inter, double bandwidth, int iters) {
    keep_freed_blocks();
    const Case up{"w1/w3", inter, d, 2, 0, 0, 1}, down{"w2", d, inter, 2, 0, 0, 1};
    std::vector<Matrix> mats;
    std::vector<WeightDesc> t1, t3, t2;
    for (int e = 0; e < kExperts; ++e) {
        mats.push_back(make_matrix(up, 5000 + 6 * static_cast<uint32_t>(e)));
        t1.push_back(mats.back().d);
        mats.push_back(make_matrix(up, 5002 + 6 * static_cast<uint32_t>(e)));
        t3.push_back(mats.back().d);
        mats.push_back(make_matrix(down, 5004 + 6 * static_cast<uint32_t>(e)));
        t2.push_back(mats.back().d);
    }
    if (!grouped_experts_wgmma_applies(t1.data(), t3.data(), t2.data(), kExperts)) {
        std::printf("routed FFN: the wgmma kernels do not apply on this device (compute capability 9.0 only)\n");
        for (Matrix& m : mats) {
            CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
            CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
        }
        return;
    }
    const int64_t expert_bytes = 2 * (mats[0].bytes + mats[0].scale_bytes) + mats[2].bytes + mats[2].scale_bytes;
    std::vector<WeightDesc*> tables_d;
    for (const std::vector<WeightDesc>* t : {&t1, &t3, &t2}) {
        WeightDesc* p = nullptr;
        CHECK(cudaMalloc(&p, kExperts * sizeof(WeightDesc)));
        CHECK(cudaMemcpy(p, t->data(), kExperts * sizeof(WeightDesc), cudaMemcpyHostToDevice));
        tables_d.push_back(p);
    }
    const std::vector<uint8_t> ptrs = routed_experts_wgmma_table(t1.data(), t3.data(), t2.data(), kExperts);
    void* ptrs_d = nullptr;
    CHECK(cudaMalloc(&ptrs_d, ptrs.size()));
    CHECK(cudaMemcpy(ptrs_d, ptrs.data(), ptrs.size(), cudaMemcpyHostToDevice));
    const bool fast1 = expert_linear_streams(t1.data(), kExperts), fast2 = expert_linear_streams(t2.data(), kExperts);
    // The FP8 decode products' table (DEEPINFER_CUDA_FP8_DECODE_EXPERTS), where the random scales let them apply.
    uint8_t* row_max = nullptr;
    void* fp8_d = nullptr;
    CHECK(cudaMalloc(&row_max, experts_fp8_row_bytes(kExperts, d, inter)));
    const bool fp8_applies = experts_fp8_decode_applies(t1.data(), t3.data(), t2.data(), kExperts) &&
                             experts_fp8_prepare(t1.data(), t3.data(), t2.data(), kExperts, row_max, nullptr);
    if (fp8_applies) {
        const std::vector<uint8_t> fp8 = experts_fp8_table(t1.data(), t3.data(), t2.data(), kExperts, row_max);
        CHECK(cudaMalloc(&fp8_d, fp8.size()));
        CHECK(cudaMemcpy(fp8_d, fp8.data(), fp8.size(), cudaMemcpyHostToDevice));
    }

    const int64_t max_tokens = 128, max_rows = max_tokens * kTopK;
    const float limit = 10.0f;
    float *x = nullptr, *g = nullptr, *u = nullptr, *out_linear = nullptr, *out_wgmma = nullptr, *out_few = nullptr,
          *out_fp8 = nullptr;
    CHECK(cudaMalloc(&x, max_tokens * d * 4));
    CHECK(cudaMalloc(&g, max_rows * inter * 4));
    CHECK(cudaMalloc(&u, max_rows * inter * 4));
    CHECK(cudaMalloc(&out_linear, max_rows * d * 4));
    CHECK(cudaMalloc(&out_wgmma, max_rows * d * 4));
    CHECK(cudaMalloc(&out_few, max_rows * d * 4));
    CHECK(cudaMalloc(&out_fp8, max_rows * d * 4));
    fill_device(x, max_tokens * d * 4, 0, 13);
    int32_t* ids_d = nullptr;
    CHECK(cudaMalloc(&ids_d, kRoutings * max_rows * 4));

    std::mt19937 rng(9);
    for (int64_t tokens : {1, 2, 4, 8, 32, 128}) {
        const int64_t rows = tokens * kTopK;
        const Routings routings = make_routings(rng, tokens);
        const double distinct = routings.distinct;
        CHECK(cudaMemcpy(ids_d, routings.ids.data(), routings.ids.size() * 4, cudaMemcpyHostToDevice));
        // The default mode's kernel for these rows (CudaBackend::tc_experts in the auto mode).
        const bool tc = rows > kExpertTcMinRows;
        auto linear = [&](int r) {
            const int32_t* id = ids_d + r * rows;
            launch_expert_linear({g, x, id, tables_d[0], rows, inter, d, kExperts, kTopK}, t1[0], fast1, tc, nullptr);
            launch_expert_linear({u, x, id, tables_d[1], rows, inter, d, kExperts, kTopK}, t3[0], fast1, tc, nullptr);
            launch_swiglu(g, g, u, rows * inter, limit, nullptr);
            launch_expert_linear({out_linear, g, id, tables_d[2], rows, d, inter, kExperts, 1}, t2[0], fast2, tc,
                                 nullptr);
        };
        auto fused = [&](int r) {
            launch_routed_experts_wgmma(out_wgmma, x, ids_d + r * rows, rows, kTopK, ptrs_d, kExperts, d, inter, limit,
                                        nullptr);
        };
        // The few-token kernels (each slot its own item): up to 8 tokens, past kRoutedFewTokensMax too.
        const bool few_applies = tokens <= 8 && routed_experts_few_tokens_applies(d, inter);
        auto few = [&](int r) {
            launch_routed_experts_few_tokens(out_few, x, ids_d + r * rows, rows, kTopK, ptrs_d, kExperts, d, inter,
                                             limit, nullptr);
        };
        // The FP8 decode products (decode sizes only: prefill-sized calls keep prefill's rings).
        const bool fp8_now = fp8_applies && rows <= kRoutedDecodeMaxSlots;
        auto fp8 = [&](int r) {
            launch_routed_experts_wgmma(out_fp8, x, ids_d + r * rows, rows, kTopK, ptrs_d, kExperts, d, inter, limit,
                                        nullptr, false, fp8_d);
        };
        for (int i = 0; i < kRoutings; ++i) {
            linear(i), fused(i);
            if (few_applies) few(i);
            if (fp8_now) fp8(i);
        }
        const double linear_us = deepinfer::bench::mean_call_us(iters, [&](int i) { linear(i % kRoutings); });
        const double fused_us = deepinfer::bench::mean_call_us(iters, [&](int i) { fused(i % kRoutings); });
        const double few_us =
            few_applies ? deepinfer::bench::mean_call_us(iters, [&](int i) { few(i % kRoutings); }) : 0.0;
        const double fp8_us = fp8_now ? deepinfer::bench::mean_call_us(iters, [&](int i) { fp8(i % kRoutings); }) : 0.0;
        auto gbs = [&](double us) { return distinct * static_cast<double>(expert_bytes) / us / 1e3; };
        linear(0);
        fused(0);
        std::printf("%-18s %4lld %5lld %6.1f %-6s %9.2f %7.0f %5.1f%% %9.2f %7.0f %5.1f%% %7.2fx %9.1e",
                    "routed ffn x256", static_cast<long long>(tokens), static_cast<long long>(rows), distinct,
                    tc ? "tc" : "fp32", linear_us, gbs(linear_us), 100.0 * gbs(linear_us) / bandwidth, fused_us,
                    gbs(fused_us), 100.0 * gbs(fused_us) / bandwidth, linear_us / fused_us,
                    rel_diff(out_wgmma, out_linear, rows * d));
        if (few_applies) {
            few(0);
            std::printf(" %9.2f %7.0f %5.1f%% %9.1e", few_us, gbs(few_us), 100.0 * gbs(few_us) / bandwidth,
                        rel_diff(out_few, out_linear, rows * d));
        } else {
            std::printf(" %9s %7s %6s %9s", "-", "-", "-", "-");
        }
        if (fp8_now) {  // its difference from the bf16 rings' output (fused(0) above)
            fp8(0);
            std::printf(" %9.2f %7.0f %5.1f%% %9.1e", fp8_us, gbs(fp8_us), 100.0 * gbs(fp8_us) / bandwidth,
                        rel_diff(out_fp8, out_wgmma, rows * d));
        }
        std::printf("\n");
    }
    for (void* p : {static_cast<void*>(x), static_cast<void*>(g), static_cast<void*>(u), static_cast<void*>(out_linear),
                    static_cast<void*>(out_wgmma), static_cast<void*>(out_few), static_cast<void*>(out_fp8),
                    static_cast<void*>(ids_d), static_cast<void*>(row_max), ptrs_d, fp8_d})
        CHECK(cudaFree(p));
    for (WeightDesc* p : tables_d) CHECK(cudaFree(p));
    for (Matrix& m : mats) {
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
    }
}

}  // namespace

// Enough copies of c's weight (>= 256 MB) that launches rotating through them read from HBM, not the 50 MB L2.
std::vector<Matrix> rotating_copies(const Case& c) {
    std::vector<Matrix> copies(1, make_matrix(c, 1));
    const int64_t bytes = copies[0].bytes + copies[0].scale_bytes;
    while (static_cast<int64_t>(copies.size()) * bytes < (int64_t{256} << 20) && copies.size() < 64)
        copies.push_back(make_matrix(c, 1 + 2 * static_cast<uint32_t>(copies.size())));
    return copies;
}

void free_copies(std::vector<Matrix>& copies) {
    for (Matrix& m : copies) {
        CHECK(cudaFree(const_cast<uint8_t*>(m.d.data)));
        if (m.d.scale) CHECK(cudaFree(const_cast<uint8_t*>(m.d.scale)));
    }
    copies.clear();
}

// A sweep's activations (filled with deterministic values) and outputs, freed at scope exit.
struct SweepBuffers {
    float* x = nullptr;
    float* out = nullptr;
    SweepBuffers(int64_t x_elems, int64_t out_elems) {
        CHECK(cudaMalloc(&x, x_elems * 4));
        CHECK(cudaMalloc(&out, out_elems * 4));
        fill_device(x, x_elems * 4, 0, 7);
    }
    ~SweepBuffers() {
        cudaFree(x);
        cudaFree(out);
    }
};

// Each forced launch configuration in turn (force(a, b); force(0, 0) restores the kernel's own choice): its time,
// or "-" where the launch refuses it (not a valid configuration for the shape), then the end of the line.
template <class Force, class Timed>
void print_forced(const int (&configs)[8][2], Force force, Timed timed) {
    for (const auto& cf : configs) {
        force(cf[0], cf[1]);
        try {
            std::printf(" %7.2f", timed());
        } catch (const std::exception&) {
            std::printf(" %7s", "-");
        }
        force(0, 0);
    }
    std::printf("\n");
    std::fflush(stdout);
}

// The wgmma GEMV's launch plans (tile height: 2 or 4 slices of 64 weight rows; K splits 1..8), each forced in turn
// (set_gemv_wgmma_plan) on the FP8 decode products, against the cost model's choice: which plan is fastest per shape
// and row count, to check the model. The backend's launches: wq_b with the indexer's wq_b (one input, K 1024) is
// one launch of two products, timed here as one weight of their rows.
void run_wgmma_plans(double bandwidth, int iters) {
    const std::vector<Case> cases = {
        {"wq_a", 1024, 4096, 1, 0, 0, 1},           {"wkv", 512, 4096, 1, 0, 0, 1},
        {"wq_b", 32768, 1024, 1, 0, 0, 1},          {"wq_b + index wq_b", 40960, 1024, 1, 0, 0, 1},
        {"wo_b", 4096, 8192, 1, 0, 0, 1},           {"wo_a (8 groups)", 8192, 4096, 1, 0, 0, 8},
        {"shared w1 + w3", 4096, 4096, 1, 0, 0, 1}, {"shared w2", 4096, 2048, 1, 0, 0, 1},
    };
    keep_freed_blocks();
    const SweepBuffers buffers(64 * 8 * 4096, 64 * 40960);
    float *x = buffers.x, *out = buffers.out;
    const int plans[][2] = {{4, 1}, {4, 2}, {4, 4}, {4, 8}, {2, 1}, {2, 2}, {2, 4}, {2, 8}};
    std::printf("%-18s %-14s %4s %-14s %9s %6s", "wgmma plans", "[n x k]", "rows", "model's plan", "us", "% bw");
    for (const auto& pl : plans) std::printf("   s%d/k%d", pl[0], pl[1]);
    std::printf("   (us; - = not a plan for this shape)\n");
    for (const Case& c : cases) {
        if (!selected(c.name)) continue;
        std::vector<Matrix> copies = rotating_copies(c);
        const int64_t bytes = copies[0].bytes + copies[0].scale_bytes;
        for (int rows : {8, 32, 64}) {
            auto timed = [&] { return time_jobs(launch_gemv_wgmma_jobs, c, copies, out, x, rows, iters); };
            const std::vector<GemvJob> jobs0 = case_jobs(c, copies[0].d, out, x);
            const GemvWgmmaPlan chosen = gemv_wgmma_plan_of(jobs0.data(), static_cast<int>(jobs0.size()), rows);
            const double model_us = timed();
            char plan[32];
            std::snprintf(plan, sizeof plan, "s%d/k%d (%lld t)", chosen.slices, chosen.splits,
                          static_cast<long long>(chosen.tiles));
            std::printf("%-18s %-14s %4d %-14s %9.2f %5.1f%%", c.name, shape_label(c.n, c.k).c_str(), rows, plan,
                        model_us, 100.0 * static_cast<double>(bytes) / model_us / 1e3 / bandwidth);
            print_forced(plans, set_gemv_wgmma_plan, timed);
        }
        free_copies(copies);
    }
}

// The fp32 GEMV's splits (output rows per 8-lane group: 1 or 2; K over a cluster of 1-8 blocks), each forced in
// turn (set_gemv_split) at 1 and 4 rows on the decode products that take it, against the heuristic's choice.
void run_gemv_splits(double bandwidth, int iters) {
    const std::vector<Case> cases = {
        {"wq_a", 1024, 4096, 1, 0, 0, 1},
        {"wkv", 512, 4096, 1, 0, 0, 1},
        {"wq_b + index wq_b", 40960, 1024, 1, 0, 0, 1},
        {"wo_b", 4096, 8192, 1, 0, 0, 1},
        {"wo_a (8 groups)", 8192, 4096, 1, 0, 0, 8},
        {"shared w1 + w3", 4096, 4096, 1, 0, 0, 1},
        {"shared w2", 4096, 2048, 1, 0, 0, 1},
        {"compressor + indexer (bf16)", 2624, 4096, 0, 1, 0, 1},
        {"router gate", 256, 4096, 0, 1, 0, 1},
        {"head (bf16)", 129280, 4096, 0, 1, 0, 1},
    };
    keep_freed_blocks();
    const SweepBuffers buffers(8 * 8 * 8192, 8 * 40960);
    float *x = buffers.x, *out = buffers.out;
    const int splits[][2] = {{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 1}, {2, 2}, {2, 4}, {2, 8}};
    std::printf("%-26s %-14s %4s %9s %6s", "fp32 gemv splits", "[n x k]", "rows", "us", "% bw");
    for (const auto& sp : splits) std::printf("  r%d/c%d", sp[0], sp[1]);
    std::printf("   (us; - = not a split for this shape)\n");
    for (const Case& c : cases) {
        if (!selected(c.name)) continue;
        std::vector<Matrix> copies = rotating_copies(c);
        const int64_t bytes = copies[0].bytes + copies[0].scale_bytes;
        for (int rows : {1, 4}) {
            if (!gemv_applies(rows, copies[0].d)) continue;
            auto timed = [&] { return time_jobs(launch_gemv_jobs, c, copies, out, x, rows, iters); };
            const double us = timed();
            std::printf("%-26s %-14s %4d %9.2f %5.1f%%", c.name, shape_label(c.n, c.k).c_str(), rows, us,
                        100.0 * static_cast<double>(bytes) / us / 1e3 / bandwidth);
            print_forced(splits, set_gemv_split, timed);
        }
        free_copies(copies);
    }
}

int main(int argc, char** argv) {
    double bandwidth = 4259;
    int iters = 200;
    bool gemv = true, experts = true, plans = false, splits = false, products = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--bandwidth-gbs") && i + 1 < argc)
            bandwidth = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--experts-only"))
            gemv = false;
        else if (!std::strcmp(argv[i], "--routed-only"))
            gemv = false, products = false;
        else if (!std::strcmp(argv[i], "--no-experts"))
            experts = false;
        else if (!std::strcmp(argv[i], "--wgmma-plans"))
            plans = true;
        else if (!std::strcmp(argv[i], "--gemv-splits"))
            splits = true;
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
            g_only = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: gemv_bench [--bandwidth-gbs GBS] [--iters N] [--experts-only | --routed-only | "
                         "--no-experts | --wgmma-plans] [--gemv-splits] [--only NAME]\n");
            return 2;
        }
    }
    if (plans || splits) {
        if (splits) run_gemv_splits(bandwidth, iters);
        if (plans) run_wgmma_plans(bandwidth, iters);
        return 0;
    }
    // DeepSeek-V4-Flash decode products: routed experts (FP4), attention projections (FP8, 128x128 E8M0
    // blocks; one F32-scale variant), the grouped output projection, the head and the router gate (BF16).
    const std::vector<Case> cases = {
        {"expert w1/w3", 2048, 4096, 2, 0, 0, 1}, {"expert w2", 4096, 2048, 2, 0, 0, 1},
        {"wq_a", 1024, 4096, 1, 0, 0, 1},         {"wq_a f32 scales", 1024, 4096, 1, 0, 1, 1},
        {"wq_b", 32768, 1024, 1, 0, 0, 1},        {"wkv", 512, 4096, 1, 0, 0, 1},
        {"wo_b", 4096, 8192, 1, 0, 0, 1},         {"wo_a (8 groups)", 8192, 4096, 1, 0, 0, 8},
        {"head", 129280, 4096, 0, 1, 0, 1},       {"router gate", 256, 4096, 0, 1, 0, 1},
    };
    keep_freed_blocks();
    float *x = nullptr, *out_tc = nullptr, *out_fp32 = nullptr, *out_wgmma = nullptr;
    const int64_t max_x = 32 * 8 * 4096, max_out = 32 * 129280;
    CHECK(cudaMalloc(&x, max_x * 4));
    CHECK(cudaMalloc(&out_tc, max_out * 4));
    CHECK(cudaMalloc(&out_fp32, max_out * 4));
    CHECK(cudaMalloc(&out_wgmma, max_out * 4));
    fill_device(x, max_x * 4, 0, 7);

    // Every GEMV runs a case's groups in one launch, as the backend does (Backend::grouped_linear).
    if (gemv)
        std::printf("%-18s %-9s %-14s %4s %-6s %10s %8s %7s %9s\n", "shape", "dtype", "[n x k]", "rows", "gemv",
                    "us/call", "GB/s", "% bw", "vs fp32/tc");
    for (const Case& c : gemv ? cases : std::vector<Case>{}) {
        if (!selected(c.name)) continue;
        std::vector<Matrix> copies = rotating_copies(c);
        const int64_t bytes = copies[0].bytes + copies[0].scale_bytes;
        const std::string shape = shape_label(c.n, c.k);
        auto print = [&](int rows, const char* kernel, double us) {
            const double gbs = static_cast<double>(bytes) / us / 1e3;
            std::printf("%-18s %-9s %-14s %4d %-6s %10.2f %8.0f %6.1f%%", c.name, dtype_label(c), shape.c_str(), rows,
                        kernel, us, gbs, 100.0 * gbs / bandwidth);
        };
        // The fp32 GEMV (1 and 8 rows), then the tensor-core one (8, 16, 32 rows; at 8 rows its output's
        // relative difference from the fp32 one: bf16 activations, ~1e-3 expected).
        for (int rows : {1, 8}) {
            if (!gemv_applies(rows, copies[0].d)) continue;
            print(rows, "fp32", time_jobs(launch_gemv_jobs, c, copies, out_fp32, x, rows, iters));
            std::printf("\n");
        }
        double tc_us[33] = {};
        for (int rows : {8, 16, 32}) {
            if (!gemv_tc_applies(rows, copies[0].d)) continue;
            tc_us[rows] = time_jobs(launch_gemv_tc_jobs, c, copies, out_tc, x, rows, iters);
            print(rows, "tc", tc_us[rows]);
            if (rows == 8 && gemv_applies(rows, copies[0].d)) {
                const int64_t n_out = rows * c.n;
                run_jobs(launch_gemv_jobs, c, copies[0].d, out_fp32, x, rows);
                run_jobs(launch_gemv_tc_jobs, c, copies[0].d, out_tc, x, rows);
                std::printf(" %9.1e", rel_diff(out_tc, out_fp32, n_out));
            }
            std::printf("\n");
        }
        // The wgmma GEMV (FP8, 128 x 128 scales), with its output's relative difference from the tensor-core GEMV's
        // (bf16 inputs both, another fp32 summation order: ~1e-6 expected) and the tensor-core GEMV's time over its
        // own.
        for (int rows : {8, 16, 32}) {
            if (!gemv_wgmma_applies(rows, copies[0].d)) continue;
            const double us = time_jobs(launch_gemv_wgmma_jobs, c, copies, out_wgmma, x, rows, iters);
            print(rows, "wgmma", us);
            if (tc_us[rows] > 0) {
                run_jobs(launch_gemv_tc_jobs, c, copies[0].d, out_tc, x, rows);
                run_jobs(launch_gemv_wgmma_jobs, c, copies[0].d, out_wgmma, x, rows);
                std::printf(" %9.1e %6.2fx", rel_diff(out_wgmma, out_tc, rows * c.n), tc_us[rows] / us);
            }
            std::printf("\n");
        }
        // The FP8 mma GEMV (1..4 rows), with its output's relative difference from the fp32 GEMV's at one row
        // (bf16-rounded activations here: ~1e-3 expected) and from the wgmma GEMV's above (~1e-6), and the other
        // kernel's time over its own.
        for (int rows : {1, 2, 4}) {
            if (!gemv_fp8_mma_applies(rows, copies[0].d)) continue;
            const double us = time_jobs(launch_gemv_fp8_mma_jobs, c, copies, out_tc, x, rows, iters);
            print(rows, "fp8mma", us);
            const JobsLaunch other = rows == 1 ? launch_gemv_jobs : launch_gemv_wgmma_jobs;
            const double other_us = time_jobs(other, c, copies, out_wgmma, x, rows, iters);
            run_jobs(launch_gemv_fp8_mma_jobs, c, copies[0].d, out_tc, x, rows);
            run_jobs(other, c, copies[0].d, out_wgmma, x, rows);
            std::printf(" %9.1e %6.2fx (%s %.2f us)\n", rel_diff(out_tc, out_wgmma, rows * c.n), other_us / us,
                        rows == 1 ? "fp32" : "wgmma", other_us);
        }
        // BF16 weights: cuBLAS uses them in place (no dequantization), the alternative from 8 rows.
        if (c.format == 0 && c.dtype == 1 && c.groups == 1) {
            CublasGemm gemm(nullptr);
            for (int rows : {8, 16, 32}) {
                auto call = [&](int i) { gemm.run(out_tc, c.n, x, c.k, rows, copies[i % copies.size()].d, 0, c.n); };
                for (int i = 0; i < 10; ++i) call(i);
                print(rows, "cublas", deepinfer::bench::mean_call_us(iters, call));
                std::printf("\n");
            }
        }
        free_copies(copies);
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(out_tc));
    CHECK(cudaFree(out_fp32));
    CHECK(cudaFree(out_wgmma));
    if (experts) {
        if (products) {
            // The MoE block's calls: w1 and w3 (each token's row for its 6 slots), w2 (each slot its own row).
            std::printf("\n%-18s %-14s %4s %5s %6s %9s %7s %6s %9s %7s %6s %8s %9s\n", "routed experts (fp4)",
                        "[n x k]", "tok", "rows", "exp", "fp32 us", "GB/s", "% bw", "tc us", "GB/s", "% bw", "tc gain",
                        "tc diff");
            run_experts("expert w1/w3 x256", 2048, 4096, kTopK, bandwidth, iters);
            run_experts("expert w2 x256", 4096, 2048, 1, bandwidth, iters);
        }
        // The whole routed FFN: w1, w3, SwiGLU and w2 (D 4096, I 2048).
        std::printf("\n%-18s %4s %5s %6s %-6s %9s %7s %6s %9s %7s %6s %8s %9s %9s %7s %6s %9s %9s %7s %6s %9s\n",
                    "routed ffn (fp4)", "tok", "rows", "exp", "linear", "linear us", "GB/s", "% bw", "wgmma us", "GB/s",
                    "% bw", "gain", "diff", "few us", "GB/s", "% bw", "few diff", "fp8 us", "GB/s", "% bw", "fp8 diff");
        run_routed(4096, 2048, bandwidth, iters);
    }
    return 0;
}
