// Internal: the front ends that lower user grammars to the IR.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/ir.h"

namespace deepinfer::grammar {

struct Lowered {
    Grammar grammar;
    std::vector<std::string> warnings;
};

// How regex characters become bytes.
enum class RegexContext {
    kText,        // the text itself (UTF-8)
    kJsonString,  // the inside of a JSON string literal: characters are JSON-escaped where needed
};

// Parses an ECMAScript-style regex into an expression of g. Anchors: `^` at the start and `$` at the
// end of the pattern (or of each top-level alternative) are accepted; with `search` set (JSON schema
// `pattern`), an unanchored side may be preceded/followed by any text. Throws Error with the offset
// and reason on bad or unsupported syntax.
int32_t parse_regex(Grammar& g, std::string_view pattern, RegexContext context, bool search);

// The JSON string content encoding of one character set (escapes for '"', '\\' and controls).
int32_t json_string_chars(Grammar& g, const CharSet& set);

Lowered lower_regex(std::string_view pattern);
Lowered lower_ebnf(std::string_view text);
Lowered lower_json_schema(std::string_view schema_json, const CompileOptions& options);
Lowered lower_json_object(const CompileOptions& options);
Lowered lower_choice(const std::vector<std::string>& choices);

}  // namespace deepinfer::grammar
