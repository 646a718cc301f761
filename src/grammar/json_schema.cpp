// JSON Schema -> grammar IR.
//
// Objects emit their declared properties in the schema's order (optional ones may be skipped), then
// required-but-undeclared keys, then extra properties (patternProperties / additionalProperties),
// whose keys exclude the declared names. Arrays follow prefixItems/items with minItems/maxItems.
// Combinators: allOf is merged into one schema, anyOf/oneOf become alternatives (oneOf is treated as
// anyOf), $ref becomes a rule (recursion allowed). Validation keywords the grammar cannot enforce are
// errors; annotations and unknown keywords are ignored (JSON Schema says unknown keywords carry no
// constraint); unknown formats are reported as warnings.
//
// This file: the entry point, references, allOf merging, the combinators, 'not' rewriting and the walk over a
// schema; the typed values (strings, numbers, arrays, objects) are in json_schema_values.cpp, the class they
// share in json_schema_lowering.h.
#include <deque>
#include <map>
#include <set>

#include "grammar/json_schema_lowering.h"

namespace deepinfer::grammar {
namespace json_schema_detail {

void SchemaLowering::lower() {
    int32_t root = g_.add_rule("root");
    g_.set_root(root);
    g_.set_body(root, gen(root_, "#"));
    while (!pending_.empty()) {
        auto [rule, pointer] = pending_.front();
        pending_.pop_front();
        g_.set_body(rule, gen(*resolve_pointer(pointer, pointer), pointer));
    }
}

void SchemaLowering::fail(const std::string& path, const std::string& why) {
    DI_THROW("json schema error at ", path, ": ", why);
}

const Json* SchemaLowering::own(Json j) {
    owned_.push_back(std::make_unique<Json>(std::move(j)));
    return owned_.back().get();
}

const Json* SchemaLowering::resolve_pointer(const std::string& ref, const std::string& path) {
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

const Json* SchemaLowering::find_anchor(const Json& s, const std::string& name) {
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

int32_t SchemaLowering::ref_expr(const std::string& ref, const std::string& path) {
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
const Json* SchemaLowering::inline_ref(const Json* s, const std::string& path, int depth) {
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

bool SchemaLowering::constraining(const Json& s) {
    if (s.is_boolean()) return !s.get<bool>();
    if (!s.is_object()) return true;
    for (const auto& [k, v] : s.items()) {
        if (validation_keywords().count(k)) return true;
    }
    return false;
}

bool SchemaLowering::needs_normalize(const Json& s) {
    return (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean()) ||
           (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean());
}

Json SchemaLowering::normalize(const Json& s) {
    Json out = s;
    // Draft 4 boolean exclusive bounds.
    for (auto [excl, bound] : {std::pair{"exclusiveMinimum", "minimum"}, std::pair{"exclusiveMaximum", "maximum"}}) {
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

const Json* SchemaLowering::merge(const Json* a, const Json* b, const std::string& path, int depth) {
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
        fail(path, "allOf combining patternProperties with another subschema's additionalProperties is not supported");
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

void SchemaLowering::check_keywords(const Json& s, const std::string& path) {
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
            bool at_most_one = s.contains("maxItems") && s["maxItems"].is_number() && s["maxItems"].get<double>() <= 1;
            if (!at_most_one) fail(path, "unsupported JSON Schema keyword 'uniqueItems' (true)");
        }
    }
}

int32_t SchemaLowering::gen(const Json& schema, const std::string& path) {
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
        for (size_t i = 0; i < items.size(); ++i) acc = merge(acc, &items[i], path + "/allOf/" + std::to_string(i), 0);
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
int32_t SchemaLowering::exactly_one(const std::vector<const Json*>& schemas, const std::vector<int32_t>& alts,
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

int32_t SchemaLowering::exactly_one_by_required(const std::vector<const Json*>& schemas,
                                                const std::vector<size_t>& live, const std::string& path) {
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

bool SchemaLowering::may_hold_object(const Json& x, int depth) {
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

std::set<std::string> SchemaLowering::value_types(const Json& s) {
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
bool SchemaLowering::schemas_disjoint(const Json& x, const Json& y, int depth) {
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
        return s.contains("const") ? &s["const"] : (s.contains("enum") && s["enum"].is_array()) ? &s["enum"] : nullptr;
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

std::set<std::string> SchemaLowering::allowed_types(const Json& s, const std::string& path) {
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
Json SchemaLowering::with_types(const Json& s, const std::set<std::string>& keep, const std::string& path) {
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
std::vector<Json> SchemaLowering::rewrite_not(const Json& s, const std::string& path) {
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
            if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) == allowed.end()) {
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
                if (k.is_string() && std::find(ks.begin(), ks.end(), k.get<std::string>()) == ks.end()) ks.push_back(k);
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

}  // namespace json_schema_detail

using json_schema_detail::Json;
using json_schema_detail::SchemaLowering;

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
