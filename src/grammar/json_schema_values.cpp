// JSON Schema lowering, the typed values: enums and constants, strings, numbers, arrays and objects (see
// json_schema.cpp for the walk that reaches them and json_schema_lowering.h for the class).
#include <map>
#include <set>

#include "grammar/json_schema_lowering.h"

namespace deepinfer::grammar::json_schema_detail {

bool SchemaLowering::value_fits(const Json& v, const Json& s, const std::set<std::string>& types) {
    std::string t = json_type_of(v);
    if (!types.count(t) && !(t == "integer" && types.count("number"))) return false;
    if (v.is_string()) {
        int64_t len = utf8_length(v.get<std::string>());
        if (s.contains("minLength") && s["minLength"].is_number() && len < s["minLength"].get<double>()) return false;
        if (s.contains("maxLength") && s["maxLength"].is_number() && len > s["maxLength"].get<double>()) return false;
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

int32_t SchemaLowering::enum_expr(const Json& s, const std::set<std::string>& types, const std::string& path) {
    Json values;
    if (s.contains("const")) {
        values = Json::array({s["const"]});
        if (s.contains("enum")) {
            if (!s["enum"].is_array()) fail(path, "'enum' must be an array");
            if (std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end()) values = Json::array();
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

int32_t SchemaLowering::literal(const Json& v) {
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
int64_t SchemaLowering::effective_max(int64_t max, const char* keyword, const std::string& path) {
    if (max <= 100000000) return max;
    warnings_.push_back(std::string(keyword) + " " + std::to_string(max) + " at " + path + " treated as unbounded");
    return -1;
}

int64_t SchemaLowering::get_count(const Json& s, const char* key, const std::string& path, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const Json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0) fail(path, std::string("'") + key + "' must be a non-negative number");
    double d = v.get<double>();
    return d > 1e15 ? int64_t{1} << 50 : static_cast<int64_t>(d);
}

int32_t SchemaLowering::typed(const std::string& t, const Json& s, const std::string& path) {
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

StringConstraints SchemaLowering::string_constraints(const Json& s, const std::string& path) {
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

int32_t SchemaLowering::string_expr(const Json& s, const std::string& path) {
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

int32_t SchemaLowering::number_expr(const Json& s, bool integer, const std::string& path) {
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

int32_t SchemaLowering::item_rule(const Json& item, const std::string& path) {
    auto it = item_rules_.find(&item);
    if (it != item_rules_.end()) return g_.ref(it->second);
    int32_t body = gen(item, path);
    if (g_.is_nothing(body)) return body;
    int32_t rule = g_.add_rule("item_" + std::to_string(item_rules_.size()));
    g_.set_body(rule, body);
    item_rules_[&item] = rule;
    return g_.ref(rule);
}

int32_t SchemaLowering::array_expr(const Json& s, const std::string& path) {
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
    for (int64_t i = 0; i < k; ++i) elems.push_back(item_rule(*prefix[i], path + "/prefixItems/" + std::to_string(i)));
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
std::shared_ptr<const ByteDfa> SchemaLowering::names_dfa(const std::vector<std::string>& names) {
    std::vector<int32_t> alts;
    for (const auto& n : names) {
        std::string enc = JsonLexicon::encode_string(n);
        alts.push_back(g_.bytes(enc.substr(1, enc.size() - 2)));
    }
    return expr_to_dfa(g_, g_.alt(alts), lex_.limits());
}

int32_t SchemaLowering::object_expr(const Json& s, const std::string& path) {
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
                if (patterns.size() > 2) fail(path, "overlapping patternProperties (more than two) are not supported");
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
void SchemaLowering::add_extra(std::vector<int32_t>& extras, const std::shared_ptr<const ByteDfa>& keys,
                               int32_t value) {
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
int32_t SchemaLowering::object_items(const std::vector<int32_t>& kv, const std::vector<bool>& req, int32_t kvx,
                                     int64_t min_props, int64_t max_props) {
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

}  // namespace deepinfer::grammar::json_schema_detail
