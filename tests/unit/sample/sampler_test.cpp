// Token selection: Philox known answers, greedy tie rule, the sampled distribution against softmax with
// stated tolerances, and each filter's support.
#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "deepinfer/error.h"
#include "sample/philox.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswers) {
    using A4 = std::array<uint32_t, 4>;
    EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
    EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
              (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
    EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
              (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformIsInRangeAndKeyedByAllInputs) {
    double sum = 0;
    const int n = 100000;
    for (uint64_t i = 0; i < n; ++i) {
        const float u = philox_uniform(7, 0, i);
        ASSERT_GE(u, 0.0f);
        ASSERT_LT(u, 1.0f);
        sum += u;
    }
    EXPECT_NEAR(sum / n, 0.5, 0.0046);  // 5 standard deviations of the mean of 10^5 uniforms
    EXPECT_EQ(philox_uniform(7, 0, 3), philox_uniform(7, 0, 3));
    EXPECT_NE(philox_uniform(7, 0, 3), philox_uniform(8, 0, 3));
    EXPECT_NE(philox_uniform(7, 0, 3), philox_uniform(7, 1, 3));
    EXPECT_NE(philox_uniform(7, 0, 3), philox_uniform(7, 0, 4));
}

TEST(Sampler, GreedyIsArgmaxWithTheLowestIdOnTies) {
    const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
    EXPECT_EQ(argmax(l), 1);
    EXPECT_EQ(sample_token(l, SamplingOptions{}, 0), 1);
    const std::vector<float> masked = {kNegInf, kNegInf, 3.0f, kNegInf};
    EXPECT_EQ(argmax(masked), 2);
    const std::vector<float> none = {kNegInf, kNegInf};
    EXPECT_THROW(argmax(none), Error);
    SamplingOptions o;
    o.temperature = 1.0f;
    EXPECT_THROW(sample_token(none, o, 0), Error);
}

TEST(Sampler, OptionsAreValidated) {
    SamplingOptions o;
    o.temperature = -1;
    EXPECT_THROW(check_sampling_options(o), Error);
    o = {};
    o.top_p = 1.5f;
    EXPECT_THROW(check_sampling_options(o), Error);
    o = {};
    o.top_p = 0;
    EXPECT_THROW(check_sampling_options(o), Error);
    o = {};
    o.min_p = 2;
    EXPECT_THROW(check_sampling_options(o), Error);
    o = {};
    o.top_k = -3;
    EXPECT_THROW(check_sampling_options(o), Error);
}

// Frequencies of n draws (token indices 0..n-1).
std::map<int32_t, int> histogram(const std::vector<float>& logits, const SamplingOptions& o, int n) {
    std::map<int32_t, int> h;
    for (int i = 0; i < n; ++i) ++h[sample_token(logits, o, static_cast<uint64_t>(i))];
    return h;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
    double mx = -1e300, sum = 0;
    for (float x : l) mx = std::max(mx, static_cast<double>(x));
    std::vector<double> p;
    for (float x : l) sum += p.emplace_back(std::exp((x - mx) / t));
    for (double& x : p) x /= sum;
    return p;
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.2f, -1.0f, 2.0f, 0.0f, 1.5f, -3.0f};

TEST(Sampler, MatchesSoftmaxWithTemperature) {
    // Each empirical frequency within 5 standard deviations of its binomial expectation (n = 40000).
    for (float t : {0.5f, 1.0f, 2.0f}) {
        SamplingOptions o;
        o.temperature = t;
        o.seed = 42;
        const int n = 40000;
        const std::map<int32_t, int> h = histogram(kLogits, o, n);
        const std::vector<double> p = softmax(kLogits, t);
        for (size_t i = 0; i < p.size(); ++i) {
            const double expected = n * p[i], sd = std::sqrt(n * p[i] * (1 - p[i]));
            const double got = h.count(i) ? h.at(i) : 0;
            EXPECT_LE(std::fabs(got - expected), 5 * sd + 1) << "token " << i << " at T=" << t;
        }
    }
}

TEST(Sampler, FiltersRestrictTheSupport) {
    SamplingOptions o;
    o.temperature = 1.0f;
    o.seed = 3;
    // Logits by rank: 1 (2.5), 4 (2.0), 6 (1.5), 0 (1.0), 2 (0.2), 5 (0.0), 3 (-1.0), 7 (-3.0).
    o.top_k = 3;
    std::map<int32_t, int> h = histogram(kLogits, o, 5000);
    EXPECT_EQ(h.size(), 3u);
    EXPECT_TRUE(h.count(1) && h.count(4) && h.count(6));
    // top_p 0.5: p(1) = 0.40, p(4) = 0.24: the nucleus is {1, 4}.
    o.top_k = 0;
    o.top_p = 0.5f;
    h = histogram(kLogits, o, 5000);
    EXPECT_EQ(h.size(), 2u);
    EXPECT_TRUE(h.count(1) && h.count(4));
    // ... and its renormalised distribution: 0.40 / 0.64 of the draws are token 1.
    const std::vector<double> p = softmax(kLogits, 1.0);
    const double q = p[1] / (p[1] + p[4]), sd = std::sqrt(5000 * q * (1 - q));
    EXPECT_LE(std::fabs(h[1] - 5000 * q), 5 * sd);
    // min_p 0.5: tokens with probability >= half the largest: exp(l - 2.5) >= 0.5, i.e. l >= 1.807.
    o.top_p = 1.0f;
    o.min_p = 0.5f;
    h = histogram(kLogits, o, 5000);
    EXPECT_EQ(h.size(), 2u);
    EXPECT_TRUE(h.count(1) && h.count(4));
    // Masked tokens are never drawn, even at a high temperature.
    std::vector<float> masked = kLogits;
    masked[1] = masked[4] = kNegInf;
    o = {};
    o.temperature = 5.0f;
    h = histogram(masked, o, 5000);
    EXPECT_FALSE(h.count(1) || h.count(4));
    EXPECT_EQ(h.size(), 6u);
}

TEST(Sampler, DrawsDependOnlyOnSeedAndTokenIndex) {
    SamplingOptions o;
    o.temperature = 1.0f;
    o.top_p = 0.9f;
    o.seed = 11;
    std::vector<int32_t> a, b;
    for (uint64_t i = 0; i < 200; ++i) a.push_back(sample_token(kLogits, o, i));
    for (uint64_t i = 200; i-- > 0;) b.insert(b.begin(), sample_token(kLogits, o, i));  // any order
    EXPECT_EQ(a, b);
    o.seed = 12;
    std::vector<int32_t> c;
    for (uint64_t i = 0; i < 200; ++i) c.push_back(sample_token(kLogits, o, i));
    EXPECT_NE(a, c);
}

}  // namespace
}  // namespace deepinfer
