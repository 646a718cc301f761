// EBNF (GBNF-style) front end: constructs, regex agreement, bad input with line/column.
#include <gtest/gtest.h>

#include <random>

#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;

GrammarCompiler& compiler() { return testing::small_compiler(); }

struct EbnfCase {
    std::string grammar;
    std::vector<std::string> accept;
    std::vector<std::string> reject;
};

TEST(Ebnf, Constructs) {
    const std::vector<EbnfCase> cases = {
        {"root ::= \"hello\" | 'world'", {"hello", "world"}, {"hell", "helloworld"}},
        {"root ::= \"a\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\"", {"a\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80"}, {"a"}},
        {"root ::= [a-c] [^a-c\\n] [\\x30-\\x39\\u4e2d]", {"ax0", "b\xc3\xa9\xe4\xb8\xad"}, {"aa0", "a\n0", "ad"}},
        {"root ::= . .", {"ab", "\n\xe4\xb8\xad"}, {"a", "abc"}},
        {"root ::= (\"ab\" | \"c\")* \"d\"+ \"e\"?", {"d", "abcdd", "cde"}, {"", "abe", "dee"}},
        {"root ::= \"x\"{3} \"y\"{1,} \"z\"{0,2}", {"xxxy", "xxxyyyzz"}, {"xxy", "xxxyzzz"}},
        {"# a comment\nroot ::= item   # trailing comment\n  (\",\" item)*\n\nitem ::= [0-9]+\n",
         {"1", "12,3,456"},
         {"", "1,", ",1"}},
        {"root ::= /[a-z]+\\d?/ \"!\"", {"abc!", "a1!"}, {"!", "A!"}},
        {"root ::= \"(\" root \")\" | \"\"", {"", "()", "((()))"}, {"(()", ")("}},
        {"root ::= list\nlist ::= \"[\" (value (\",\" value)*)? \"]\"\nvalue ::= list | [0-9]",
         {"[]", "[1,[2,[]],3]"},
         {"[1,]", "[[]"}},
        {"root ::= a b\na ::= \"x\"?\nb ::= \"y\"?", {"", "x", "y", "xy"}, {"yx"}},
        {"root-rule ::= \"a\"\nroot ::= root-rule rule_2\nrule_2 ::= \"b\"", {"ab"}, {"a"}},
    };
    for (const auto& c : cases) {
        std::shared_ptr<const CompiledGrammar> g;
        ASSERT_NO_THROW(g = compiler().compile_ebnf(c.grammar)) << c.grammar;
        for (const auto& s : c.accept) EXPECT_TRUE(matches(g, s)) << c.grammar << "\nshould accept: " << s;
        for (const auto& s : c.reject) EXPECT_FALSE(matches(g, s)) << c.grammar << "\nshould reject: " << s;
    }
}

// A regular grammar written as EBNF agrees with PCRE2 on the equivalent regex.
TEST(Ebnf, AgreesWithEquivalentRegex) {
    auto g = compiler().compile_ebnf(
        "root ::= sign? int frac? exp?\nsign ::= \"-\"\nint ::= \"0\" | [1-9] [0-9]*\nfrac ::= \".\" [0-9]+\n"
        "exp ::= [eE] [+-]? [0-9]+");
    const std::string re = "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?";
    std::mt19937 rng(5);
    const std::string alphabet = "0123456789.-+eE";
    for (int i = 0; i < 2000; ++i) {
        std::string s;
        int len = static_cast<int>(rng() % 7);
        for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
        ASSERT_EQ(matches(g, s), testing::pcre2_full_match(re, s)) << s;
    }
}

TEST(Ebnf, BadInputReportsLineColumnAndReason) {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"root = \"a\"", "line 1, column 6: expected '::='"},
        {"root ::= item", "rule 'item' is used but never defined"},
        {"start ::= \"a\"", "no rule named 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
        {"root ::= \"abc", "unterminated string literal"},
        {"root ::= [a-", "unterminated character class"},
        {"root ::= \"\\q\"", "unknown escape \\q"},
        {"root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]", "left-recursive (expr -> expr)"},
        {"root ::= a\na ::= b? a \"x\" | \"z\"\nb ::= \"y\"", "left-recursive (a -> a)"},
        {"root ::= * \"a\"", "nothing to repeat"},
        {"root ::= (\"a\"", "line 1, column 10: unclosed '('"},
        {"root ::= \"a\"{3,1}", "n < m"},
        {"root ::= [z-a]", "out of order"},
        {"root ::= /(/", "regex error"},
        {"root ::= r\nr ::= \"x\" r", "matches no string"},
        {"root ::= \"a\" )", "unexpected character ')'"},
    };
    for (const auto& [text, why] : bad) {
        try {
            compiler().compile_ebnf(text);
            ADD_FAILURE() << text << "\ncompiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << text << "\n" << e.what();
        }
    }
}

}  // namespace
}  // namespace deepinfer::grammar
