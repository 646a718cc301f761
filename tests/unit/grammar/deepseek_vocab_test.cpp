// Token-level tests on the real DeepSeek-V4 vocabulary: random walks that sample only allowed tokens
// until termination (every text must satisfy the constraint: PCRE2 full match for regexes, parse +
// validate for JSON schemas), masks against brute force at random positions, and a MaskBench subset.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/file.h"
#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar {
namespace {

std::shared_ptr<const Vocabulary> vocab() {
    auto v = testing::deepseek_vocab();
    if (!v) throw Error("tests/data/tokenizer/deepseek_v4/tokenizer.json.gz is missing");
    return v;
}

GrammarCompiler& compiler() {
    static GrammarCompiler c(vocab());
    return c;
}

// Samples a complete text: random allowed tokens at first, then tokens that bring the end closer
// (fewest bytes to completion among a few random candidates). Returns the text; fails the test
// when the walk does not terminate.
std::string random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng, int budget) {
    const Vocabulary& v = *vocab();
    GrammarMatcher m(g);
    std::vector<uint32_t> mask(v.mask_words());
    std::vector<int32_t> allowed;
    std::string text;
    int32_t stop = v.stop_ids()[0];
    for (int step = 0; step < 2000; ++step) {
        m.fill_mask(mask.data());
        allowed.clear();
        bool stop_ok = false;
        for (int32_t w = 0; w < v.mask_words(); ++w) {
            for (uint32_t x = mask[w]; x; x &= x - 1) {
                int32_t id = w * 32 + __builtin_ctz(x);
                if (id == stop) {
                    stop_ok = true;
                } else {
                    allowed.push_back(id);
                }
            }
        }
        EXPECT_EQ(stop_ok, m.can_terminate());
        if (stop_ok && (allowed.empty() || step >= budget || rng() % 4 == 0)) {
            EXPECT_TRUE(m.accept(stop));
            EXPECT_TRUE(m.is_terminated());
            return text;
        }
        if (allowed.empty()) {
            ADD_FAILURE() << "dead end after '" << text << "'";
            return text;
        }
        int32_t pick;
        if (step < budget && rng() % 2) {
            pick = allowed[rng() % allowed.size()];
        } else {
            int64_t best = INT64_MAX;
            pick = allowed[0];
            for (int k = 0; k < 24; ++k) {
                int32_t cand = allowed[rng() % allowed.size()];
                if (!m.accept(cand)) {
                    ADD_FAILURE() << "masked token " << cand << " rejected after '" << text << "'";
                    return text;
                }
                int64_t cost = m.min_completion_bytes();
                m.rollback(1);
                if (cost < best) {
                    best = cost;
                    pick = cand;
                }
            }
        }
        if (!m.accept(pick)) {
            ADD_FAILURE() << "masked token " << pick << " rejected after '" << text << "'";
            return text;
        }
        text += v.token(pick);
    }
    ADD_FAILURE() << "walk did not terminate: '" << text.substr(0, 300) << "'";
    return text;
}

TEST(DeepSeekVocab, RegexRandomWalksMatchPcre2) {
    const std::vector<std::string> patterns = {
        "[a-z]+@[a-z]+\\.(com|org)",
        "\\d{3}-\\d{3}-\\d{4}",
        "(yes|no|maybe)( because .{1,40})?",
        "\\(\\d+(, \\d+)*\\)",
        "[A-Z][a-z]*( [A-Z][a-z]*){0,3}\\.",
        "\\p{L}{2,10}",
        "(\\w+\\s?){1,8}[.!?]",
        "\\s*\\{\\s*\"k\"\\s*:\\s*-?\\d+\\s*\\}",
    };
    std::mt19937 rng(42);
    for (const auto& p : patterns) {
        auto g = compiler().compile_regex(p);
        for (int i = 0; i < 6; ++i) {
            std::string text = random_walk(g, rng, 12);
            EXPECT_TRUE(testing::pcre2_full_match(p, text)) << "/" << p << "/ produced '" << text << "'";
        }
    }
}

TEST(DeepSeekVocab, JsonSchemaRandomWalksValidate) {
    const std::vector<std::string> schemas = {
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
            "required": ["name", "age"], "additionalProperties": false})",
        R"({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "when": {"type": "string", "format": "date-time"},
            "score": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["id", "when", "score"]})",
        R"({"type": "array", "items": {"anyOf": [{"type": "integer", "multipleOf": 3}, {"type": "string", "pattern": "^[A-Z]{2,4}$"}, {"type": "null"}]},
            "minItems": 1, "maxItems": 5})",
        R"({"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}},
            "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/tree"})",
        R"({"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["kind", "x", "y"], "patternProperties": {"^meta_": {"type": "string", "minLength": 20}}, "additionalProperties": false})",
        R"({"type": "object", "properties": {"note": {"type": "string", "minLength": 3, "maxLength": 200}}, "required": ["note"]})",
    };
    std::mt19937 rng(7);
    for (const auto& s : schemas) {
        auto g = compiler().compile_json_schema(s);
        for (int i = 0; i < 5; ++i) {
            std::string text = random_walk(g, rng, 20);
            EXPECT_EQ(testing::validate_json(s, text), "") << s << "\nproduced: " << text;
        }
    }
    // json_object mode: any JSON object.
    auto g = compiler().compile_json_object();
    for (int i = 0; i < 5; ++i) {
        std::string text = random_walk(g, rng, 20);
        EXPECT_EQ(testing::validate_json(R"({"type": "object"})", text), "") << text;
    }
}

