// Internal: the lexical pieces of JSON grammars (whitespace, strings, numbers with bounds, formats,
// the free JSON value) shared by json_object mode and the JSON Schema front end.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/ir.h"

namespace deepinfer::grammar {

// A decimal number as written in JSON, split for digit-wise comparisons: 12.50 -> {false, "12", "5"}.
struct Decimal {
    bool negative = false;
    std::string int_digits = "0";                        // canonical: no leading zeros
    std::string frac_digits;                             // no trailing zeros
    static Decimal parse(std::string_view json_number);  // accepts exponents (1e-05)
    bool is_zero() const { return int_digits == "0" && frac_digits.empty(); }
    bool is_integer() const { return frac_digits.empty(); }
    std::string to_string() const;
};

struct StringConstraints {
    int64_t min_length = 0;
    int64_t max_length = -1;            // -1 = unbounded
    std::vector<std::string> patterns;  // ECMAScript regexes, search semantics, all must match
    std::vector<std::string> formats;   // all must hold
    bool unconstrained() const { return min_length == 0 && max_length < 0 && patterns.empty() && formats.empty(); }
};

struct NumberConstraints {
    bool integer = false;
    bool has_min = false, min_exclusive = false, has_max = false, max_exclusive = false;
    Decimal min, max;
    bool has_multiple = false;
    Decimal multiple_of;
};

class JsonLexicon {
public:
    JsonLexicon(Grammar& g, const CompileOptions& options, const BuildLimits& limits,
                std::vector<std::string>& warnings);

    int32_t ws();          // whitespace between tokens
    int32_t any_string();  // a JSON string (shared rule)
    int32_t any_value();   // any JSON value (recursive rules)
    int32_t any_number();
    int32_t exponent_opt();  // ([eE][+-]?[0-9]+)?
    int32_t any_integer();
    // A JSON string literal whose decoded value is `utf8` (escaped as json.dumps does).
    int32_t string_literal(std::string_view utf8);
    static std::string encode_string(std::string_view utf8);  // with the quotes

    // A JSON string meeting the constraints (a separate rule, memoized); nothing() when unsatisfiable.
    int32_t string(const StringConstraints& c, const std::string& path);
    // The content (between the quotes) of strings meeting the constraints, as a DFA.
    std::shared_ptr<const ByteDfa> string_content_dfa(const StringConstraints& c, const std::string& path);
    // The content language of every JSON string.
    std::shared_ptr<const ByteDfa> any_content_dfa();

    int32_t number(const NumberConstraints& c, const std::string& path);

    Grammar& grammar() { return g_; }
    const BuildLimits& limits() const { return limits_; }

private:
    int32_t content_expr(const StringConstraints& c, const std::string& path);
    int32_t format_expr(const std::string& format, const std::string& path);
    int32_t json_char();
    int32_t decimal_range(const NumberConstraints& c);
    int32_t integer_range(const NumberConstraints& c);

    Grammar& g_;
    const CompileOptions& options_;
    BuildLimits limits_;
    std::vector<std::string>& warnings_;
    int32_t ws_ = -1, string_rule_ = -1, value_rule_ = -1, json_char_ = -1;
    std::shared_ptr<const ByteDfa> any_content_;
    std::map<std::string, int32_t> string_rules_;
};

}  // namespace deepinfer::grammar
