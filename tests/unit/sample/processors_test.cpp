// Logits processors (penalties, masks, logprobs) against hand-computed values, and the stop-string helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "deepinfer/error.h"
#include "sample/logits_processors.h"
#include "sample/stop_strings.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(Penalties, FollowVllmSemantics) {
    std::vector<float> l = {2.0f, -2.0f, 1.0f, 4.0f, -1.0f};
    TokenHistory h;
    const std::vector<int32_t> prompt = {0, 1, 1};
    h.set_prompt(prompt);
    h.add_output(3);
    h.add_output(3);
    h.add_output(1);
    h.add_output(99);  // outside the vocabulary: ignored
    PenaltyParams p{2.0f, 0.5f, 0.25f};
    apply_penalties(l, p, h);
    // Repetition: seen tokens 0, 1, 3 (prompt or output), once each: positive / 2, negative * 2.
    // Presence 0.5 and frequency 0.25 per output occurrence: token 3 twice, token 1 once.
    EXPECT_FLOAT_EQ(l[0], 1.0f);
    EXPECT_FLOAT_EQ(l[1], -4.0f - 0.5f - 0.25f);
    EXPECT_FLOAT_EQ(l[2], 1.0f);
    EXPECT_FLOAT_EQ(l[3], 2.0f - 0.5f - 0.5f);
    EXPECT_FLOAT_EQ(l[4], -1.0f);
    EXPECT_FALSE(PenaltyParams{}.active());
}

TEST(Masks, BitmaskAndTokenMasks) {
    std::vector<float> l(40, 1.0f);
    std::vector<uint32_t> mask = {0b1010u, 1u << 3};  // ids 1, 3, 35
    apply_token_bitmask(l, mask);
    for (int i = 0; i < 40; ++i) EXPECT_EQ(l[i] == 1.0f, i == 1 || i == 3 || i == 35) << i;
    std::vector<float> m(4, 0.0f);
    const std::vector<int32_t> ids = {2, 7, -1};
    mask_tokens(m, ids);
    EXPECT_EQ(m[2], kNegInf);
    EXPECT_EQ(m[0], 0.0f);
    // A mask shorter than the row disallows the rest.
    std::vector<float> n(40, 0.0f);
    std::vector<uint32_t> short_mask = {0xffffffffu};
    apply_token_bitmask(n, short_mask);
    EXPECT_EQ(n[31], 0.0f);
    EXPECT_EQ(n[32], kNegInf);
}

TEST(Logprobs, AreTheLogSoftmaxWithRanks) {
    const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, kNegInf};
    double sum = 0;
    for (float x : l) sum += std::exp(static_cast<double>(x));
    const TokenLogprobs r = compute_logprobs(l, 0, 3);
    EXPECT_NEAR(r.logprob, 1.0 - std::log(sum), 1e-6);
    EXPECT_EQ(r.rank, 3);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].first, 1);  // ties to the lower id
    EXPECT_EQ(r.top[1].first, 2);
    EXPECT_EQ(r.top[2].first, 0);
    EXPECT_NEAR(r.top[0].second, 3.0 - std::log(sum), 1e-6);
    EXPECT_EQ(compute_logprobs(l, 4, 0).logprob, kNegInf);
    EXPECT_TRUE(compute_logprobs(l, 1, 0).top.empty());
    EXPECT_THROW(compute_logprobs(l, 5, 0), Error);
}

TEST(StopStrings, EarliestMatchInTheNewText) {
    const std::vector<std::string> stops = {"END", "\n\n", "x"};
    EXPECT_FALSE(find_stop_string("hello world", 0, stops));
    auto m = find_stop_string("abc\n\ndefEND", 0, stops);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->pos, 3u);
    EXPECT_EQ(m->index, 1u);
    // A match straddling the old/new boundary is found; one entirely in old text is not searched again.
    m = find_stop_string(
        "abcEN"
        "D",
        5, stops);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->pos, 3u);
    EXPECT_FALSE(find_stop_string("ENDab", 4, std::vector<std::string>{"END"}));
    EXPECT_EQ(stop_string_holdback(stops), 2u);
    EXPECT_EQ(stop_string_holdback(std::vector<std::string>{}), 0u);
}

TEST(StopStrings, Utf8SafePrefix) {
    const std::string s =
        "a\xc3\xa9"
        "b\xe2\x82\xac";                    // a é b €
    EXPECT_EQ(utf8_safe_prefix(s, 2), 1u);  // inside é
    EXPECT_EQ(utf8_safe_prefix(s, 3), 3u);
    EXPECT_EQ(utf8_safe_prefix(s, 5), 4u);  // inside €
    EXPECT_EQ(utf8_safe_prefix(s, 100), s.size());
}

}  // namespace
}  // namespace deepinfer