TEST(DeepSeekVocab, EbnfRandomWalksReparse) {
    auto g = compiler().compile_ebnf(R"G(root ::= call ("; " call){0,2}
call ::= name "(" (arg (", " arg)*)? ")"
name ::= [a-z] [a-z_]{0,10}
arg ::= [0-9]+ | "\"" [^"\n]{0,12} "\"" | call)G");
    std::mt19937 rng(3);
    for (int i = 0; i < 8; ++i) {
        std::string text = random_walk(g, rng, 15);
        EXPECT_TRUE(testing::matches(g, text)) << text;
    }
}

// At positions along real texts, the mask must equal brute force over all 129k tokens.
TEST(DeepSeekVocab, MasksEqualBruteForceAtSampledPositions) {
    const Tokenizer* tok = testing::deepseek_tokenizer();
    struct Case {
        std::string schema, text;
    };
    const std::vector<Case> cases = {
        {R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 64}, "year": {"type": "integer"}}, "required": ["title"]})",
         R"({"title": "The \"Great\" Gatsby — a novel", "year": 1925, "extra": {"nested": [1, 2.5e3, null]}})"},
        {R"({"type": "array", "items": {"type": "string", "format": "date"}})", R"(["2024-02-29", "1999-12-31"])"},
    };
    std::mt19937 rng(11);
    for (const auto& c : cases) {
        auto g = compiler().compile_json_schema(c.schema);
        GrammarMatcher m(g);
        std::vector<int32_t> ids = tok->encode(c.text, false);
        for (size_t i = 0; i <= ids.size(); ++i) {
            if (i % 4 == 0 || i == ids.size()) {
                ASSERT_EQ(testing::mask_tokens(m), testing::brute_force_tokens(m)) << c.schema << " at token " << i;
            }
            if (i < ids.size()) {
                ASSERT_TRUE(m.accept(ids[i])) << i;
            }
        }
    }
}

// A few hundred MaskBench schemas (tests/data/grammar/maskbench_subset.jsonl.gz), every source and
// feature: each instance goes through fill_mask/accept token by token; the token must be allowed by the
// mask exactly when accept() takes it; valid instances must be accepted, invalid ones rejected.
TEST(DeepSeekVocab, MaskBenchSubset) {
    const Tokenizer* tok = testing::deepseek_tokenizer();
    GrammarCompiler c(vocab());
    std::istringstream lines(testing::test_data("maskbench_subset.jsonl.gz"));
    std::string line;
    int schemas = 0, compiled = 0, passed = 0, false_rejects = 0, false_accepts = 0, instances = 0;
    std::vector<uint32_t> mask(vocab()->mask_words());
    while (std::getline(lines, line)) {
        auto row = nlohmann::ordered_json::parse(line);
        ++schemas;
        std::shared_ptr<const CompiledGrammar> g;
        try {
            g = c.compile_json_schema(row["schema"].dump());
        } catch (const Error& e) {
            continue;  // unsupported features are reported as errors (counted below as not passing)
        }
        ++compiled;
        bool all_ok = true;
        for (const auto& t : row["tests"]) {
            ++instances;
            std::string text = testing::py_dumps(t["data"].dump());
            std::vector<int32_t> ids = tok->encode(text, false);
            GrammarMatcher m(g);
            bool ok = true;
            for (int32_t id : ids) {
                m.fill_mask(mask.data());
                bool allowed = (mask[id >> 5] >> (id & 31)) & 1;
                bool took = m.accept(id);
                ASSERT_EQ(allowed, took) << row["id"] << ": mask and accept disagree";
                if (!took) {
                    ok = false;
                    break;
                }
            }
            ok = ok && m.can_terminate();
            bool valid = t["valid"];
            if (ok != valid) {
                all_ok = false;
                (valid ? false_rejects : false_accepts)++;
            }
        }
        passed += all_ok;
    }
    std::printf(
        "maskbench subset: %d schemas, %d compiled, %d passing all %d instances' checks; %d valid rejected, %d invalid "
        "accepted\n",
        schemas, compiled, passed, instances, false_rejects, false_accepts);
    ASSERT_EQ(schemas, 299);
    // Measured when this test was written (270 compiled, 260 passing, 15 valid instances rejected, all
    // but two for key order): keep the pass rate from regressing and never accept an invalid instance.
    EXPECT_GE(compiled, 265);
    EXPECT_GE(passed, 255);
    EXPECT_LE(false_rejects, 20);
    EXPECT_EQ(false_accepts, 0);
}

}  // namespace
}  // namespace deepinfer::grammar
