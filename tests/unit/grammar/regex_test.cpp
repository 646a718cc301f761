// Regex front end: accept/reject tables checked against PCRE2, differential fuzzing, bad input.
#include <gtest/gtest.h>

#include <random>

#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::pcre2_full_match;

GrammarCompiler& compiler() { return testing::small_compiler(); }

struct RegexCase {
    std::string pattern;
    std::vector<std::string> accept;
    std::vector<std::string> reject;
};

const std::vector<RegexCase>& cases() {
    static const std::vector<RegexCase> k = {
        {"abc", {"abc"}, {"", "ab", "abcd", "Abc"}},
        {"a|b|cd", {"a", "b", "cd"}, {"", "c", "ab", "bcd"}},
        {"[a-z]+", {"a", "hello"}, {"", "Hello", "a1"}},
        {"\\d{3}-\\d{4}", {"555-1234"}, {"55-1234", "5551234", "555-12345", "\xd9\xa1\xd9\xa2\xd9\xa3-1234"}},
        {"(ab)*c?", {"", "ab", "abab", "c", "ababc"}, {"a", "abc c", "ba"}},
        {".*", {"", "x", "h\xc3\xa9llo \xe4\xb8\xad\xf0\x9f\x98\x80", "\r"}, {"\n", "a\nb", "\xff", "\xc3"}},
        {"[^a-c]", {"d", "\xc3\xa9", "\n"}, {"a", "b", "", "dd"}},
        {"x{2,4}", {"xx", "xxx", "xxxx"}, {"x", "xxxxx"}},
        {"x{2,}", {"xx", "xxxxxxxxxxxxxx"}, {"x", ""}},
        {"x{0}y", {"y"}, {"xy"}},
        {"(?:foo|bar){1,2}baz", {"foobaz", "barfoobaz"}, {"baz", "foobarbarbaz"}},
        {"\\p{L}+", {"abc", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87"}, {"a1", "", "a b"}},
        {"\\p{Lu}\\P{Lu}", {"Ab", "\xc3\x89x"}, {"AB", "aa"}},
        {"[\\u00e9-\\u00ff]", {"\xc3\xa9", "\xc3\xbf"}, {"e", "\xc4\x80"}},
        {"\\u{1F600}|\\uD83D\\uDE01", {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x81"}, {"\xf0\x9f\x98\x82"}},
        {"^abc$", {"abc"}, {"abc\n", "xabc"}},
        {"a{", {"a{"}, {"a"}},
        {"a{1,x}", {"a{1,x}"}, {"a"}},
        {"\\w+@\\w+\\.com", {"joe@mail.com"}, {"joe@mail.org", "@mail.com"}},
        {"(a|ab)(c|bcd)(d*)", {"abcd", "ac", "abcdd"}, {"abd", ""}},
        {"[\\s\\S]", {"\n", "a", "\xe2\x80\xa8"}, {"", "ab"}},
        {"\\s+", {" ", "\t\n\r\v\f", "\xc2\xa0\xe3\x80\x80"}, {"", "a"}},
        {"[\\d.+-]+", {"1.5", "+-3"}, {"1e5"}},
        {"\\x41\\t\\cJ", {"A\t\n"}, {"A\tJ"}},
        {"[a\\-z]", {"a", "-", "z"}, {"b"}},
        {"[-a]|[a-]", {"-", "a"}, {"b"}},
        {"\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\/\\^\\$", {".*+?()[]{}|\\/^$"}, {""}},
        {"(?<year>\\d{4})-(?P<m>\\d\\d)", {"2024-01"}, {"2024-1"}},
        {"colou?r", {"color", "colour"}, {"colouur"}},
        {"[^]", {"\n", "x"}, {""}},
        {"(|a)b", {"b", "ab"}, {"aab"}},
        {"a+?b*?", {"a", "aab"}, {"b"}},
        {"\xe4\xb8\xad+", {"\xe4\xb8\xad\xe4\xb8\xad"}, {"\xe4\xb8"}},
        {"[\xc3\xa9\xe4\xb8\xad]", {"\xc3\xa9", "\xe4\xb8\xad"}, {"e"}},
        {"(a|b|c|d|e|f|g|h){3}[0-9]{2,3}", {"abc12", "hhh999"}, {"ab12", "abcd12"}},
    };
    return k;
}

TEST(Regex, AcceptRejectTablesAgreeWithPcre2) {
    for (const RegexCase& c : cases()) {
        auto g = compiler().compile_regex(c.pattern);
        for (const auto& s : c.accept) {
            EXPECT_TRUE(matches(g, s)) << "/" << c.pattern << "/ should accept '" << s << "'";
            EXPECT_TRUE(pcre2_full_match(c.pattern, s)) << "PCRE2 disagrees: /" << c.pattern << "/ '" << s << "'";
        }
        for (const auto& s : c.reject) {
            EXPECT_FALSE(matches(g, s)) << "/" << c.pattern << "/ should reject '" << s << "'";
            if (s.find('\xff') == std::string::npos && s != "\xc3" && s != "\xe4\xb8") {
                EXPECT_FALSE(pcre2_full_match(c.pattern, s)) << "PCRE2 disagrees: /" << c.pattern << "/ '" << s << "'";
            }
        }
    }
}

// Random strings over a small alphabet: the grammar and PCRE2 must agree on every one.
TEST(Regex, DifferentialFuzzAgainstPcre2) {
    const std::vector<std::string> patterns = {"(a|ab)*b?c{1,3}",
                                               "[a-c]+(\\.[a-c]{2})?",
                                               "(?:a|b)*a(?:a|b){2}",
                                               "a*b*c*|c*b*a*",
                                               "((ab|ba)+|c)?d",
                                               "[^b]*b[^b]*",
                                               ".{2,4}",
                                               "(a?){3}b",
                                               "\\d+(\\.\\d*)?([eE][+-]?\\d+)?",
                                               "[ab\\n]*\\n",
                                               "(a|b)*abb",
                                               "\xc3\xa9+[^\xc3\xa9]"};
    const std::vector<std::string> alphabet = {"a", "b", "c", "d", ".", "1", "9", "e", "+", "-", "\n", "\xc3\xa9", "E"};
    std::mt19937 rng(1234);
    for (const auto& p : patterns) {
        auto g = compiler().compile_regex(p);
        for (int i = 0; i < 400; ++i) {
            std::string s;
            int len = static_cast<int>(rng() % 8);
            for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
            ASSERT_EQ(matches(g, s), pcre2_full_match(p, s)) << "/" << p << "/ on '" << s << "'";
        }
    }
}

TEST(Regex, BadInputReportsOffsetAndReason) {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"(ab", "offset 0: unterminated group"},
        {"ab)", "offset 2: unmatched ')'"},
        {"[a-", "unterminated character class"},
        {"a**", "nothing to repeat"},
        {"*a", "offset 0: nothing to repeat"},
        {"(?=a)b", "lookaround assertions are not supported"},
        {"(a)\\1", "backreferences are not supported"},
        {"a{3,2}", "m < n"},
        {"\\p{Foo}", "unsupported Unicode property"},
        {"a\\bc", "word boundary"},
        {"\\q", "unsupported escape"},
        {"a$b", "'$' is only supported at the end"},
        {"a^b", "'^' is only supported at the start"},
        {"[z-a]", "out of order"},
        {"a{100001}", "repetition count above"},
    };
    for (const auto& [pattern, why] : bad) {
        try {
            compiler().compile_regex(pattern);
            ADD_FAILURE() << "/" << pattern << "/ compiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << "/" << pattern << "/: " << e.what();
        }
    }
}

TEST(Regex, StateLimitAndTimeLimitAreEnforced) {
    CompileOptions o;
    o.max_states = 1000;
    try {
        compiler().compile_regex("(a|b)*a(a|b){12}", o);  // 2^13 DFA states
        ADD_FAILURE() << "compiled past the state limit";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("max_states"), std::string::npos) << e.what();
    }
    o.max_states = 10000000;
    o.max_compile_ms = 1;
    EXPECT_THROW(compiler().compile_regex("(a|b)*a(a|b){18}", o), Error);
}

}  // namespace
}  // namespace deepinfer::grammar
