// Shared by the CUDA op tests: a fixture holding both backends, and random weights of every stored format.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/weight.h"

namespace deepinfer::testing_support {

// The tolerance table's bounds for a CUDA op against the CPU op (relative error): the exact fp32 paths, the
// products from bf16 inputs, and those products against the CPU fed the same bf16-rounded inputs.
constexpr double kBound = 1e-5;
constexpr double kBf16Bound = 3e-2;
constexpr double kSameInputsBound = 1e-4;

// Prefill-sized FP4 experts straight on the device: e experts' w1, w3 [inter, d] and w2 [d, inter], random codes and
// E8M0 scales 122..129, each copied to `gpu` (kept in `keep`) from one host buffer (the device copies are all that
// stays: 768 model-width matrices would not fit the host twice).
struct DeviceExperts {
    std::vector<LinearWeight> w1, w3, w2;
};
inline DeviceExperts random_fp4_experts(Backend& gpu, std::mt19937_64& bits, int64_t e, int64_t d, int64_t inter,
                                        std::vector<Tensor>* keep) {
    DeviceExperts x;
    std::vector<uint8_t> data(inter * d / 2), scale(inter * d / 32);
    for (int64_t i = 0; i < 3 * e; ++i) {
        for (size_t j = 0; j < data.size(); j += 8) {
            const uint64_t b = bits();
            std::memcpy(data.data() + j, &b, 8);
        }
        for (uint8_t& s : scale) s = static_cast<uint8_t>(122 + bits() % 8);
        LinearWeight w;
        w.format = WeightFormat::kFp4Group;
        w.block_cols = 32;
        w.rows = i % 3 == 2 ? d : inter;
        w.cols = i % 3 == 2 ? inter : d;
        w.name = "bench";
        w.data = TensorView(data.data(), DType::kFP4E2M1, Shape{w.rows, w.cols});
        w.scale = TensorView(scale.data(), DType::kE8M0, Shape{w.rows, w.cols / 32});
        (i % 3 == 0 ? x.w1 : i % 3 == 1 ? x.w3 : x.w2).push_back(to_backend(gpu, w, keep));
    }
    return x;
}

// CPU and CUDA backends (the CUDA one with products of more than 8 rows on the given DEEPINFER_CUDA_GEMM
// kernel) and a generator seeded afresh each run.
class CudaCompare : public ::testing::Test {
public:
    explicit CudaCompare(const char* gemm) : gemm_(gemm) {}

protected:
    void SetUp() override {
        if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
        setenv("DEEPINFER_CUDA_GEMM", gemm_, 1);
        cpu_ = create_backend("cpu", 0);  // every core: the references are most of these tests' time
        gpu_ = create_backend("cuda", 2);
        const unsigned seed = std::random_device{}();
        std::printf("seed %u\n", seed);
        rng_.seed(seed);
    }

    std::vector<float> randn(int64_t n, float std = 1.0f) {
        std::normal_distribution<float> d(0.0f, std);
        std::vector<float> v(n);
        for (float& x : v) x = d(rng_);
        return v;
    }
    Tensor host(const std::vector<float>& v, Shape s) {
        Tensor t(DType::kF32, s);
        std::memcpy(t.f32(), v.data(), v.size() * 4);
        return t;
    }
    Tensor device(TensorView h) { return to_backend(*gpu_, h); }
    // A device tensor of the shape, filled with NaN.
    Tensor poisoned(Shape s) {
        std::vector<float> nan(s.numel(), std::numeric_limits<float>::quiet_NaN());
        Tensor t = gpu_->alloc(DType::kF32, s);
        gpu_->upload(t, nan.data());
        return t;
    }
    std::vector<float> fetch(const Tensor& t) {
        std::vector<float> v(t.numel());
        gpu_->download(v.data(), t);
        return v;
    }
    static std::vector<float> values(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }
    // Prefill's routed experts at V4-Flash's width: 16,384 tokens x top-6 over 256 random FP4 experts, 384 rows each
    // (D 4096, I 2048; the weights kept in `keep`), the rows 97 random ones of std x_std over and over.
    struct PrefillExperts {
        static constexpr int64_t kExperts = 256, kD = 4096, kInter = 2048, kPer = 384, kRows = kExperts * kPer;
        DeviceExperts ex;
        std::vector<float> x;  // [kRows, kD]
        std::vector<int64_t> counts = std::vector<int64_t>(kExperts, kPer);
        static constexpr double kFlop = 6.0 * kRows * kD * kInter;
    };
    PrefillExperts prefill_experts(float x_std, std::vector<Tensor>* keep) {
        using P = PrefillExperts;
        std::mt19937_64 bits(rng_());
        PrefillExperts p;
        p.ex = random_fp4_experts(*gpu_, bits, P::kExperts, P::kD, P::kInter, keep);
        const std::vector<float> block = randn(P::kD * 97, x_std);
        p.x.resize(P::kRows * P::kD);
        for (int64_t i = 0; i < P::kRows * P::kD; ++i) p.x[i] = block[i % block.size()];
        return p;
    }

