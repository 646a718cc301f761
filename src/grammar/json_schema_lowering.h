// JSON Schema lowering (json_schema.cpp) internals, shared by its two halves: json_schema.cpp (references,
// allOf merging, combinators, 'not' rewriting, the schema walk) and json_schema_values.cpp (the typed values:
// enums and constants, strings, numbers, arrays, objects).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "grammar/frontend.h"
#include "grammar/json_lexicon.h"

namespace deepinfer::grammar::json_schema_detail {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 200;
constexpr const char* kNotValues = "x-deepinfer-not-values";        // values the instance must differ from
constexpr const char* kNotPatterns = "x-deepinfer-not-patterns";    // [{"all"|"any": [regex..]}]: must not match
constexpr const char* kNotMultiples = "x-deepinfer-not-multiples";  // numbers it must not be a multiple of

inline const std::set<std::string>& validation_keywords() {
    static const std::set<std::string> k = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
        "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
        "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "$ref", "not", "if", "then", "else",
        "dependencies", "dependentRequired", "dependentSchemas", "contains", "minContains", "maxContains",
        "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
        // Internal, produced by rewriting 'not' (lists, merged by concatenation).
        kNotValues, kNotPatterns, kNotMultiples};
    return k;
}

inline std::string escape_pointer(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~') {
            out += "~0";
        } else if (c == '/') {
            out += "~1";
        } else {
            out += c;
        }
    }
    return out;
}

inline std::string json_type_of(const Json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "boolean";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    if (v.is_number_float()) {
        double d = v.get<double>();
        return d == static_cast<double>(static_cast<int64_t>(d)) ? "integer" : "number";
    }
    if (v.is_string()) return "string";
    if (v.is_array()) return "array";
    return "object";
}

inline Decimal decimal_of(const Json& v) {
    if (v.is_number_unsigned()) return Decimal::parse(std::to_string(v.get<uint64_t>()));
    if (v.is_number_integer()) return Decimal::parse(std::to_string(v.get<int64_t>()));
    return Decimal::parse(v.dump());
}

inline int64_t utf8_length(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

inline bool dfa_matches(const ByteDfa& d, std::string_view bytes) {
    if (d.num_states == 0) return false;
    int32_t s = d.start;
    for (unsigned char c : bytes) {
        s = d.next[static_cast<size_t>(s) * 256 + c];
        if (s < 0) return false;
    }
    return d.accept[s];
}

class SchemaLowering {
public:
    SchemaLowering(const Json& root, const CompileOptions& options, Lowered& out, const BuildLimits& limits)
        : root_(root),
          options_(options),
          g_(out.grammar),
          warnings_(out.warnings),
          lex_(g_, options, limits, warnings_) {
        if (root.is_object() && root.contains("$schema") && root["$schema"].is_string()) {
            std::string s = root["$schema"];
            for (const char* d : {"draft-03", "draft-04", "draft-06", "draft-07"}) {
                if (s.find(d) != std::string::npos) ref_overrides_siblings_ = true;
            }
        }
    }

    void lower();

private:
    // References, merging, combinators and the walk (json_schema.cpp).
    [[noreturn]] void fail(const std::string& path, const std::string& why);
    const Json* own(Json j);
    const Json* resolve_pointer(const std::string& ref, const std::string& path);
    const Json* find_anchor(const Json& s, const std::string& name);
    int32_t ref_expr(const std::string& ref, const std::string& path);
    const Json* inline_ref(const Json* s, const std::string& path, int depth);
    static bool constraining(const Json& s);
    static bool needs_normalize(const Json& s);
    Json normalize(const Json& s);
    const Json* merge(const Json* a, const Json* b, const std::string& path, int depth);
    void check_keywords(const Json& s, const std::string& path);
    int32_t gen(const Json& schema, const std::string& path);
    int32_t exactly_one(const std::vector<const Json*>& schemas, const std::vector<int32_t>& alts,
                        const std::string& path);
    int32_t exactly_one_by_required(const std::vector<const Json*>& schemas, const std::vector<size_t>& live,
                                    const std::string& path);
    bool may_hold_object(const Json& x, int depth);
    static std::set<std::string> value_types(const Json& s);
    bool schemas_disjoint(const Json& x, const Json& y, int depth);
    std::set<std::string> allowed_types(const Json& s, const std::string& path);
    Json with_types(const Json& s, const std::set<std::string>& keep, const std::string& path);
    std::vector<Json> rewrite_not(const Json& s, const std::string& path);

    // Typed values (json_schema_values.cpp).
    bool value_fits(const Json& v, const Json& s, const std::set<std::string>& types);
    int32_t enum_expr(const Json& s, const std::set<std::string>& types, const std::string& path);
    int32_t literal(const Json& v);
    int64_t effective_max(int64_t max, const char* keyword, const std::string& path);
    int64_t get_count(const Json& s, const char* key, const std::string& path, int64_t dflt);
    int32_t typed(const std::string& t, const Json& s, const std::string& path);
    StringConstraints string_constraints(const Json& s, const std::string& path);
    int32_t string_expr(const Json& s, const std::string& path);
    int32_t number_expr(const Json& s, bool integer, const std::string& path);
    int32_t item_rule(const Json& item, const std::string& path);
    int32_t array_expr(const Json& s, const std::string& path);
    std::shared_ptr<const ByteDfa> names_dfa(const std::vector<std::string>& names);
    int32_t object_expr(const Json& s, const std::string& path);
    void add_extra(std::vector<int32_t>& extras, const std::shared_ptr<const ByteDfa>& keys, int32_t value);
    int32_t object_items(const std::vector<int32_t>& kv, const std::vector<bool>& req, int32_t kvx, int64_t min_props,
                         int64_t max_props);

    const Json& root_;
    const CompileOptions& options_;
    Grammar& g_;
    std::vector<std::string>& warnings_;
    JsonLexicon lex_;
    bool ref_overrides_siblings_ = false;
    std::map<const Json*, int32_t> ref_rules_, item_rules_;
    std::deque<std::pair<int32_t, std::string>> pending_;
    std::vector<std::unique_ptr<Json>> owned_;
    int depth_ = 0;
    int32_t object_counter_ = 0;
    int32_t key_counter_ = 0;
};

}  // namespace deepinfer::grammar::json_schema_detail
