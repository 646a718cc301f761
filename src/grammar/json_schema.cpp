// JSON Schema -> grammar IR.
//
// Objects emit their declared properties in the schema's order (optional ones may be skipped), then
// required-but-undeclared keys, then extra properties (patternProperties / additionalProperties),
// whose keys exclude the declared names. Arrays follow prefixItems/items with minItems/maxItems.
// Combinators: allOf is merged into one schema, anyOf/oneOf become alternatives (oneOf is treated as
// anyOf), $ref becomes a rule (recursion allowed). Validation keywords the grammar cannot enforce are
// errors; annotations and unknown keywords are ignored (JSON Schema says unknown keywords carry no
// constraint); unknown formats are reported as warnings.
#include <deque>
#include <nlohmann/json.hpp>
#include <set>

#include "deepinfer/error.h"
#include "grammar/frontend.h"
#include "grammar/json_lexicon.h"

namespace deepinfer::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 200;
constexpr const char* kNotValues = "x-deepinfer-not-values";        // values the instance must differ from
constexpr const char* kNotPatterns = "x-deepinfer-not-patterns";    // [{"all"|"any": [regex..]}]: must not match
constexpr const char* kNotMultiples = "x-deepinfer-not-multiples";  // numbers it must not be a multiple of

const std::set<std::string>& validation_keywords() {
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

std::string escape_pointer(const std::string& key) {
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

std::string json_type_of(const Json& v) {
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

Decimal decimal_of(const Json& v) {
    if (v.is_number_unsigned()) return Decimal::parse(std::to_string(v.get<uint64_t>()));
    if (v.is_number_integer()) return Decimal::parse(std::to_string(v.get<int64_t>()));
    return Decimal::parse(v.dump());
}

int64_t utf8_length(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool dfa_matches(const ByteDfa& d, std::string_view bytes) {
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

    void lower() {
        int32_t root = g_.add_rule("root");
        g_.set_root(root);
        g_.set_body(root, gen(root_, "#"));
        while (!pending_.empty()) {
            auto [rule, pointer] = pending_.front();
            pending_.pop_front();
            g_.set_body(rule, gen(*resolve_pointer(pointer, pointer), pointer));
        }
    }

private:
    [[noreturn]] void fail(const std::string& path, const std::string& why) {
        DI_THROW("json schema error at ", path, ": ", why);
    }

    const Json* own(Json j) {
        owned_.push_back(std::make_unique<Json>(std::move(j)));
        return owned_.back().get();
    }

    // --- $ref -----------------------------------------------------------------------------

    const Json* resolve_pointer(const std::string& ref, const std::string& path) {
        std::string frag;
        size_t hash = ref.find('#');
        std::string base = hash == std::string::npos ? ref : ref.substr(0, hash);
        frag = hash == std::string::npos ? "" : ref.substr(hash + 1);
        if (!base.empty()) {
            std::string id;
            if (root_.is_object()) {
                for (const char* k : {"$id", "id"}) {
                    if (root_.contains(k) && root_[k].is_string()) id = root_[k];
                }
            }
            if (!id.empty() && id.back() == '#') id.pop_back();
            if (base != id) fail(path, "remote $ref '" + ref + "' is not supported (only references into this schema)");
        }
        // Percent-decoding.
        std::string dec;
        for (size_t i = 0; i < frag.size(); ++i) {
            if (frag[i] == '%' && i + 2 < frag.size() + 0 && i + 2 <= frag.size() - 1) {
                dec += static_cast<char>(std::stoi(frag.substr(i + 1, 2), nullptr, 16));
                i += 2;
            } else {
                dec += frag[i];
            }
        }
        frag = dec;
        const Json* cur = &root_;
        if (frag.empty()) return cur;
        if (frag[0] != '/') {
            const Json* found = find_anchor(root_, frag);
            if (!found) fail(path, "$ref '" + ref + "': no $anchor named '" + frag + "'");
            return found;
        }
        size_t pos = 1;
        while (pos <= frag.size()) {
            size_t next = frag.find('/', pos);
            if (next == std::string::npos) next = frag.size();
            std::string tok = frag.substr(pos, next - pos);
            std::string key;
            for (size_t i = 0; i < tok.size(); ++i) {
                if (tok[i] == '~' && i + 1 < tok.size()) {
                    key += tok[i + 1] == '1' ? '/' : '~';
                    ++i;
                } else {
                    key += tok[i];
                }
            }
            if (cur->is_object() && cur->contains(key)) {
                cur = &(*cur)[key];
            } else if (cur->is_array() && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit) &&
                       std::stoul(key) < cur->size()) {
                cur = &(*cur)[std::stoul(key)];
            } else {
                fail(path, "$ref '" + ref + "' points to nothing");
            }
            pos = next + 1;
        }
        return cur;
    }

    const Json* find_anchor(const Json& s, const std::string& name) {
        if (s.is_object()) {
            for (const char* k : {"$anchor", "$id", "id"}) {
                if (s.contains(k) && s[k].is_string()) {
                    std::string v = s[k];
                    if (v == name || v == "#" + name) return &s;
                }
            }
            for (const auto& [k, v] : s.items()) {
                if (k == "enum" || k == "const" || k == "default" || k == "examples") continue;
                if (const Json* f = find_anchor(v, name)) return f;
            }
        } else if (s.is_array()) {
            for (const auto& v : s) {
                if (const Json* f = find_anchor(v, name)) return f;
            }
        }
        return nullptr;
    }

    int32_t ref_expr(const std::string& ref, const std::string& path) {
        const Json* target = resolve_pointer(ref, path);
        auto it = ref_rules_.find(target);
        if (it != ref_rules_.end()) return g_.ref(it->second);
        std::string name = "ref";
        for (char c : ref.substr(ref.rfind('/') == std::string::npos ? 0 : ref.rfind('/') + 1)) {
            name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
        }
        int32_t rule = g_.add_rule(name + "_" + std::to_string(ref_rules_.size()));
        ref_rules_[target] = rule;
        // Generate the body later (breadth first) so that recursion just references the rule.
        pending_.push_back({rule, ref});
        return g_.ref(rule);
    }

    // A schema with its top-level $ref replaced by the target merged with the siblings.
    const Json* inline_ref(const Json* s, const std::string& path, int depth) {
        if (!s->is_object() || !s->contains("$ref")) return s;
        if (depth > 32) fail(path, "$ref chain too deep (recursive allOf/$ref is not supported)");
        const Json& r = (*s)["$ref"];
        if (!r.is_string()) fail(path, "$ref must be a string");
        const Json* target = inline_ref(resolve_pointer(r.get<std::string>(), path), path, depth + 1);
        if (ref_overrides_siblings_) return target;
        Json rest = *s;
        rest.erase("$ref");
        return merge(target, own(std::move(rest)), path, depth + 1);
    }

    // --- merging (allOf) ------------------------------------------------------------------

    static bool constraining(const Json& s) {
        if (s.is_boolean()) return !s.get<bool>();
        if (!s.is_object()) return true;
        for (const auto& [k, v] : s.items()) {
            if (validation_keywords().count(k)) return true;
        }
        return false;
    }

    static bool needs_normalize(const Json& s) {
        return (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean()) ||
               (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean());
    }

    Json normalize(const Json& s) {
        Json out = s;
        // Draft 4 boolean exclusive bounds.
        for (auto [excl, bound] :
             {std::pair{"exclusiveMinimum", "minimum"}, std::pair{"exclusiveMaximum", "maximum"}}) {
            if (out.contains(excl) && out[excl].is_boolean()) {
                if (out[excl].get<bool>() && out.contains(bound)) {
                    out[excl] = out[bound];
                    out.erase(bound);
                } else {
                    out.erase(excl);
                }
            }
        }
        return out;
    }

    const Json* merge(const Json* a, const Json* b, const std::string& path, int depth) {
        if (a->is_boolean()) return a->get<bool>() ? b : a;
        if (b->is_boolean()) return b->get<bool>() ? a : b;
        if (!a->is_object() || !b->is_object()) fail(path, "subschemas must be objects or booleans");
        a = inline_ref(a, path, depth);
        b = inline_ref(b, path, depth);
        if (a->is_boolean() || b->is_boolean()) return merge(a, b, path, depth);
        Json x = normalize(*a), y = normalize(*b);
        // Nested allOf: flatten first.
        for (Json* s : {&x, &y}) {
            if (s->contains("allOf")) {
                const Json* items = own((*s)["allOf"]);
                s->erase("allOf");
                const Json* acc = own(*s);
                for (const auto& item : *items) acc = merge(acc, &item, path, depth + 1);
                if (acc->is_boolean()) return acc;
                *s = *acc;
            }
        }
        // additionalProperties of one side applies to the properties only the other side declares.
        // (Each side's additionalProperties covers the keys its own properties/patternProperties miss.)
        auto restrictive_ap = [](const Json& s) {
            return s.contains("additionalProperties") &&
                   !(s["additionalProperties"].is_boolean() && s["additionalProperties"].get<bool>());
        };
        auto patterns_of = [](const Json& s) {
            return s.contains("patternProperties") && s["patternProperties"].is_object() ? s["patternProperties"]
                                                                                         : Json::object();
        };
        if ((restrictive_ap(x) && !patterns_of(y).empty() && patterns_of(y) != patterns_of(x)) ||
            (restrictive_ap(y) && !patterns_of(x).empty() && patterns_of(x) != patterns_of(y))) {
            fail(path,
                 "allOf combining patternProperties with another subschema's additionalProperties is not supported");
        }
        auto matches_pattern = [&](const Json& s, const std::string& key) {
            const Json patterns = patterns_of(s);  // (a named copy: items() of a temporary would dangle)
            for (const auto& [p, v] : patterns.items()) {
                StringConstraints c;
                c.patterns.push_back(p);
                std::string enc = JsonLexicon::encode_string(key);
                if (dfa_matches(*lex_.string_content_dfa(c, path), std::string_view(enc).substr(1, enc.size() - 2)))
                    return true;
            }
            return false;
        };
        auto apply_additional = [&](Json& target, const Json& other) {
            if (!restrictive_ap(other) || !target.contains("properties")) return;
            const Json& ap = other["additionalProperties"];
            for (auto& [k, v] : target["properties"].items()) {
                bool declared = other.contains("properties") && other["properties"].contains(k);
                if (declared || matches_pattern(other, k)) continue;
                v = Json{{"allOf", Json::array({v, ap})}};
            }
        };
        apply_additional(x, y);
        apply_additional(y, x);
        Json out = x;
        for (const auto& [k, vb] : y.items()) {
            if (!out.contains(k)) {
                out[k] = vb;
                continue;
            }
            Json& va = out[k];
            if (k == "type") {
                auto types = [](const Json& t) {
                    std::set<std::string> s;
                    if (t.is_string()) s.insert(t.get<std::string>());
                    if (t.is_array()) {
                        for (const auto& e : t) s.insert(e.get<std::string>());
                    }
                    if (s.count("number")) s.insert("integer");
                    return s;
                };
                std::set<std::string> ta = types(va), tb = types(vb), both;
                for (const auto& t : ta) {
                    if (tb.count(t)) both.insert(t);
                }
                if (both.empty()) return own(Json(false));
                Json arr = Json::array();
                for (const auto& t : both) {
                    if (t == "integer" && both.count("number")) continue;
                    arr.push_back(t);
                }
                va = arr;
            } else if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions") {
                for (const auto& [pk, pv] : vb.items()) {
                    if (va.contains(pk)) {
                        va[pk] = Json{{"allOf", Json::array({va[pk], pv})}};
                    } else {
                        va[pk] = pv;
                    }
                }
            } else if (k == "required") {
                for (const auto& r : vb) {
                    if (std::find(va.begin(), va.end(), r) == va.end()) va.push_back(r);
                }
            } else if (k == "additionalProperties" || k == "items" || k == "additionalItems" || k == "propertyNames" ||
                       k == "unevaluatedProperties" || k == "contains") {
                if (va.is_array() || vb.is_array()) fail(path, "allOf with tuple 'items' is not supported");
                va = Json{{"allOf", Json::array({va, vb})}};
            } else if (k == "prefixItems") {
                Json merged = Json::array();
                for (size_t i = 0; i < std::max(va.size(), vb.size()); ++i) {
                    if (i < va.size() && i < vb.size()) {
                        merged.push_back(Json{{"allOf", Json::array({va[i], vb[i]})}});
                    } else {
                        merged.push_back(i < va.size() ? va[i] : vb[i]);
                    }
                }
                va = merged;
            } else if (k == "enum") {
                Json both = Json::array();
                for (const auto& e : va) {
                    if (std::find(vb.begin(), vb.end(), e) != vb.end()) both.push_back(e);
                }
                va = both;
            } else if (k == "const") {
                if (va != vb) return own(Json(false));
            } else if (k == "minLength" || k == "minItems" || k == "minProperties" || k == "minimum" ||
                       k == "exclusiveMinimum") {
                if (vb.is_number() && va.is_number() && vb.get<double>() > va.get<double>()) va = vb;
            } else if (k == "maxLength" || k == "maxItems" || k == "maxProperties" || k == "maximum" ||
                       k == "exclusiveMaximum") {
                if (vb.is_number() && va.is_number() && vb.get<double>() < va.get<double>()) va = vb;
            } else if (k == "pattern" || k == "format") {
                Json list = va.is_array() ? va : Json::array({va});
                if (std::find(list.begin(), list.end(), vb) == list.end()) list.push_back(vb);
                va = list;
            } else if (k == "multipleOf") {
                if (va != vb) fail(path, "allOf with different multipleOf values is not supported");
            } else if (k == "uniqueItems") {
                va = va.is_boolean() && vb.is_boolean() ? Json(va.get<bool>() || vb.get<bool>()) : va;
            } else if (k == "anyOf" || k == "oneOf") {
                Json prod = Json::array();
                for (const auto& p : va) {
                    for (const auto& q : vb) prod.push_back(Json{{"allOf", Json::array({p, q})}});
                }
                if (prod.size() > 256) fail(path, "allOf of anyOf/oneOf lists expands to more than 256 alternatives");
                va = prod;
            } else if (k == "not") {
                va = Json{{"anyOf", Json::array({va, vb})}};
            } else if (k == kNotValues || k == kNotPatterns || k == kNotMultiples) {
                for (const auto& e : vb) va.push_back(e);
            } else if (validation_keywords().count(k)) {
                if (va != vb) fail(path, "allOf combining two '" + k + "' keywords is not supported");
            }
        }
        return own(std::move(out));
    }

    // --- generation -----------------------------------------------------------------------

    void check_keywords(const Json& s, const std::string& path) {
        for (const auto& [k, v] : s.items()) {
            if (k == "if" || k == "then" || k == "else") {
                if (k == "if" && (s.contains("then") || s.contains("else"))) {
                    fail(path, "unsupported JSON Schema keyword 'if'/'then'/'else'");
                }
                continue;
            }
            if (k == "dependencies" || k == "dependentRequired" || k == "dependentSchemas") {
                if (v.is_object() && v.empty()) continue;
                fail(path, "unsupported JSON Schema keyword '" + k + "'");
            }
            if (k == "contains" || k == "minContains" || k == "maxContains" || k == "unevaluatedItems" ||
                k == "$dynamicRef" || k == "$recursiveRef") {
                fail(path, "unsupported JSON Schema keyword '" + k + "'");
            }
            if (k == "unevaluatedProperties") {
                if (v.is_boolean() && v.get<bool>()) continue;
                if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf") || s.contains("$ref")) {
                    fail(path, "unsupported JSON Schema keyword 'unevaluatedProperties' next to combinators");
                }
            }
            if (k == "uniqueItems" && v.is_boolean() && v.get<bool>()) {
                bool at_most_one =
                    s.contains("maxItems") && s["maxItems"].is_number() && s["maxItems"].get<double>() <= 1;
                if (!at_most_one) fail(path, "unsupported JSON Schema keyword 'uniqueItems' (true)");
            }
        }
    }

    int32_t gen(const Json& schema, const std::string& path) {
        if (++depth_ > kMaxDepth) fail(path, "schema nested too deeply");
        struct Guard {
            int& d;
            ~Guard() { --d; }
        } guard{depth_};
        if (g_.num_exprs() > options_.max_states * 8) {
            DI_THROW("grammar too large: the schema expands past the max_states limit");
        }
        if (schema.is_boolean()) return schema.get<bool>() ? lex_.any_value() : g_.nothing();
        if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
        if (!constraining(schema)) return lex_.any_value();
        check_keywords(schema, path);
        // Every schema handled below lives in root_ or owned_, so addresses are stable keys.
        const Json& s = needs_normalize(schema) ? *own(normalize(schema)) : schema;
        if (s.contains("$ref")) {
            if (!s["$ref"].is_string()) fail(path, "$ref must be a string");
            bool siblings = false;
            for (const auto& [k, v] : s.items()) {
                if (k != "$ref" && validation_keywords().count(k)) siblings = true;
            }
            if (ref_overrides_siblings_ || !siblings) return ref_expr(s["$ref"], path);
            Json rest = s;
            rest.erase("$ref");
            const Json* merged = merge(own(Json{{"$ref", s["$ref"]}}), own(std::move(rest)), path, 0);
            return gen(*merged, path);
        }
        if (s.contains("not")) {
            std::vector<Json> alts = rewrite_not(s, path);
            std::vector<int32_t> exprs;
            for (auto& a : alts) exprs.push_back(gen(*own(std::move(a)), path));
            return g_.alt(exprs);
        }
        if (s.contains("allOf")) {
            const Json& items = s["allOf"];
            if (!items.is_array() || items.empty()) fail(path, "allOf must be a non-empty array");
            Json base = s;
            base.erase("allOf");
            const Json* acc = own(std::move(base));
            for (size_t i = 0; i < items.size(); ++i)
                acc = merge(acc, &items[i], path + "/allOf/" + std::to_string(i), 0);
            return gen(*acc, path);
        }
        if (s.contains("anyOf") || s.contains("oneOf")) {
            // With both, oneOf is distributed first and each alternative keeps the anyOf.
            bool one = s.contains("oneOf");
            const char* key = one ? "oneOf" : "anyOf";
            const Json& items = s[key];
            if (!items.is_array() || items.empty()) fail(path, std::string(key) + " must be a non-empty array");
            Json rest = s;
            rest.erase(key);
            bool base_constrains = constraining(rest);
            const Json* base = own(std::move(rest));
            std::vector<const Json*> schemas;
            std::vector<int32_t> alts;
            for (size_t i = 0; i < items.size(); ++i) {
                std::string p = path + "/" + key + "/" + std::to_string(i);
                schemas.push_back(base_constrains ? merge(base, &items[i], p, 0) : &items[i]);
                alts.push_back(gen(*schemas.back(), p));
            }
            return one ? exactly_one(schemas, alts, path) : g_.alt(alts);
        }
        std::set<std::string> types = allowed_types(s, path);
        if (s.contains("enum") || s.contains("const")) return enum_expr(s, types, path);
        std::vector<int32_t> alts;
        for (const char* tc : {"null", "boolean", "object", "array", "string", "integer", "number"}) {
            std::string t = tc;
            if (!types.count(t)) continue;
            if (t == "integer" && types.count("number")) continue;
            alts.push_back(typed(t, s, path));
        }
        return g_.alt(alts);
    }

    // oneOf: an alternation when the alternatives are disjoint (shown from the schemas, or from their
    // automata); overlapping regular alternatives are subtracted from each other; otherwise an error
    // (treating oneOf as anyOf would accept instances that match two alternatives).
    int32_t exactly_one(const std::vector<const Json*>& schemas, const std::vector<int32_t>& alts,
                        const std::string& path) {
        std::vector<size_t> live;
        for (size_t i = 0; i < alts.size(); ++i) {
            if (!g_.is_nothing(alts[i])) live.push_back(i);
        }
        if (live.size() <= 1) return g_.alt(alts);
        bool disjoint = true;
        for (size_t a = 0; a < live.size() && disjoint; ++a) {
            for (size_t b = a + 1; b < live.size() && disjoint; ++b) {
                disjoint = schemas_disjoint(*schemas[live[a]], *schemas[live[b]], 0);
            }
        }
        if (disjoint) return g_.alt(alts);
        // Alternatives that differ only in `required` (the "exactly one of these keys" idiom): alternative i
        // holds and no other does, i.e. for every j some key of required_j \ required_i is absent.
        if (int32_t e = exactly_one_by_required(schemas, live, path); e >= 0) return e;
        // Automata decide disjointness of texts; that equals disjointness of instances only when no
        // alternative can hold an object (the grammar fixes a key order, the schema does not).
        for (size_t i : live) {
            if (may_hold_object(*schemas[i], 0)) {
                fail(path,
                     "oneOf alternatives may overlap and could not be separated (exactly-one is only supported "
                     "for alternatives shown disjoint, e.g. by type, const/enum or a required discriminator "
                     "property, or for regular alternatives without objects)");
            }
        }
        BuildLimits lim = lex_.limits();
        lim.max_states = std::min<int64_t>(lim.max_states, 50000);
        auto overlapping = [&](const std::vector<std::shared_ptr<const ByteDfa>>& d) {
            for (size_t a = 0; a < d.size(); ++a) {
                for (size_t b = a + 1; b < d.size(); ++b) {
                    if (!dfa_empty(*dfa_intersect(*d[a], *d[b], lim))) return true;
                }
            }
            return false;
        };
        try {
            std::vector<std::shared_ptr<const ByteDfa>> d;
            for (size_t i : live) d.push_back(expr_to_dfa(g_, alts[i], lim, RegularMode::kExact));
            if (!overlapping(d)) return g_.alt(alts);
            std::vector<int32_t> out;
            for (size_t a = 0; a < d.size(); ++a) {
                std::shared_ptr<const ByteDfa> only = d[a];
                for (size_t b = 0; b < d.size(); ++b) {
                    if (b != a) only = dfa_subtract(*only, *d[b], lim);
                }
                out.push_back(g_.dfa(only));
            }
            return g_.alt(out);
        } catch (const Error&) {
            // Not regular (recursion) or too large: try supersets below.
        }
        try {
            std::vector<std::shared_ptr<const ByteDfa>> d;
            for (size_t i : live) d.push_back(expr_to_dfa(g_, alts[i], lim, RegularMode::kOverApproximate));
            if (!overlapping(d)) return g_.alt(alts);
        } catch (const Error&) {
        }
        fail(path,
             "oneOf alternatives may overlap and could not be separated (exactly-one is only supported for "
             "disjoint or regular alternatives)");
    }

    int32_t exactly_one_by_required(const std::vector<const Json*>& schemas, const std::vector<size_t>& live,
                                    const std::string& path) {
        std::vector<Json> rest;
        std::vector<std::vector<std::string>> req;
        for (size_t i : live) {
            const Json& sc = *schemas[i];
            if (!sc.is_object()) return -1;
            Json r = sc;
            std::vector<std::string> keys;
            if (r.contains("required")) {
                if (!r["required"].is_array()) return -1;
                for (const auto& k : r["required"]) {
                    if (!k.is_string()) return -1;
                    keys.push_back(k);
                }
                r.erase("required");
            }
            if (!rest.empty() && r != rest[0]) return -1;
            rest.push_back(std::move(r));
            req.push_back(std::move(keys));
        }
        auto has = [](const std::vector<std::string>& v, const std::string& k) {
            return std::find(v.begin(), v.end(), k) != v.end();
        };
        std::vector<int32_t> out;
        for (size_t a = 0; a < live.size(); ++a) {
            // Choices of absent keys: one from each other alternative's extra keys.
            std::vector<std::vector<std::string>> options{{}};
            bool dead = false;
            for (size_t b = 0; b < live.size() && !dead; ++b) {
                if (b == a) continue;
                std::vector<std::string> extra;
                for (const auto& k : req[b]) {
                    if (!has(req[a], k)) extra.push_back(k);
                }
                if (extra.empty()) {
                    dead = true;  // alternative a implies alternative b
                    break;
                }
                std::vector<std::vector<std::string>> next;
                for (const auto& o : options) {
                    for (const auto& k : extra) {
                        auto n = o;
                        if (!has(n, k)) n.push_back(k);
                        next.push_back(std::move(n));
                    }
                }
                if (next.size() > 64) fail(path, "oneOf over 'required' expands to more than 64 alternatives");
                options = std::move(next);
            }
            if (dead) continue;
            for (const auto& absent : options) {
                Json alt = rest[a];
                alt["required"] = req[a];
                for (const auto& k : absent) alt["properties"][k] = false;
                out.push_back(gen(*own(std::move(alt)), path));
            }
        }
        return g_.alt(out);
    }

    bool may_hold_object(const Json& x, int depth) {
        if (depth > 16) return true;
        const Json* s;
        try {
            s = inline_ref(&x, "#", 0);
        } catch (const Error&) {
            return true;
        }
        if (s->is_boolean()) return s->get<bool>();
        if (!s->is_object()) return true;
        std::set<std::string> types = value_types(*s);
        if (types.count("object")) return true;
        for (const char* k : {"anyOf", "oneOf", "allOf", "prefixItems"}) {
            if (!s->contains(k) || !(*s)[k].is_array()) continue;
            for (const auto& sub : (*s)[k]) {
                if (may_hold_object(sub, depth + 1)) return true;
            }
        }
        if (types.count("array")) {
            for (const char* k : {"items", "additionalItems"}) {
                if (!s->contains(k)) {
                    if (std::string(k) == "items") return true;  // any items
                    continue;
                }
                const Json& it = (*s)[k];
                if (it.is_array()) {
                    for (const auto& sub : it) {
                        if (may_hold_object(sub, depth + 1)) return true;
                    }
                } else if (may_hold_object(it, depth + 1)) {
                    return true;
                }
            }
        }
        return false;
    }

    static std::set<std::string> value_types(const Json& s) {
        std::set<std::string> out;
        auto add_value = [&](const Json& v) {
            std::string t = json_type_of(v);
            out.insert(t);
            if (t == "integer") out.insert("number");
        };
        if (s.contains("const")) {
            add_value(s["const"]);
        } else if (s.contains("enum") && s["enum"].is_array()) {
            for (const auto& v : s["enum"]) add_value(v);
        } else if (s.contains("type")) {
            const Json& t = s["type"];
            for (const Json& v : t.is_array() ? t : Json::array({t})) {
                if (!v.is_string()) continue;
                out.insert(v.get<std::string>());
                if (v == "number") out.insert("integer");
                if (v == "integer") out.insert("number");  // an integer is a number; "number" sets overlap
            }
        } else {
            out = {"null", "boolean", "object", "array", "string", "integer", "number"};
        }
        return out;
    }

    // Sound but incomplete: true only when no instance can satisfy both schemas.
    bool schemas_disjoint(const Json& x, const Json& y, int depth) {
        if (depth > 4) return false;
        const Json* a;
        const Json* b;
        try {
            a = inline_ref(&x, "#", 0);
            b = inline_ref(&y, "#", 0);
        } catch (const Error&) {
            return false;
        }
        if (a->is_boolean() || b->is_boolean()) {
            return (a->is_boolean() && !a->get<bool>()) || (b->is_boolean() && !b->get<bool>());
        }
        if (!a->is_object() || !b->is_object()) return false;
        std::set<std::string> ta = value_types(*a), tb = value_types(*b);
        bool common = false;
        for (const auto& t : ta) common = common || tb.count(t);
        if (!common) return true;
        auto values = [](const Json& s) -> const Json* {
            return s.contains("const")                            ? &s["const"]
                   : (s.contains("enum") && s["enum"].is_array()) ? &s["enum"]
                                                                  : nullptr;
        };
        const Json *va = values(*a), *vb = values(*b);
        if (va && vb) {
            Json la = a->contains("const") ? Json::array({*va}) : *va;
            Json lb = b->contains("const") ? Json::array({*vb}) : *vb;
            bool shared = false;
            for (const auto& v : la) shared = shared || std::find(lb.begin(), lb.end(), v) != lb.end();
            if (!shared) return true;
        }
        // Objects: a property one side requires that the other forbids, or whose schemas are disjoint.
        auto required_in = [](const Json& s) {
            std::vector<std::string> r;
            if (s.contains("required") && s["required"].is_array()) {
                for (const auto& k : s["required"]) {
                    if (k.is_string()) r.push_back(k);
                }
            }
            return r;
        };
        auto prop = [](const Json& s, const std::string& k) -> const Json* {
            return (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(k))
                       ? &s["properties"][k]
                       : nullptr;
        };
        for (int side = 0; side < 2; ++side) {
            const Json& p = side ? *b : *a;
            const Json& q = side ? *a : *b;
            for (const auto& k : required_in(p)) {
                const Json* pq = prop(q, k);
                if (!pq) {
                    bool closed = q.contains("additionalProperties") && q["additionalProperties"] == Json(false) &&
                                  !q.contains("patternProperties");
                    if (closed) return true;
                    continue;
                }
                if (pq->is_boolean() && !pq->get<bool>()) return true;
                const Json* pp = prop(p, k);
                if (pp && schemas_disjoint(*pp, *pq, depth + 1)) return true;
            }
        }
        return false;
    }

    std::set<std::string> allowed_types(const Json& s, const std::string& path) {
        static const std::set<std::string> kAll = {"null", "boolean", "object", "array", "string", "integer", "number"};
        if (!s.contains("type")) return kAll;
        const Json& t = s["type"];
        std::set<std::string> out;
        auto add = [&](const Json& v) {
            if (!v.is_string()) fail(path, "'type' must be a string or an array of strings");
            std::string name = v;
            if (name == "any") {
                out = kAll;
                return;
            }
            if (!kAll.count(name)) fail(path, "unknown type '" + name + "'");
            out.insert(name);
            if (name == "number") out.insert("integer");
        };
        if (t.is_array()) {
            for (const auto& v : t) add(v);
        } else {
            add(t);
        }
        return out;
    }

    // The schema restricted to the given types (its own type list intersected).
    Json with_types(const Json& s, const std::set<std::string>& keep, const std::string& path) {
        std::set<std::string> types = allowed_types(s, path);
        Json list = Json::array();
        for (const char* t : {"null", "boolean", "object", "array", "string", "integer", "number"}) {
            if (types.count(t) && keep.count(t)) list.push_back(t);
        }
        Json out = s;
        out["type"] = list;
        return out;
    }

    // Rewrites a schema with 'not' into positive schemas (alternatives). Supported inside 'not':
    // not, $ref, type, enum/const, pattern (and allOf/anyOf of patterns), required (and allOf/anyOf of
    // required), one numeric bound, multipleOf. Note that a keyword holds trivially for instances of
    // other types (not {pattern} is false for every non-string), which the rewrite respects.
    std::vector<Json> rewrite_not(const Json& s, const std::string& path) {
        std::string npath = path + "/not";
        Json base = s;
        base.erase("not");
        const Json* n = inline_ref(&s["not"], npath, 0);
        if (n->is_boolean()) return n->get<bool>() ? std::vector<Json>{} : std::vector<Json>{base};
        if (!n->is_object()) fail(path, "'not' must be a schema");
        if (!constraining(*n)) return {};
        std::vector<std::string> keys;
        for (const auto& [k, v] : n->items()) {
            if (validation_keywords().count(k)) keys.push_back(k);
        }
        auto only = [&](std::initializer_list<const char*> allowed) {
            for (const auto& k : keys) {
                if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) ==
                    allowed.end()) {
                    return false;
                }
            }
            return true;
        };
        auto append = [](Json& target, const char* key, const Json& item) {
            if (!target.contains(key)) target[key] = Json::array();
            target[key].push_back(item);
        };
        // Lists of subschemas that each hold only the given keyword.
        auto all_items_only = [&](const Json& list, const char* key) {
            if (!list.is_array() || list.empty()) return false;
            for (const auto& item : list) {
                if (!item.is_object()) return false;
                for (const auto& [k, v] : item.items()) {
                    if (validation_keywords().count(k) && k != key) return false;
                }
                if (!item.contains(key)) return false;
            }
            return true;
        };
        if (only({"not"})) return {*merge(own(base), &(*n)["not"], npath, 0)};
        if (only({"type"})) {
            std::set<std::string> excluded = allowed_types(*n, npath);
            std::set<std::string> keep;
            for (const auto& t : allowed_types(base, path)) {
                if (!excluded.count(t)) keep.insert(t);
            }
            if (keep.count("number") && !keep.count("integer")) {
                fail(path, "'not' excluding integers from numbers is not supported");
            }
            return {with_types(base, keep, path)};
        }
        if (only({"enum", "const"})) {
            Json out = base;
            for (const auto& v : n->contains("const") ? Json::array({(*n)["const"]}) : (*n)["enum"])
                append(out, kNotValues, v);
            return {out};
        }
        if (only({"pattern"}) || (only({"allOf"}) && all_items_only((*n)["allOf"], "pattern")) ||
            (only({"anyOf"}) && all_items_only((*n)["anyOf"], "pattern"))) {
            Json group;
            if (n->contains("pattern")) {
                group["all"] = Json::array({(*n)["pattern"]});
            } else {
                const char* key = n->contains("allOf") ? "allOf" : "anyOf";
                Json list = Json::array();
                for (const auto& item : (*n)[key]) list.push_back(item["pattern"]);
                group[n->contains("allOf") ? "all" : "any"] = list;
            }
            Json out = with_types(base, {"string"}, path);
            append(out, kNotPatterns, group);
            return {out};
        }
        if (only({"required"}) || (only({"allOf"}) && all_items_only((*n)["allOf"], "required"))) {
            // Not all of these keys present: one alternative per key that is absent.
            std::vector<std::string> ks;
            auto add_keys = [&](const Json& r) {
                if (!r.is_array()) fail(npath, "'required' must be an array");
                for (const auto& k : r) {
                    if (k.is_string() && std::find(ks.begin(), ks.end(), k.get<std::string>()) == ks.end())
                        ks.push_back(k);
                }
            };
            if (n->contains("required")) {
                add_keys((*n)["required"]);
            } else {
                for (const auto& item : (*n)["allOf"]) add_keys(item["required"]);
            }
            std::vector<Json> out;
            Json obj = with_types(base, {"object"}, path);
            for (const auto& k : ks) {
                Json alt = obj;
                alt["properties"][k] = false;
                out.push_back(alt);
            }
            return out;
        }
        if (only({"anyOf"}) && all_items_only((*n)["anyOf"], "required")) {
            // None of the groups fully present; single-key groups: every key absent.
            Json obj = with_types(base, {"object"}, path);
            for (const auto& item : (*n)["anyOf"]) {
                if (!item["required"].is_array() || item["required"].size() != 1) {
                    fail(path, "unsupported 'not' (anyOf of multi-key 'required')");
                }
                obj["properties"][item["required"][0].get<std::string>()] = false;
            }
            return {obj};
        }
        if (keys.size() == 1 && (keys[0] == "minimum" || keys[0] == "maximum" || keys[0] == "exclusiveMinimum" ||
                                 keys[0] == "exclusiveMaximum")) {
            static const std::map<std::string, std::string> kInverse = {{"minimum", "exclusiveMaximum"},
                                                                        {"exclusiveMinimum", "maximum"},
                                                                        {"maximum", "exclusiveMinimum"},
                                                                        {"exclusiveMaximum", "minimum"}};
            const Json& bound = (*n)[keys[0]];
            if (!bound.is_number()) fail(npath, "'" + keys[0] + "' must be a number");
            Json inv = with_types(base, {"integer", "number"}, path);
            Json extra = Json::object();
            extra[kInverse.at(keys[0])] = bound;
            return {*merge(own(std::move(inv)), own(std::move(extra)), path, 0)};
        }
        if (only({"multipleOf"})) {
            Json out = with_types(base, {"integer", "number"}, path);
            append(out, kNotMultiples, (*n)["multipleOf"]);
            return {out};
        }
        fail(path,
             "unsupported 'not' (supported inside 'not': type, enum, const, pattern, required, multipleOf, "
             "one numeric bound, not, $ref)");
    }

    bool value_fits(const Json& v, const Json& s, const std::set<std::string>& types) {
        std::string t = json_type_of(v);
        if (!types.count(t) && !(t == "integer" && types.count("number"))) return false;
        if (v.is_string()) {
            int64_t len = utf8_length(v.get<std::string>());
            if (s.contains("minLength") && s["minLength"].is_number() && len < s["minLength"].get<double>())
                return false;
            if (s.contains("maxLength") && s["maxLength"].is_number() && len > s["maxLength"].get<double>())
                return false;
        }
        if (v.is_number()) {
            double x = v.get<double>();
            if (s.contains("minimum") && s["minimum"].is_number() && x < s["minimum"].get<double>()) return false;
            if (s.contains("maximum") && s["maximum"].is_number() && x > s["maximum"].get<double>()) return false;
            if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
                x <= s["exclusiveMinimum"].get<double>()) {
                return false;
            }
            if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() &&
                x >= s["exclusiveMaximum"].get<double>()) {
                return false;
            }
        }
        if (s.contains(kNotValues)) {
            for (const auto& e : s[kNotValues]) {
                if (e == v) return false;
            }
        }
        return true;
    }

    int32_t enum_expr(const Json& s, const std::set<std::string>& types, const std::string& path) {
        Json values;
        if (s.contains("const")) {
            values = Json::array({s["const"]});
            if (s.contains("enum")) {
                if (!s["enum"].is_array()) fail(path, "'enum' must be an array");
                if (std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end())
                    values = Json::array();
            }
        } else {
            if (!s["enum"].is_array()) fail(path, "'enum' must be an array");
            values = s["enum"];
        }
        std::vector<int32_t> alts;
        for (const auto& v : values) {
            if (value_fits(v, s, types)) alts.push_back(literal(v));
        }
        return g_.alt(alts);
    }

    int32_t literal(const Json& v) {
        if (v.is_string()) return lex_.string_literal(v.get<std::string>());
        if (v.is_array()) {
            std::vector<int32_t> items{g_.bytes("["), lex_.ws()};
            for (size_t i = 0; i < v.size(); ++i) {
                if (i) items.insert(items.end(), {lex_.ws(), g_.bytes(","), lex_.ws()});
                items.push_back(literal(v[i]));
            }
            if (!v.empty()) items.push_back(lex_.ws());
            items.push_back(g_.bytes("]"));
            return g_.seq(items);
        }
        if (v.is_object()) {
            std::vector<int32_t> items{g_.bytes("{"), lex_.ws()};
            bool first = true;
            for (const auto& [k, x] : v.items()) {
                if (!first) items.insert(items.end(), {lex_.ws(), g_.bytes(","), lex_.ws()});
                first = false;
                items.insert(items.end(), {lex_.string_literal(k), lex_.ws(), g_.bytes(":"), lex_.ws(), literal(x)});
            }
            if (!v.empty()) items.push_back(lex_.ws());
            items.push_back(g_.bytes("}"));
            return g_.seq(items);
        }
        return g_.bytes(v.dump());
    }

    // maxLength/maxItems/maxProperties beyond any context length cannot bind generation: unbounded,
    // with a warning.
    int64_t effective_max(int64_t max, const char* keyword, const std::string& path) {
        if (max <= 100000000) return max;
        warnings_.push_back(std::string(keyword) + " " + std::to_string(max) + " at " + path + " treated as unbounded");
        return -1;
    }

    int64_t get_count(const Json& s, const char* key, const std::string& path, int64_t dflt) {
        if (!s.contains(key)) return dflt;
        const Json& v = s[key];
        if (!v.is_number() || v.get<double>() < 0)
            fail(path, std::string("'") + key + "' must be a non-negative number");
        double d = v.get<double>();
        return d > 1e15 ? int64_t{1} << 50 : static_cast<int64_t>(d);
    }

    int32_t typed(const std::string& t, const Json& s, const std::string& path) {
        if (s.contains(kNotValues)) {
            for (const auto& v : s[kNotValues]) {
                std::string vt = json_type_of(v);
                if ((v.is_array() && t == "array") || (v.is_object() && t == "object")) {
                    fail(path, "'not' with array or object values is not supported");
                }
                if (v.is_number() && vt != "integer" && t == "number") {
                    fail(path, "'not' with non-integer number values is not supported");
                }
            }
        }
        auto excluded = [&](const Json& v) {
            if (!s.contains(kNotValues)) return false;
            for (const auto& e : s[kNotValues]) {
                if (e == v) return true;
            }
            return false;
        };
        if (t == "null") return excluded(Json(nullptr)) ? g_.nothing() : g_.bytes("null");
        if (t == "boolean") {
            return g_.alt({excluded(Json(true)) ? g_.nothing() : g_.bytes("true"),
                           excluded(Json(false)) ? g_.nothing() : g_.bytes("false")});
        }
        if (t == "string") return string_expr(s, path);
        if (t == "integer" || t == "number") return number_expr(s, t == "integer", path);
        if (t == "array") return array_expr(s, path);
        return object_expr(s, path);
    }

    StringConstraints string_constraints(const Json& s, const std::string& path) {
        StringConstraints c;
        c.min_length = get_count(s, "minLength", path, 0);
        c.max_length = get_count(s, "maxLength", path, -1);
        c.max_length = effective_max(c.max_length, "maxLength", path);
        if (c.min_length > 100000000) fail(path, "minLength above 100000000 is not supported");
        if (c.max_length >= 0 && c.max_length < c.min_length) c.min_length = c.max_length + 1;  // unsatisfiable
        auto list = [&](const char* key, std::vector<std::string>& out) {
            if (!s.contains(key)) return;
            const Json& v = s[key];
            for (const Json& e : v.is_array() ? v : Json::array({v})) {
                if (!e.is_string()) fail(path, std::string("'") + key + "' must be a string");
                out.push_back(e.get<std::string>());
            }
        };
        list("pattern", c.patterns);
        list("format", c.formats);
        return c;
    }

    int32_t string_expr(const Json& s, const std::string& path) {
        StringConstraints c = string_constraints(s, path);
        if (c.max_length >= 0 && c.max_length < c.min_length) return g_.nothing();
        std::vector<int32_t> names;
        if (s.contains(kNotValues)) {
            for (const auto& v : s[kNotValues]) {
                if (!v.is_string()) continue;
                std::string enc = JsonLexicon::encode_string(v.get<std::string>());
                names.push_back(g_.bytes(enc.substr(1, enc.size() - 2)));
            }
        }
        if (names.empty() && !s.contains(kNotPatterns)) return lex_.string(c, path);
        // Subtract what 'not' excludes from the content language.
        const BuildLimits& lim = lex_.limits();
        std::shared_ptr<const ByteDfa> content = lex_.string_content_dfa(c, path);
        if (!names.empty()) content = dfa_subtract(*content, *expr_to_dfa(g_, g_.alt(names), lim), lim);
        if (s.contains(kNotPatterns)) {
            for (const auto& group : s[kNotPatterns]) {
                bool all = group.contains("all");
                std::shared_ptr<const ByteDfa> acc;
                for (const auto& p : group[all ? "all" : "any"]) {
                    if (!p.is_string()) fail(path, "'pattern' must be a string");
                    StringConstraints pc;
                    pc.patterns.push_back(p);
                    auto d = lex_.string_content_dfa(pc, path + "/not");
                    if (!acc) {
                        acc = d;
                    } else if (all) {
                        acc = dfa_intersect(*acc, *d, lim);
                    } else {
                        // Union via De Morgan on the universe of contents.
                        auto u = lex_.any_content_dfa();
                        acc = dfa_subtract(
                            *u, *dfa_intersect(*dfa_subtract(*u, *acc, lim), *dfa_subtract(*u, *d, lim), lim), lim);
                    }
                }
                if (acc) content = dfa_subtract(*content, *acc, lim);
            }
        }
        return g_.seq({g_.bytes("\""), g_.dfa(content), g_.bytes("\"")});
    }

    int32_t number_expr(const Json& s, bool integer, const std::string& path) {
        NumberConstraints c;
        c.integer = integer;
        auto bound = [&](const char* key, bool& has, Decimal& d) {
            if (!s.contains(key)) return false;
            if (!s[key].is_number()) fail(path, std::string("'") + key + "' must be a number");
            Decimal v = decimal_of(s[key]);
            if (has) {
                // Keep the tighter of minimum / exclusiveMinimum (compare as doubles; exact ties prefer exclusive).
                return false;
            }
            has = true;
            d = v;
            return true;
        };
        bound("minimum", c.has_min, c.min);
        if (s.contains("exclusiveMinimum")) {
            if (!s["exclusiveMinimum"].is_number()) fail(path, "'exclusiveMinimum' must be a number");
            double e = s["exclusiveMinimum"].get<double>();
            if (!c.has_min || e >= s["minimum"].get<double>()) {
                c.has_min = true;
                c.min = decimal_of(s["exclusiveMinimum"]);
                c.min_exclusive = true;
            }
        }
        bound("maximum", c.has_max, c.max);
        if (s.contains("exclusiveMaximum")) {
            if (!s["exclusiveMaximum"].is_number()) fail(path, "'exclusiveMaximum' must be a number");
            double e = s["exclusiveMaximum"].get<double>();
            if (!c.has_max || e <= s["maximum"].get<double>()) {
                c.has_max = true;
                c.max = decimal_of(s["exclusiveMaximum"]);
                c.max_exclusive = true;
            }
        }
        if (s.contains("multipleOf")) {
            if (!s["multipleOf"].is_number() || s["multipleOf"].get<double>() <= 0) {
                fail(path, "'multipleOf' must be a positive number");
            }
            c.multiple_of = decimal_of(s["multipleOf"]);
            c.has_multiple = true;
            if (c.multiple_of.int_digits == "1" && c.multiple_of.frac_digits.empty()) {
                c.has_multiple = false;  // multiples of 1 are the integers
                c.integer = true;
            }
        }
        try {
            int32_t num = lex_.number(c, path);
            std::vector<int32_t> excluded;
            if (s.contains(kNotValues)) {
                for (const auto& v : s[kNotValues]) {
                    if (json_type_of(v) != "integer") continue;
                    Decimal d = decimal_of(v);
                    excluded.push_back(g_.bytes(d.to_string()));
                    if (d.is_zero()) excluded.push_back(g_.bytes("-0"));
                }
            }
            if (excluded.empty() && !s.contains(kNotMultiples)) return num;
            const BuildLimits& lim = lex_.limits();
            std::shared_ptr<const ByteDfa> acc = expr_to_dfa(g_, num, lim);
            if (!excluded.empty()) acc = dfa_subtract(*acc, *expr_to_dfa(g_, g_.alt(excluded), lim), lim);
            if (s.contains(kNotMultiples)) {
                for (const auto& m : s[kNotMultiples]) {
                    if (!m.is_number() || m.get<double>() <= 0) fail(path, "'multipleOf' must be a positive number");
                    NumberConstraints mc;
                    mc.integer = integer;
                    mc.has_multiple = true;
                    mc.multiple_of = decimal_of(m);
                    // The multiples among texts of this number language (plain decimals: exponents are
                    // already excluded when a multipleOf applies).
                    acc = dfa_subtract(*acc, *expr_to_dfa(g_, lex_.number(mc, path), lim), lim);
                }
            }
            return g_.dfa(acc);
        } catch (const Error& e) {
            fail(path, e.what());
        }
    }

    int32_t item_rule(const Json& item, const std::string& path) {
        auto it = item_rules_.find(&item);
        if (it != item_rules_.end()) return g_.ref(it->second);
        int32_t body = gen(item, path);
        if (g_.is_nothing(body)) return body;
        int32_t rule = g_.add_rule("item_" + std::to_string(item_rules_.size()));
        g_.set_body(rule, body);
        item_rules_[&item] = rule;
        return g_.ref(rule);
    }

    int32_t array_expr(const Json& s, const std::string& path) {
        std::vector<const Json*> prefix;
        const Json* rest = nullptr;
        static const Json kTrue = true, kFalse = false;
        if (s.contains("prefixItems")) {
            if (!s["prefixItems"].is_array()) fail(path, "'prefixItems' must be an array");
            for (const auto& p : s["prefixItems"]) prefix.push_back(&p);
            rest = s.contains("items") ? &s["items"] : &kTrue;
        } else if (s.contains("items") && s["items"].is_array()) {
            for (const auto& p : s["items"]) prefix.push_back(&p);
            rest = s.contains("additionalItems") ? &s["additionalItems"] : &kTrue;
        } else {
            rest = s.contains("items") ? &s["items"] : &kTrue;
        }
        if (rest->is_array()) fail(path, "'items' after 'prefixItems' must be a schema");
        int64_t min_items = get_count(s, "minItems", path, 0);
        int64_t max_items = get_count(s, "maxItems", path, -1);
        if (max_items >= 0 && max_items < min_items) return g_.nothing();
        int64_t k = static_cast<int64_t>(prefix.size());
        max_items = effective_max(max_items, "maxItems", path);
        if (min_items > 10000 || max_items > 10000) fail(path, "minItems/maxItems above 10000 are not supported");
        std::vector<int32_t> elems;
        for (int64_t i = 0; i < k; ++i)
            elems.push_back(item_rule(*prefix[i], path + "/prefixItems/" + std::to_string(i)));
        int32_t rest_expr = item_rule(*rest, path + "/items");
        int32_t sep = g_.seq({lex_.ws(), g_.bytes(","), lex_.ws()});
        // tail(i): what follows once elements 0..i-1 are emitted.
        std::function<int32_t(int64_t)> tail = [&](int64_t i) -> int32_t {
            int32_t end_ok = i >= min_items ? g_.empty() : g_.nothing();
            if (max_items >= 0 && i >= max_items) return end_ok;
            if (i >= k && i >= min_items) {
                return max_items < 0 ? g_.star(g_.seq({sep, rest_expr}))
                                     : g_.repeat(g_.seq({sep, rest_expr}), 0, static_cast<int32_t>(max_items - i));
            }
            int32_t e = i < k ? elems[i] : rest_expr;
            return g_.alt({end_ok, g_.seq({sep, e, tail(i + 1)})});
        };
        int32_t nonempty = max_items == 0 ? g_.nothing() : g_.seq({k > 0 ? elems[0] : rest_expr, tail(1), lex_.ws()});
        // One whitespace run inside empty brackets, so that the bound holds there too.
        return g_.seq(
            {g_.bytes("["), lex_.ws(), g_.alt({min_items == 0 ? g_.empty() : g_.nothing(), nonempty}), g_.bytes("]")});
    }

    // The content DFA of a literal key set.
    std::shared_ptr<const ByteDfa> names_dfa(const std::vector<std::string>& names) {
        std::vector<int32_t> alts;
        for (const auto& n : names) {
            std::string enc = JsonLexicon::encode_string(n);
            alts.push_back(g_.bytes(enc.substr(1, enc.size() - 2)));
        }
        return expr_to_dfa(g_, g_.alt(alts), lex_.limits());
    }

    int32_t object_expr(const Json& s, const std::string& path) {
        struct Prop {
            std::string name;
            const Json* schema;
            bool required;
            std::string path;
        };
        static const Json kTrue = true, kFalse = false;
        std::vector<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) fail(path, "'required' must be an array");
            for (const auto& r : s["required"]) {
                if (!r.is_string()) fail(path, "'required' must list strings");
                if (std::find(required.begin(), required.end(), r.get<std::string>()) == required.end()) {
                    required.push_back(r);
                }
            }
        }
        auto is_required = [&](const std::string& n) {
            return std::find(required.begin(), required.end(), n) != required.end();
        };
        const Json* additional =
            s.contains("additionalProperties") ? &s["additionalProperties"] : (options_.strict ? &kFalse : &kTrue);
        if (s.contains("unevaluatedProperties") && !s.contains("additionalProperties")) {
            additional = &s["unevaluatedProperties"];
        }
        // Pattern properties (ECMAScript regexes over the key).
        std::vector<std::pair<std::string, const Json*>> patterns;
        if (s.contains("patternProperties")) {
            if (!s["patternProperties"].is_object()) fail(path, "'patternProperties' must be an object");
            for (const auto& [p, v] : s["patternProperties"].items()) patterns.push_back({p, &v});
        }
        std::vector<std::shared_ptr<const ByteDfa>> pattern_dfas;
        for (const auto& [p, v] : patterns) {
            StringConstraints c;
            c.patterns.push_back(p);
            pattern_dfas.push_back(lex_.string_content_dfa(c, path + "/patternProperties"));
        }
        std::shared_ptr<const ByteDfa> name_constraint;
        if (s.contains("propertyNames")) {
            const Json& pn = s["propertyNames"];
            if (pn.is_boolean()) {
                if (!pn.get<bool>()) name_constraint = std::make_shared<ByteDfa>();
            } else {
                if (!pn.is_object()) fail(path, "'propertyNames' must be a schema");
                for (const auto& [k, v] : pn.items()) {
                    if (validation_keywords().count(k) && k != "pattern" && k != "minLength" && k != "maxLength" &&
                        k != "format" && k != "enum" && k != "const" && k != "type") {
                        fail(path, "unsupported keyword '" + k + "' inside propertyNames");
                    }
                }
                if (pn.contains("enum") || pn.contains("const")) {
                    std::vector<std::string> names;
                    for (const auto& v : pn.contains("enum") ? pn["enum"] : Json::array({pn["const"]})) {
                        if (v.is_string()) names.push_back(v);
                    }
                    name_constraint = names_dfa(names);
                } else {
                    name_constraint = lex_.string_content_dfa(string_constraints(pn, path), path + "/propertyNames");
                }
            }
        }
        auto key_ok = [&](const std::string& name) {
            if (!name_constraint) return true;
            std::string enc = JsonLexicon::encode_string(name);
            return dfa_matches(*name_constraint, std::string_view(enc).substr(1, enc.size() - 2));
        };
        // Declared properties, then required keys that are not declared.
        std::vector<Prop> props;
        std::vector<std::string> declared;
        auto schema_for_extra = [&](const std::string& name) -> const Json* {
            std::string enc = JsonLexicon::encode_string(name);
            std::string_view content = std::string_view(enc).substr(1, enc.size() - 2);
            const Json* acc = nullptr;
            for (size_t i = 0; i < patterns.size(); ++i) {
                if (dfa_matches(*pattern_dfas[i], content))
                    acc = acc ? merge(acc, patterns[i].second, path, 0) : patterns[i].second;
            }
            return acc ? acc : additional;
        };
        if (s.contains("properties")) {
            if (!s["properties"].is_object()) fail(path, "'properties' must be an object");
            for (const auto& [name, ps] : s["properties"].items()) {
                declared.push_back(name);
                const Json* schema = &ps;
                std::string enc = JsonLexicon::encode_string(name);
                for (size_t i = 0; i < patterns.size(); ++i) {
                    if (dfa_matches(*pattern_dfas[i], std::string_view(enc).substr(1, enc.size() - 2))) {
                        schema = merge(schema, patterns[i].second, path, 0);
                    }
                }
                if (!key_ok(name)) schema = &kFalse;
                props.push_back({name, schema, is_required(name), path + "/properties/" + escape_pointer(name)});
            }
        }
        for (const auto& r : required) {
            if (std::find(declared.begin(), declared.end(), r) != declared.end()) continue;
            declared.push_back(r);
            props.push_back({r, key_ok(r) ? schema_for_extra(r) : &kFalse, true, path + "/required"});
        }
        int64_t min_props = get_count(s, "minProperties", path, 0);
        int64_t max_props = effective_max(get_count(s, "maxProperties", path, -1), "maxProperties", path);
        if (max_props >= 0 && max_props < min_props) return g_.nothing();
        // Key/value pairs.
        std::vector<int32_t> kv;
        std::vector<bool> req;
        for (const auto& p : props) {
            int32_t value = gen(*p.schema, p.path);
            if (g_.is_nothing(value)) {
                if (p.required) return g_.nothing();
                continue;  // the property can never be present
            }
            kv.push_back(g_.seq({lex_.string_literal(p.name), lex_.ws(), g_.bytes(":"), lex_.ws(), value}));
            req.push_back(p.required);
        }
        // Extra properties: keys outside the declared names, by pattern or additionalProperties.
        std::vector<int32_t> extras;
        bool any_extra = !patterns.empty() || !(additional->is_boolean() && !additional->get<bool>());
        if (any_extra) {
            std::shared_ptr<const ByteDfa> excluded = declared.empty() ? nullptr : names_dfa(declared);
            auto keys_for = [&](std::shared_ptr<const ByteDfa> lang) {
                if (excluded) lang = dfa_subtract(*lang, *excluded, lex_.limits());
                if (name_constraint) lang = dfa_intersect(*lang, *name_constraint, lex_.limits());
                return lang;
            };
            for (size_t i = 0; i < patterns.size(); ++i) {
                // A key matching several patterns must satisfy all of their schemas.
                const Json* schema = patterns[i].second;
                std::shared_ptr<const ByteDfa> lang = pattern_dfas[i];
                for (size_t j = 0; j < patterns.size(); ++j) {
                    if (j != i) lang = dfa_subtract(*lang, *pattern_dfas[j], lex_.limits());
                }
                int32_t value = gen(*schema, path + "/patternProperties/" + escape_pointer(patterns[i].first));
                add_extra(extras, keys_for(lang), value);
                for (size_t j = i + 1; j < patterns.size(); ++j) {
                    auto both = dfa_intersect(*pattern_dfas[i], *pattern_dfas[j], lex_.limits());
                    if (both->num_states == 0) continue;
                    if (patterns.size() > 2)
                        fail(path, "overlapping patternProperties (more than two) are not supported");
                    add_extra(extras, keys_for(both), gen(*merge(schema, patterns[j].second, path, 0), path));
                }
            }
            if (!(additional->is_boolean() && !additional->get<bool>())) {
                std::shared_ptr<const ByteDfa> lang = lex_.any_content_dfa();
                for (const auto& pd : pattern_dfas) lang = dfa_subtract(*lang, *pd, lex_.limits());
                add_extra(extras, keys_for(lang), gen(*additional, path + "/additionalProperties"));
            }
        }
        int32_t kvx = extras.empty() ? -1 : g_.alt(extras);
        // Property counts are tracked up to 64; larger bounds are fine only where the declared keys
        // decide them.
        int64_t most = static_cast<int64_t>(kv.size());
        if (max_props > 64) {
            if (kvx >= 0 || most > max_props) fail(path, "maxProperties above 64 is not supported");
            max_props = -1;  // implied: at most kv.size() properties exist
        }
        if (min_props > 64) {
            if (kvx >= 0) fail(path, "minProperties above 64 is not supported");
            if (min_props > most) return g_.nothing();
            fail(path, "minProperties above 64 is not supported");
        }
        return g_.seq({g_.bytes("{"), lex_.ws(), object_items(kv, req, kvx, min_props, max_props), g_.bytes("}")});
    }

    // Keys of extra properties are a separate leaf rule: their states are wide (almost any text) and
    // a leaf rule's masks are walked fast and shared between grammars with the same key set.
    void add_extra(std::vector<int32_t>& extras, const std::shared_ptr<const ByteDfa>& keys, int32_t value) {
        if (!keys || keys->num_states == 0 || g_.is_nothing(value)) return;
        int32_t rule = g_.add_rule("key_" + std::to_string(key_counter_++));
        g_.set_body(rule, g_.seq({g_.bytes("\""), g_.dfa(keys), g_.bytes("\"")}));
        g_.set_separate(rule);
        extras.push_back(g_.seq({g_.ref(rule), lex_.ws(), g_.bytes(":"), lex_.ws(), value}));
    }

    // Properties in order with optional ones skippable, commas only between emitted ones, and the
    // count kept within [min_props, max_props]. The separator is shared: after a property comes either
    // the end or one separator followed by a choice of the next property (later optional ones may be
    // skipped), so DFA subsets stay small. Pick/Rest are rules referenced in tail position, which the
    // automaton builder shares (linear size).
    int32_t object_items(const std::vector<int32_t>& kv, const std::vector<bool>& req, int32_t kvx, int64_t min_props,
                         int64_t max_props) {
        int32_t n = static_cast<int32_t>(kv.size());
        int64_t sat = std::max<int64_t>(1, max_props >= 0 ? max_props : min_props);
        int32_t sep = g_.seq({lex_.ws(), g_.bytes(","), lex_.ws()});
        int32_t obj = object_counter_++;
        std::vector<bool> required_after(n + 1, false);  // some required property at index >= i
        for (int32_t i = n - 1; i >= 0; --i) required_after[i] = required_after[i + 1] || req[i];
        std::map<std::tuple<int, int32_t, int64_t>, int32_t> rules;
        auto memo = [&](int kind, int32_t i, int64_t c, const std::function<int32_t()>& body) {
            auto key = std::make_tuple(kind, i, c);
            auto it = rules.find(key);
            if (it != rules.end()) return g_.ref(it->second);
            std::string name = "obj" + std::to_string(obj) +
                               (kind == 0   ? "_pick"
                                : kind == 1 ? "_rest"
                                            : "_extra") +
                               std::to_string(i) + "_" + std::to_string(c);
            int32_t rule = g_.add_rule(name);
            rules[key] = rule;
            g_.set_body(rule, body());
            return g_.ref(rule);
        };
        auto can_take = [&](int64_t c) { return max_props < 0 || c + 1 <= max_props; };
        auto next_count = [&](int64_t c) { return std::min(c + 1, sat); };
        // Extra properties after the declared ones; c counts emitted properties (saturated).
        std::function<int32_t(int64_t)> extra_rest = [&](int64_t c) -> int32_t {
            int32_t end_ok = c >= min_props ? g_.empty() : g_.nothing();
            if (!can_take(c)) return end_ok;
            if (c == sat) return g_.star(g_.seq({sep, kvx}));
            return memo(2, n, c, [&] { return g_.alt({end_ok, g_.seq({sep, kvx, extra_rest(next_count(c))})}); });
        };
        std::function<int32_t(int32_t, int64_t)> pick, rest;
        // pick(i, c): the next property is one of i, i+1, ... (skipping optional ones), or an extra one.
        pick = [&](int32_t i, int64_t c) -> int32_t {
            return memo(0, i, c, [&]() -> int32_t {
                if (!can_take(c)) return g_.nothing();
                if (i == n) return kvx < 0 ? g_.nothing() : g_.seq({kvx, extra_rest(next_count(c))});
                int32_t take = g_.seq({kv[i], rest(i + 1, next_count(c))});
                int32_t skip = req[i] ? g_.nothing() : pick(i + 1, c);
                return g_.alt({take, skip});
            });
        };
        // rest(i, c): after an emitted property, either the end or a separator and the next property.
        rest = [&](int32_t i, int64_t c) -> int32_t {
            return memo(1, i, c, [&]() -> int32_t {
                int32_t end_ok = (!required_after[i] && c >= min_props) ? g_.empty() : g_.nothing();
                bool more = (i < n || kvx >= 0) && can_take(c);
                return g_.alt({end_ok, more ? g_.seq({sep, pick(i, c)}) : g_.nothing()});
            });
        };
        int32_t empty_ok = (!required_after[0] && min_props == 0) ? g_.empty() : g_.nothing();
        return g_.alt({empty_ok, g_.seq({pick(0, 0), lex_.ws()})});  // the closing whitespace, when not empty
    }

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

}  // namespace

Lowered lower_json_schema(std::string_view schema_json, const CompileOptions& options) {
    Json root;
    try {
        root = Json::parse(schema_json);
    } catch (const Json::parse_error& e) {
        DI_THROW("json schema is not valid JSON: ", e.what());
    }
    Lowered out;
    BuildLimits limits;
    limits.max_states = options.max_states;
    limits.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.max_compile_ms);
    SchemaLowering lowering(root, options, out, limits);
    lowering.lower();
    return out;
}

}  // namespace deepinfer::grammar