    const char* gemm_;
    std::unique_ptr<Backend> cpu_, gpu_;
    std::mt19937 rng_;
    std::vector<Tensor> storage_;
};

// Weights of every stored format, [n, k]: 0 F32, 1 BF16, 2 FP8 (32x32 E8M0 scales), 3 FP8 (128x128 F32),
// 4 FP4 (E8M0 per 32), 5 F16, 6 FP8 (128x128 E8M0).
// w's views point into data and scale: a copy points its views at its own buffers (a plain copy would keep the
// source's, dangling once a temporary source is gone); a move keeps the buffers and so the views.
struct HostWeight {
    LinearWeight w;
    std::vector<uint8_t> data, scale;

    HostWeight() = default;
    HostWeight(HostWeight&&) = default;
    HostWeight& operator=(HostWeight&&) = default;
    HostWeight(const HostWeight& o) : w(o.w), data(o.data), scale(o.scale) { rebind(o); }
    HostWeight& operator=(const HostWeight& o) {
        w = o.w;
        data = o.data;
        scale = o.scale;
        rebind(o);
        return *this;
    }

private:
    void rebind(const HostWeight& o) {
        if (!o.w.data.empty() && o.w.data.data() == o.data.data())
            w.data = TensorView(data.data(), o.w.data.dtype(), o.w.data.shape());
        if (!o.w.scale.empty() && o.w.scale.data() == o.scale.data())
            w.scale = TensorView(scale.data(), o.w.scale.dtype(), o.w.scale.shape());
    }
};

inline HostWeight make_weight(std::mt19937& rng, int format, int64_t n, int64_t k) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    HostWeight h;
    h.w.rows = n;
    h.w.cols = k;
    h.w.name = "test";
    if (format == 0 || format == 1) {  // F32, BF16
        h.data.resize(n * k * (format == 0 ? 4 : 2));
        for (int64_t i = 0; i < n * k; ++i) {
            const float v = d(rng);
            if (format == 0) std::memcpy(h.data.data() + 4 * i, &v, 4);
            else {
                const uint16_t b = f32_to_bf16(v);
                std::memcpy(h.data.data() + 2 * i, &b, 2);
            }
        }
        h.w.data = TensorView(h.data.data(), format == 0 ? DType::kF32 : DType::kBF16, Shape{n, k});
    } else if (format == 5) {  // F16: random sign and mantissa, exponents 2^-6 .. 2^5
        h.data.resize(n * k * 2);
        for (int64_t i = 0; i < n * k; ++i) {
            const uint16_t b = static_cast<uint16_t>((rng() & 0x83ffu) | ((9 + rng() % 12) << 10));
            std::memcpy(h.data.data() + 2 * i, &b, 2);
        }
        h.w.data = TensorView(h.data.data(), DType::kF16, Shape{n, k});
    } else if (format == 2 || format == 3 || format == 6) {
        // FP8 with 32x32 E8M0 (2), 128x128 F32 (3) or 128x128 E8M0 (6, the release format) block scales
        const int b = format == 2 ? 32 : 128;
        h.data.resize(n * k);
        for (auto& c : h.data) c = f32_to_f8e4m3(d(rng) * 100);
        const int64_t sr = (n + b - 1) / b, sc = (k + b - 1) / b;
        h.w.format = WeightFormat::kFp8Block;
        h.w.block_rows = h.w.block_cols = b;
        if (format != 3) {
            h.scale.resize(sr * sc);
            for (auto& s : h.scale) s = static_cast<uint8_t>(120 + rng() % 8);
            h.w.scale = TensorView(h.scale.data(), DType::kE8M0, Shape{sr, sc});
        } else {
            h.scale.resize(sr * sc * 4);
            for (int64_t i = 0; i < sr * sc; ++i) {
                const float s = std::ldexp(1.0f, -6 - static_cast<int>(rng() % 4));
                std::memcpy(h.scale.data() + 4 * i, &s, 4);
            }
            h.w.scale = TensorView(h.scale.data(), DType::kF32, Shape{sr, sc});
        }
        h.w.data = TensorView(h.data.data(), DType::kF8E4M3, Shape{n, k});
    } else {  // FP4, groups of 32
        h.data.resize(n * k / 2);
        for (auto& c : h.data) c = static_cast<uint8_t>(rng() & 0xff);
        h.scale.resize(n * k / 32);
        for (auto& s : h.scale) s = static_cast<uint8_t>(122 + rng() % 8);
        h.w.format = WeightFormat::kFp4Group;
        h.w.block_cols = 32;
        h.w.data = TensorView(h.data.data(), DType::kFP4E2M1, Shape{n, k});
        h.w.scale = TensorView(h.scale.data(), DType::kE8M0, Shape{n, k / 32});
    }
    return h;
}

