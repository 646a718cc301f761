#include "test_util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "deepinfer/error.h"
#include "grammar/token_trie.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar::testing {

GrammarCompiler& small_compiler() {
    static GrammarCompiler c(small_vocab());
    return c;
}

std::shared_ptr<const Vocabulary> small_vocab() {
    static std::shared_ptr<const Vocabulary> v = [] {
        std::vector<std::string> toks;
        for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
        for (const char* s :
             {"\"",    "\",",    "\":",  "{\"",      "\"}",    " \"",   "\"\n",         "\n",       "  ",
              "    ",  "\n  ",   "true", "false",    "null",   "12",    "123",          "0.",       ".5",
              "-1",    "e+",     "abc",  "name",     "\": \"", ", \"",  "\":\"",        "}",        "]}",
              "[{",    "[]",     "{}",   "\\\"",     "\\n",    "\\u00", "ab",           "ba",       "aa",
              "aaa",   "a1",     "1a",   "\xc3\xa9", "\xc3",   "\xa9",  "\xe4\xb8\xad", "\xe4\xb8", "\xf0\x9f\x98\x80",
              "hello", " world", "20",   "2024-",    "-01",    "T12:",  ":00",          "Z\"",      "@",
              ".com",  "http",   "://",  "xyz\"",    "\"x",    "=\"",   "<a",           "/>",       "::=",
              "()",    " | ",    "yes",  "no",       "ye",     "maybe"}) {
            toks.push_back(s);
        }
        toks.push_back("\"");  // a duplicate text with another id
        toks.push_back("<eos>");
        int32_t eos = static_cast<int32_t>(toks.size()) - 1;
        return Vocabulary::create(std::move(toks), {eos}, {}, eos + 7);  // padded mask
    }();
    return v;
}

const Tokenizer* deepseek_tokenizer() {
    static std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
        std::string path = std::string(DI_TEST_DATA_DIR) + "/tokenizer/deepseek_v4/tokenizer.json.gz";
        if (!std::filesystem::exists(path)) return nullptr;
        return std::make_unique<Tokenizer>(Tokenizer::from_file(path));
    }();
    return tok.get();
}

std::shared_ptr<const Vocabulary> deepseek_vocab() {
    static std::shared_ptr<const Vocabulary> v = []() -> std::shared_ptr<const Vocabulary> {
        const Tokenizer* tok = deepseek_tokenizer();
        if (!tok) return nullptr;
        return Vocabulary::from_tokenizer(*tok, std::nullopt, 129280);  // the model's vocabulary size
    }();
    return v;
}

std::vector<int32_t> mask_tokens(GrammarMatcher& m) {
    const Vocabulary& v = m.grammar().vocab();
    std::vector<uint32_t> mask(v.mask_words(), 0xDEADBEEF);
    int32_t count = m.fill_mask(mask.data());
    std::vector<int32_t> out;
    for (int32_t i = 0; i < v.mask_words() * 32; ++i) {
        if ((mask[i >> 5] >> (i & 31)) & 1) out.push_back(i);
    }
    if (static_cast<int32_t>(out.size()) != count) out.push_back(-1);  // count mismatch shows up as a diff
    return out;
}

std::vector<int32_t> brute_force_tokens(GrammarMatcher& m) {
    const Vocabulary& v = m.grammar().vocab();
    std::vector<int32_t> out;
    for (int32_t i = 0; i < v.num_tokens(); ++i) {
        if (m.accept(i)) {
            out.push_back(i);
            m.rollback(1);
        }
    }
    return out;
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
    GrammarMatcher m(g);
    return m.accept_bytes(text) && m.can_terminate();
}

std::vector<int32_t> greedy_tokenize(const Vocabulary& v, std::string_view text) {
    const TokenTrie& t = v.trie();
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos < text.size()) {
        int32_t node = 0, best_tok = -1;
        size_t best_len = 0, len = 0;
        while (pos + len < text.size()) {
            uint8_t b = static_cast<uint8_t>(text[pos + len]);
            int32_t child = -1;
            for (int32_t c = node + 1; c < t.end[node]; c = t.end[c]) {
                if (t.byte[c] == b) {
                    child = c;
                    break;
                }
            }
            if (child < 0) break;
            node = child;
            ++len;
            if (t.tok_off[node] < t.tok_off[node + 1]) {
                best_tok = t.toks[t.tok_off[node]];
                best_len = len;
            }
        }
        DI_CHECK(best_tok >= 0, "text not tokenizable at byte ", pos);
        out.push_back(best_tok);
        pos += best_len;
    }
    return out;
}

namespace {

std::string ecmascript_to_pcre(const std::string& pattern) {
    // \s / \S in ECMAScript include Unicode spaces; spell them out for PCRE2 (which is ASCII-only
    // without UCP). Inside classes the spelled-out ranges are inserted without brackets.
    static const std::string kSpace =
        "\\t-\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}";
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < pattern.size(); ++i) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < pattern.size()) {
            char n = pattern[i + 1];
            if (n == 's') {
                out += in_class ? kSpace : "[" + kSpace + "]";
            } else if (n == 'S' && !in_class) {
                out += "[^" + kSpace + "]";
            } else if (n == 'u' && i + 2 < pattern.size() && pattern[i + 2] == '{') {
                out += "\\x";  // \u{...} -> \x{...}
            } else if (n == 'u') {
                uint32_t v = std::stoul(pattern.substr(i + 2, 4), nullptr, 16);
                i += 4;
                if (v >= 0xD800 && v <= 0xDBFF && pattern.compare(i + 2, 2, "\\u") == 0) {
                    uint32_t lo = std::stoul(pattern.substr(i + 4, 4), nullptr, 16);
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
                char buf[16];
                std::snprintf(buf, sizeof buf, "\\x{%x}", v);
                out += buf;
            } else {
                out += c;
                out += n;
            }
            ++i;
            continue;
        }
        if (c == '[' && !in_class) {
            bool neg = i + 1 < pattern.size() && pattern[i + 1] == '^';
            size_t j = i + 1 + (neg ? 1 : 0);
            if (j < pattern.size() && pattern[j] == ']') {  // ECMAScript [] and [^]
                out += neg ? "[\\s\\S]" : "(?!)";
                i = j;
                continue;
            }
            in_class = true;
            out += neg ? "[^" : "[";
            i = j - 1;
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

bool pcre2_match_impl(const std::string& pattern, std::string_view text, bool full) {
    std::string p = ecmascript_to_pcre(pattern);
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), p.size(), opts, &err, &off, nullptr);
    DI_CHECK(re != nullptr, "PCRE2 cannot compile test pattern ", p, " (error ", err, " at ", off, ")");
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
    uint32_t mopts = full ? (PCRE2_ANCHORED | PCRE2_ENDANCHORED) : 0;
    int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, mopts, md, nullptr);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

}  // namespace

bool pcre2_full_match(const std::string& pattern, std::string_view text) {
    return pcre2_match_impl(pattern, text, true);
}

bool pcre2_search(const std::string& pattern, std::string_view text) { return pcre2_match_impl(pattern, text, false); }

std::string py_dumps(const std::string& json_text) {
    return python_json_dumps(nlohmann::ordered_json::parse(json_text));
}

std::string test_data(const std::string& name) { return read_file(std::string(DI_TEST_DATA_DIR) + "/grammar/" + name); }

}  // namespace deepinfer::grammar::testing
