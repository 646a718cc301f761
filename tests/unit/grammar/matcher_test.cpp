// Matcher: masks against brute force (accept + rollback of every token), rollback, termination,
// forced tokens, the compile cache.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::brute_force_tokens;
using testing::mask_tokens;
using testing::small_vocab;

GrammarCompiler& compiler() { return testing::small_compiler(); }

// Walks `text` token by token (greedy tokenization); at every step the mask must equal brute force.
void check_walk(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    auto toks = testing::greedy_tokenize(*small_vocab(), text);
    for (size_t i = 0; i <= toks.size(); ++i) {
        auto fast = mask_tokens(m);
        auto slow = brute_force_tokens(m);
        ASSERT_EQ(fast, slow) << "mask differs from brute force after " << i << " tokens of '" << text << "'\n"
                              << g->describe();
        if (i == toks.size()) break;
        ASSERT_TRUE(m.accept(toks[i])) << "token " << i << " of '" << text << "' rejected";
    }
    EXPECT_TRUE(m.can_terminate()) << text;
    int32_t eos = small_vocab()->stop_ids()[0];
    EXPECT_TRUE(m.accept(eos));
    EXPECT_TRUE(m.is_terminated());
    EXPECT_EQ(mask_tokens(m), std::vector<int32_t>{eos});
    EXPECT_FALSE(m.accept(toks.empty() ? 'a' : toks[0]));
}

TEST(Matcher, MaskEqualsBruteForceOnRegexes) {
    check_walk(compiler().compile_regex("abc|abd"), "abd");
    check_walk(compiler().compile_regex("[a-z]+[0-9]*"), "hello123");
    check_walk(compiler().compile_regex("(ab|ba)*"), "abbaab");
    check_walk(compiler().compile_regex("\"[^\"]*\"(,|:)?"), "\"name\":");
    check_walk(compiler().compile_regex(".*"), "h\xc3\xa9llo \xe4\xb8\xad");
    check_walk(compiler().compile_regex("(yes|no|maybe)"), "maybe");
    check_walk(compiler().compile_regex("x{0,3}"), "");
}

TEST(Matcher, MaskEqualsBruteForceOnRecursiveGrammars) {
    // Balanced brackets and nested lists exercise calls, returns and leftover suffixes.
    auto g = compiler().compile_ebnf(R"G(root ::= item ("," item)*
item ::= "[" (root)? "]" | [a-z]+ | "\"" [^"]* "\"")G");
    check_walk(g, "[a,[b,[]],\"x,y\"],c");
    check_walk(g, "[[[[]]]]");
    auto e = compiler().compile_ebnf(R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor)G");
    check_walk(e, "12*(3+4)-(5/(6))");
}

TEST(Matcher, RollbackRestoresEarlierStates) {
    auto g = compiler().compile_regex("(ab|ba)+c");
    GrammarMatcher m(g);
    auto toks = testing::greedy_tokenize(*small_vocab(), "abbac");
    std::vector<std::vector<int32_t>> masks;
    for (int32_t t : toks) {
        masks.push_back(mask_tokens(m));
        ASSERT_TRUE(m.accept(t));
    }
    EXPECT_TRUE(m.can_terminate());
    for (int k = static_cast<int>(toks.size()) - 1; k >= 0; --k) {
        m.rollback(1);
        EXPECT_EQ(mask_tokens(m), masks[k]) << "after rolling back to step " << k;
    }
    EXPECT_EQ(m.num_steps(), 0);
    EXPECT_THROW(m.rollback(1), Error);
    // Rejected tokens leave the state unchanged.
    ASSERT_TRUE(m.accept_bytes("ab"));
    EXPECT_FALSE(m.accept_bytes("x"));
    EXPECT_FALSE(m.accept(small_vocab()->stop_ids()[0]));
    EXPECT_EQ(m.num_steps(), 1);
    EXPECT_TRUE(m.accept_bytes("c"));
    EXPECT_TRUE(m.accept(small_vocab()->stop_ids()[0]));
    m.rollback(2);
    EXPECT_FALSE(m.is_terminated());
    EXPECT_FALSE(m.can_terminate());
}

TEST(Matcher, ForcedBytesAndTokens) {
    auto g = compiler().compile_regex("hello(world|there)");
    GrammarMatcher m(g);
    EXPECT_EQ(m.forced_bytes(), "hello");
    EXPECT_FALSE(m.forced_token().has_value());  // "h", "hello" both fit
    ASSERT_TRUE(m.accept_bytes("hello"));
    EXPECT_EQ(m.forced_bytes(), "");
    ASSERT_TRUE(m.accept_bytes("the"));
    EXPECT_EQ(m.forced_bytes(), "re");
    ASSERT_TRUE(m.accept_bytes("r"));
    auto t = m.forced_token();
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(small_vocab()->token(*t), "e");
    ASSERT_TRUE(m.accept(*t));
    EXPECT_EQ(m.forced_token(), small_vocab()->stop_ids()[0]);
    EXPECT_EQ(m.min_completion_bytes(), 0);

    GrammarMatcher m2(compiler().compile_regex("a{5}b*"));
    EXPECT_EQ(m2.min_completion_bytes(), 5);
    ASSERT_TRUE(m2.accept_bytes("aa"));
    EXPECT_EQ(m2.min_completion_bytes(), 3);
}

TEST(Matcher, SpecialAndPaddingTokensNeverAllowed) {
    auto g = compiler().compile_regex(".*");
    GrammarMatcher m(g);
    auto allowed = mask_tokens(m);
    int32_t eos = small_vocab()->stop_ids()[0];
    EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), eos) != allowed.end());  // empty text is complete
    for (int32_t id = eos + 1; id < small_vocab()->size(); ++id) {
        EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), id) == allowed.end()) << id;
    }
    EXPECT_FALSE(m.accept(small_vocab()->size() - 1));
    EXPECT_FALSE(m.accept(-3));
}

