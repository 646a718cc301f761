// Helpers shared by the grammar tests: vocabularies, brute-force masks, PCRE2 and a small JSON
// Schema validator (the test oracle, independent of the grammar module's own code paths).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::grammar::testing {

// A synthetic vocabulary: the 256 single bytes, common JSON/word pieces, partial UTF-8, and EOS
// (the last id). Small enough for brute-force checks.
std::shared_ptr<const Vocabulary> small_vocab();
// One compiler over small_vocab(), shared by the tests (compiled grammars are immutable).
GrammarCompiler& small_compiler();

// The DeepSeek-V4 tokenizer and its vocabulary (tests/data/tokenizer/deepseek_v4), padded to the
// model's 129,280 ids.
const Tokenizer* deepseek_tokenizer();
std::shared_ptr<const Vocabulary> deepseek_vocab();

// Tokens allowed next according to fill_mask, and according to accept()+rollback() of every token.
std::vector<int32_t> mask_tokens(GrammarMatcher& m);
std::vector<int32_t> brute_force_tokens(GrammarMatcher& m);

// Whether `text` is a complete match (byte level).
bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text);

// Longest-prefix-match tokenization (any tokenization works for a byte-level matcher).
std::vector<int32_t> greedy_tokenize(const Vocabulary& v, std::string_view text);

// PCRE2 full match of an ECMAScript-style pattern (\s spelled out as ECMAScript defines it).
bool pcre2_full_match(const std::string& pattern, std::string_view text);
// PCRE2 search (JSON Schema `pattern` semantics).
bool pcre2_search(const std::string& pattern, std::string_view text);

// Validates a JSON text against a schema (the subset the grammar supports). Returns "" when valid,
// else the reason.
std::string validate_json(const std::string& schema_json, std::string_view instance_text);

// Python's json.dumps(value, ensure_ascii=False) of a JSON text (MaskBench's serialization).
std::string py_dumps(const std::string& json_text);

// Reads tests/data/grammar/<name>.
std::string test_data(const std::string& name);

}  // namespace deepinfer::grammar::testing