// Routed experts' FFNs: w1 and w3 [inter, d], w2 [d, inter] of each expert, on the host (hw: expert 0's w1, w3, w2,
// then expert 1's, ...) and as LinearWeights on the host (h1, h3, h2) and on the device (d1, d3, d2).
struct ExpertFfns {
    std::vector<HostWeight> hw;
    std::vector<LinearWeight> h1, h3, h2, d1, d3, d2;
    int64_t d() const { return h1[0].cols; }
    int64_t inter() const { return h1[0].rows; }
    // Fills the lists from hw, each weight copied to `gpu` (the copies kept in `storage`).
    void place(Backend& gpu, std::vector<Tensor>* storage) {
        for (size_t i = 0; i < hw.size(); ++i) {
            const LinearWeight dev = to_backend(gpu, hw[i].w, storage);
            (i % 3 == 0 ? h1 : i % 3 == 1 ? h3 : h2).push_back(hw[i].w);
            (i % 3 == 0 ? d1 : i % 3 == 1 ? d3 : d2).push_back(dev);
        }
    }
};

// `tokens` tokens' k distinct expert ids of e, each token's ascending (as moe_route leaves them); with hot >= 0,
// every token picks expert `hot` (one expert with as many rows as tokens).
inline std::vector<int32_t> routed_ids(std::mt19937& rng, int64_t tokens, int64_t e, int64_t k, int32_t hot = -1) {
    std::vector<int32_t> ids, all(e);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < tokens; ++t) {
        std::shuffle(all.begin(), all.end(), rng);
        if (hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), hot));
        std::vector<int32_t> row(all.begin(), all.begin() + k);
        std::sort(row.begin(), row.end());
        ids.insert(ids.end(), row.begin(), row.end());
    }
    return ids;
}

// SwiGLU as Backend::swiglu computes it in fp32: silu(min(g, limit)) * clamp(u, +-limit), no clamp where limit <= 0.
inline float swiglu(float g, float u, float limit) {
    if (limit > 0) {
        g = std::fmin(g, limit);
        u = std::fmin(std::fmax(u, -limit), limit);
    }
    return g / (1.0f + std::exp(-g)) * u;
}

// The first row of each run of `counts` rows, and the total at the end (grouped_experts' run starts).
inline std::vector<int64_t> run_starts(const std::vector<int64_t>& counts) {
    std::vector<int64_t> s{0};
    for (int64_t n : counts) s.push_back(s.back() + n);
    return s;
}

// Slots of expert runs addressed by pointer, as grouped_experts_rows takes them: slot i reads token row token_of[i] of
// x [tokens, d] and writes row out_at[i] (a shuffle) of out [rows, d]; `gathered` holds the slots' input rows in
// order. place() puts x, out and the two pointer arrays on `gpu`.
struct SlotRows {
    int64_t rows = 0, d = 0;
    std::vector<int64_t> token_of, out_at;
    std::vector<float> gathered;
    Tensor x, out, in_ptrs, out_ptrs;  // on the device, after place()

    SlotRows(std::mt19937& rng, const std::vector<int64_t>& counts, const std::vector<float>& xv, int64_t tokens,
             int64_t width)
        : d(width) {
        for (int64_t n : counts) rows += n;
        token_of.resize(rows);
        out_at.resize(rows);
        for (int64_t i = 0; i < rows; ++i) token_of[i] = static_cast<int64_t>(rng() % tokens), out_at[i] = i;
        std::shuffle(out_at.begin(), out_at.end(), rng);
        gathered.resize(rows * d);
        for (int64_t i = 0; i < rows; ++i) std::copy_n(xv.begin() + token_of[i] * d, d, gathered.begin() + i * d);
    }
    void place(Backend& gpu, const std::vector<float>& xv) {
        const int64_t tokens = static_cast<int64_t>(xv.size()) / d;
        x = gpu.alloc(DType::kF32, Shape{tokens, d});
        out = gpu.alloc(DType::kF32, Shape{rows, d});
        gpu.upload(x, xv.data());
        std::vector<float*> in(rows), outp(rows);
        for (int64_t i = 0; i < rows; ++i) in[i] = x.f32() + token_of[i] * d, outp[i] = out.f32() + out_at[i] * d;
        in_ptrs = gpu.alloc(DType::kI64, Shape{rows});
        out_ptrs = gpu.alloc(DType::kI64, Shape{rows});
        gpu.upload(in_ptrs, in.data());
        gpu.upload(out_ptrs, outp.data());
    }
    // How many slots' output rows (of `got`, laid out as out) differ from row i of `in_order` bit for bit.
    int64_t mismatched(const std::vector<float>& got, const std::vector<float>& in_order) const {
        int64_t n = 0;
        for (int64_t i = 0; i < rows; ++i)
            n += std::memcmp(got.data() + out_at[i] * d, in_order.data() + i * d, d * 4) != 0;
        return n;
    }
};

}  // namespace deepinfer::testing_support