TEST(Matcher, ApplyTokenMask) {
    std::vector<uint32_t> mask(2, 0);
    mask[0] = 0b101;
    mask[1] = 1;
    std::vector<float> logits(40, 1.0f);
    apply_token_mask(logits.data(), 40, mask.data());
    for (int i = 0; i < 40; ++i) {
        bool allowed = i == 0 || i == 2 || i == 32;
        EXPECT_EQ(std::isinf(logits[i]), !allowed) << i;
    }
}

TEST(Matcher, CompileCacheReturnsSameGrammar) {
    GrammarCompiler c(small_vocab(), 2);
    auto a = c.compile_regex("abc");
    auto b = c.compile_regex("abc");
    EXPECT_EQ(a.get(), b.get());
    EXPECT_EQ(c.cache_hits(), 1u);
    CompileOptions o;
    o.strict = true;
    EXPECT_NE(c.compile_regex("abc", o).get(), a.get());  // options are part of the key
    c.compile_regex("x");
    c.compile_regex("y");  // evicts "abc"
    EXPECT_NE(c.compile_regex("abc").get(), a.get());
    EXPECT_EQ(c.cache_misses(), 5u);
}

// Matchers on several threads share one compiled grammar whose mask caches fill lazily (and
// concurrently): every thread must see exactly the single-threaded masks.
TEST(Matcher, ConcurrentMatchersShareLazyCaches) {
    const std::string schema =
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "tags": {"type": "array", "items": {"enum": ["ab", "ba"]}}}})";
    const std::vector<std::string> texts = {"{\"name\": \"hello\", \"tags\": [\"ab\"]}", "{\"tags\": [], \"x\": 12}",
                                            "{\"name\": \"\\n\\\"\", \"aaa\": null}", "{}"};
    // Reference masks from a separate compiler (its own caches), single-threaded.
    GrammarCompiler ref_compiler(small_vocab());
    auto ref = ref_compiler.compile_json_schema(schema);
    std::vector<std::vector<std::vector<int32_t>>> expected;
    for (const auto& t : texts) {
        GrammarMatcher m(ref);
        std::vector<std::vector<int32_t>> masks;
        for (int32_t tok : testing::greedy_tokenize(*small_vocab(), t)) {
            masks.push_back(mask_tokens(m));
            m.accept(tok);
        }
        expected.push_back(masks);
    }
    GrammarCompiler shared(small_vocab());
    std::vector<std::thread> threads;
    std::vector<int> failures(4, 0);
    for (int th = 0; th < 4; ++th) {
        threads.emplace_back([&, th] {
            auto g = shared.compile_json_schema(schema);  // concurrent compiles and cache hits
            for (int round = 0; round < 3; ++round) {
                for (size_t k = 0; k < texts.size(); ++k) {
                    size_t i = (k + th) % texts.size();
                    GrammarMatcher m(g);
                    auto toks = testing::greedy_tokenize(*small_vocab(), texts[i]);
                    for (size_t j = 0; j < toks.size(); ++j) {
                        if (mask_tokens(m) != expected[i][j]) failures[th]++;
                        m.accept(toks[j]);
                    }
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    for (int th = 0; th < 4; ++th) EXPECT_EQ(failures[th], 0) << "thread " << th;
}

TEST(Matcher, ChoiceGrammar) {
    auto g = compiler().compile_choice({"yes", "no", "maybe", "ye"});
    EXPECT_TRUE(testing::matches(g, "ye"));
    EXPECT_TRUE(testing::matches(g, "maybe"));
    EXPECT_FALSE(testing::matches(g, "yess"));
    EXPECT_FALSE(testing::matches(g, ""));
    check_walk(g, "yes");
    EXPECT_THROW(compiler().compile_choice({}), Error);
}

TEST(Matcher, SoArgsParsing) {
    auto s = parse_so_args(R"({"type": "json_schema", "value": {"type": "integer"}, "strict": true})");
    EXPECT_EQ(s.kind, GrammarKind::kJsonSchema);
    EXPECT_TRUE(s.options.strict);
    EXPECT_EQ(s.value, R"({"type":"integer"})");
    s = parse_so_args(R"({"type": "choice", "value": ["a", "b"]})");
    EXPECT_EQ(s.choices, (std::vector<std::string>{"a", "b"}));
    s = parse_so_args(R"({"type": "json_object", "whitespace": "compact"})");
    EXPECT_TRUE(s.options.compact_json);
    EXPECT_THROW(parse_so_args(R"({"type": "xml"})"), Error);
    EXPECT_THROW(parse_so_args(R"({"type": "regex", "value": 3})"), Error);
    EXPECT_THROW(parse_so_args("{"), Error);
}

}  // namespace
}  // namespace deepinfer::grammar
