#include "model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "deepinfer/error.h"

namespace deepinfer {

namespace {

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Fills out[0, n) with map(random byte), in 4 MiB chunks spread over the cores: full-width expert tensors
// are gigabytes, and one core would take minutes.
template <typename T, typename Map>
void fill_from_bytes(T* out, size_t n, uint64_t seed, Map map) {
    constexpr size_t kChunk = size_t{1} << 22;
    const size_t chunks = (n + kChunk - 1) / kChunk;
    auto work = [&](size_t first, size_t step) {
        for (size_t c = first; c < chunks; c += step) {
            uint64_t state = seed ^ (0xd1b54a32d192ed03ull * (c + 1));
            const size_t end = std::min(n, (c + 1) * kChunk);
            for (size_t i = c * kChunk; i < end;) {
                uint64_t bits = splitmix64(state);
                for (int b = 0; b < 8 && i < end; ++b, ++i, bits >>= 8) out[i] = map(static_cast<uint8_t>(bits));
            }
        }
    };
    const size_t threads = std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
    if (threads <= 1) {
        work(0, 1);
        return;
    }
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work, t, threads);
    for (std::thread& t : pool) t.join();
}

// 256 draws of N(0, 1), so that a random byte picks a normally distributed value.
std::vector<float> normal_table(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> t(256);
    for (float& v : t) v = normal(rng);
    return t;
}

// E8M0 byte for the power of two nearest to x > 0.
uint8_t e8m0_near(double x) {
    const int e = static_cast<int>(std::lround(std::log2(x)));
    return static_cast<uint8_t>(std::clamp(127 + e, 1, 254));
}

Tensor bf16_normal(Shape shape, float stddev, uint64_t seed) {
    Tensor t(DType::kBF16, shape);
    std::vector<uint16_t> table(256);
    const std::vector<float> normal = normal_table(seed);
    for (int i = 0; i < 256; ++i) table[i] = f32_to_bf16(normal[i] * stddev);
    fill_from_bytes(t.as<uint16_t>(), static_cast<size_t>(t.numel()), seed, [&](uint8_t b) { return table[b]; });
    return t;
}

}  // namespace

uint64_t tensor_seed(uint64_t model_seed, const std::string& name) {
    uint64_t h = 1469598103934665603ull ^ model_seed;  // FNV-1a over the name
    for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
    return h;
}

ReleaseFormat release_format(const std::string& base) {
    // Routed experts are FP4; the attention projections and the shared expert FP8 (128x128 blocks); the
    // embedding, head, router, compressors and indexer weight projection stay BF16.
    if (base.find(".experts.") != std::string::npos) return ReleaseFormat::kFp4Group;
    for (const char* fp8 : {"attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b", "indexer.wq_b",
                            "shared_experts.w1", "shared_experts.w2", "shared_experts.w3"})
        if (ends_with(base, fp8)) return ReleaseFormat::kFp8Block;
    return ReleaseFormat::kBF16;
}

std::vector<NamedTensor> random_matrix(const std::string& base, int64_t rows, int64_t cols, ReleaseFormat format,
                                       int fp8_block_rows, int fp8_block_cols, uint64_t seed) {
    DI_CHECK(rows > 0 && cols > 0, "random weight ", base, " has shape [", rows, ", ", cols, "]");
    const double stddev = 1.0 / std::sqrt(static_cast<double>(cols));
    std::vector<NamedTensor> out;
    switch (format) {
        case ReleaseFormat::kBF16:
            out.push_back({base + ".weight", bf16_normal(Shape{rows, cols}, static_cast<float>(stddev), seed)});
            break;
        case ReleaseFormat::kFp8Block: {
            // Stored values ~N(0, 8) (well inside e4m3's +-448), scaled down by a power-of-two block scale.
            constexpr double kStoredStd = 8.0;
            Tensor w(DType::kF8E4M3, Shape{rows, cols});
            std::vector<uint8_t> table(256);
            const std::vector<float> normal = normal_table(seed);
            for (int i = 0; i < 256; ++i) table[i] = f32_to_f8e4m3(normal[i] * static_cast<float>(kStoredStd));
            fill_from_bytes(w.as<uint8_t>(), static_cast<size_t>(w.numel()), seed, [&](uint8_t b) { return table[b]; });
            const int64_t br = (rows + fp8_block_rows - 1) / fp8_block_rows, bc = (cols + fp8_block_cols - 1) / fp8_block_cols;
            Tensor scale(DType::kE8M0, Shape{br, bc});
            std::fill_n(scale.as<uint8_t>(), br * bc, e8m0_near(stddev / kStoredStd));
            out.push_back({base + ".weight", std::move(w)});
            out.push_back({base + ".scale", std::move(scale)});
            break;
        }
        case ReleaseFormat::kFp4Group: {
            // Uniform e2m1 codes have a standard deviation of sqrt(68.5 / 8) ~ 2.93. Groups of 32 inputs as
            // released; narrower (even) groups for toy widths that 32 does not divide.
            int kGroup = 32;
            while (cols % kGroup != 0 && kGroup > 2) kGroup /= 2;
            DI_CHECK(cols % kGroup == 0, "FP4 weight ", base, " needs an even in_features, got ", cols);
            Tensor w(DType::kI8, Shape{rows, cols / 2});
            fill_from_bytes(w.as<uint8_t>(), static_cast<size_t>(w.numel()), seed, [](uint8_t b) { return b; });
            Tensor scale(DType::kE8M0, Shape{rows, cols / kGroup});
            std::fill_n(scale.as<uint8_t>(), scale.numel(), e8m0_near(stddev / std::sqrt(68.5 / 8)));
            out.push_back({base + ".weight", std::move(w)});
            out.push_back({base + ".scale", std::move(scale)});
            break;
        }
    }
    return out;
}

Tensor random_float_tensor(const std::string& name, Shape shape, uint64_t seed) {
    Tensor t(DType::kBF16, shape);
    auto fill = [&](float v) { std::fill_n(t.as<uint16_t>(), t.numel(), f32_to_bf16(v)); };
    if (ends_with(name, "norm.weight")) fill(1.0f);
    else if (ends_with(name, "bias") || ends_with(name, "attn_sink") || ends_with(name, "base")) fill(0.0f);
    else if (ends_with(name, "scale")) fill(1.0f);  // mHC logit scales
    else {
        // Projections (mHC fn: [rows, in]) get 1/sqrt(in); other tensors small values.
        const double stddev = shape.ndim == 2 ? 1.0 / std::sqrt(static_cast<double>(shape[1])) : 0.02;
        return bf16_normal(shape, static_cast<float>(stddev), seed);
    }
    return t;
}

Tensor random_index_table(int64_t rows, int64_t k, int32_t bound, uint64_t seed) {
    DI_CHECK(k <= bound, "cannot draw ", k, " distinct values below ", bound);
    Tensor t(DType::kI32, Shape{rows, k});
    uint64_t state = seed;
    int32_t* p = t.as<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < k; ++j) {
            int32_t v;
            do v = static_cast<int32_t>(splitmix64(state) % static_cast<uint64_t>(bound));
            while (std::find(p + r * k, p + r * k + j, v) != p + r * k + j);
            p[r * k + j] = v;
        }
    }
    return t;
}

}  // namespace deepinfer
