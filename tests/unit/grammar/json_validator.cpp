// A small JSON Schema validator for the tests: the oracle for random walks. Written independently of
// the grammar module (tree walk over the instance, PCRE2 for patterns, hand-written format checks).
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "test_util.h"

namespace deepinfer::grammar::testing {
namespace {

using Json = nlohmann::ordered_json;

int64_t code_points(const std::string& s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool is_integer(const Json& v) {
    if (v.is_number_integer() || v.is_number_unsigned()) return true;
    if (v.is_number_float()) {
        double d = v.get<double>();
        return std::isfinite(d) && d == std::floor(d);
    }
    return false;
}

bool all_digits(const std::string& s, size_t from, size_t len) {
    if (from + len > s.size()) return false;
    for (size_t i = from; i < from + len; ++i) {
        if (s[i] < '0' || s[i] > '9') return false;
    }
    return true;
}

bool valid_date(const std::string& s) {
    if (s.size() != 10 || !all_digits(s, 0, 4) || s[4] != '-' || !all_digits(s, 5, 2) || s[7] != '-' ||
        !all_digits(s, 8, 2)) {
        return false;
    }
    int y = std::stoi(s.substr(0, 4)), m = std::stoi(s.substr(5, 2)), d = std::stoi(s.substr(8, 2));
    static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12 || d < 1) return false;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= kDays[m - 1] + (m == 2 && leap ? 1 : 0);
}

bool valid_time(const std::string& s) {
    if (s.size() < 9 || !all_digits(s, 0, 2) || s[2] != ':' || !all_digits(s, 3, 2) || s[5] != ':' ||
        !all_digits(s, 6, 2)) {
        return false;
    }
    if (std::stoi(s.substr(0, 2)) > 23 || std::stoi(s.substr(3, 2)) > 59 || std::stoi(s.substr(6, 2)) > 60)
        return false;
    size_t i = 8;
    if (i < s.size() && s[i] == '.') {
        size_t j = i + 1;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        if (j == i + 1) return false;
        i = j;
    }
    std::string zone = s.substr(i);
    if (zone == "Z" || zone == "z") return true;
    return zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && all_digits(zone, 1, 2) && zone[3] == ':' &&
           all_digits(zone, 4, 2) && std::stoi(zone.substr(1, 2)) <= 23 && std::stoi(zone.substr(4, 2)) <= 59;
}

bool valid_label(const std::string& l) {
    if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
    for (char c : l) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
    return true;
}

bool valid_hostname(const std::string& s) {
    size_t start = 0;
    for (;;) {
        size_t dot = s.find('.', start);
        if (!valid_label(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start))) return false;
        if (dot == std::string::npos) return true;
        start = dot + 1;
    }
}

std::string check_format(const std::string& fmt, const std::string& s) {
    bool ok = true;
    if (fmt == "date") {
        ok = valid_date(s);
    } else if (fmt == "time") {
        ok = valid_time(s);
    } else if (fmt == "date-time") {
        ok = s.size() > 11 && valid_date(s.substr(0, 10)) && (s[10] == 'T' || s[10] == 't') && valid_time(s.substr(11));
    } else if (fmt == "uuid") {
        ok = s.size() == 36;
        for (size_t i = 0; ok && i < 36; ++i) {
            ok = (i == 8 || i == 13 || i == 18 || i == 23) ? s[i] == '-'
                                                           : std::isxdigit(static_cast<unsigned char>(s[i])) != 0;
        }
    } else if (fmt == "email") {
        size_t at = s.find('@');
        ok = at != std::string::npos && at > 0 && s.find('@', at + 1) == std::string::npos &&
             valid_hostname(s.substr(at + 1));
    } else if (fmt == "hostname") {
        ok = valid_hostname(s);
    } else if (fmt == "ipv4") {
        ok = pcre2_full_match(
            "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}", s);
    } else if (fmt == "uri") {
        ok = pcre2_full_match("[A-Za-z][A-Za-z0-9+.-]*:[^\\s\"<>\\\\^`{|}]*", s);
    }
    return ok ? "" : "not a valid " + fmt + ": " + s;
}

class Validator {
public:
    explicit Validator(const Json& root) : root_(root) {}

    std::string validate(const Json& s, const Json& v, const std::string& path, int depth = 0) {
        if (depth > 64) return "schema recursion too deep";
        if (s.is_boolean()) return s.get<bool>() ? "" : path + ": false schema";
        if (s.contains("$ref")) {
            std::string r = s["$ref"];
            const Json* t = &root_;
            if (r != "#") {
                size_t pos = 2;
                while (pos <= r.size()) {
                    size_t next = r.find('/', pos);
                    if (next == std::string::npos) next = r.size();
                    t = &(*t)[r.substr(pos, next - pos)];
                    pos = next + 1;
                }
            }
            std::string e = validate(*t, v, path, depth + 1);
            if (!e.empty()) return e;
        }
        if (s.contains("type")) {
            std::vector<std::string> types;
            if (s["type"].is_string()) {
                types.push_back(s["type"]);
            } else {
                for (const auto& t : s["type"]) types.push_back(t);
            }
            bool ok = false;
            for (const auto& t : types) {
                ok = ok || (t == "null" && v.is_null()) || (t == "boolean" && v.is_boolean()) ||
                     (t == "string" && v.is_string()) || (t == "array" && v.is_array()) ||
                     (t == "object" && v.is_object()) || (t == "number" && v.is_number()) ||
                     (t == "integer" && is_integer(v));
            }
            if (!ok) return path + ": wrong type";
        }
        if (s.contains("enum")) {
            bool ok = false;
            for (const auto& e : s["enum"]) ok = ok || e == v;
            if (!ok) return path + ": not in enum";
        }
        if (s.contains("const") && s["const"] != v) return path + ": not the const";
        for (const char* k : {"allOf", "anyOf", "oneOf"}) {
            if (!s.contains(k)) continue;
            int passed = 0;
            std::string first_error;
            for (const auto& sub : s[k]) {
                std::string e = validate(sub, v, path, depth + 1);
                if (e.empty()) {
                    ++passed;
                } else if (first_error.empty()) {
                    first_error = e;
                }
            }
            std::string key = k;
            if (key == "allOf" && passed != static_cast<int>(s[k].size())) return first_error;
            if (key == "anyOf" && passed == 0) return path + ": no anyOf branch: " + first_error;
            if (key == "oneOf" && passed != 1) return path + ": oneOf matched " + std::to_string(passed);
        }
        if (s.contains("not") && validate(s["not"], v, path, depth + 1).empty()) return path + ": matches 'not'";
        if (v.is_string()) {
            const std::string& str = v.get_ref<const std::string&>();
            int64_t n = code_points(str);
            if (s.contains("minLength") && n < s["minLength"].get<int64_t>()) return path + ": too short";
            if (s.contains("maxLength") && n > s["maxLength"].get<int64_t>()) return path + ": too long";
            if (s.contains("pattern") && !pcre2_search(s["pattern"], str)) return path + ": pattern mismatch";
            if (s.contains("format")) {
                std::string e = check_format(s["format"], str);
                if (!e.empty()) return path + ": " + e;
            }
        }
        if (v.is_number()) {
            double x = v.get<double>();
            if (s.contains("minimum") && x < s["minimum"].get<double>()) return path + ": below minimum";
            if (s.contains("maximum") && x > s["maximum"].get<double>()) return path + ": above maximum";
            for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"}) {
                if (!s.contains(k)) continue;
                bool is_min = k[9] == 'M' && k[10] == 'i';
                double bound;
                if (s[k].is_boolean()) {  // draft 4: modifies minimum / maximum
                    if (!s[k].get<bool>() || !s.contains(is_min ? "minimum" : "maximum")) continue;
                    bound = s[is_min ? "minimum" : "maximum"].get<double>();
                } else {
                    bound = s[k].get<double>();
                }
                if (is_min ? x <= bound : x >= bound) return path + ": outside the exclusive bound";
            }
            if (s.contains("multipleOf")) {
                double q = x / s["multipleOf"].get<double>();
                if (std::fabs(q - std::round(q)) > 1e-9) return path + ": not a multiple";
            }
        }
        if (v.is_array()) {
            size_t k = 0;
            if (s.contains("prefixItems")) {
                for (; k < s["prefixItems"].size() && k < v.size(); ++k) {
                    std::string e = validate(s["prefixItems"][k], v[k], path + "/" + std::to_string(k), depth + 1);
                    if (!e.empty()) return e;
                }
            }
            if (s.contains("items")) {
                for (size_t i = k; i < v.size(); ++i) {
                    std::string e = validate(s["items"], v[i], path + "/" + std::to_string(i), depth + 1);
                    if (!e.empty()) return e;
                }
            }
            if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return path + ": too few items";
            if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return path + ": too many items";
        }
        if (v.is_object()) {
            if (s.contains("required")) {
                for (const auto& r : s["required"]) {
                    if (!v.contains(r.get<std::string>())) return path + ": missing " + r.get<std::string>();
                }
            }
            if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>())
                return path + ": too few properties";
            if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>())
                return path + ": too many properties";
            for (const auto& [key, val] : v.items()) {
                std::string p = path + "/" + key;
                bool matched = false;
                if (s.contains("properties") && s["properties"].contains(key)) {
                    matched = true;
                    std::string e = validate(s["properties"][key], val, p, depth + 1);
                    if (!e.empty()) return e;
                }
                if (s.contains("patternProperties")) {
                    for (const auto& [pat, sub] : s["patternProperties"].items()) {
                        if (!pcre2_search(pat, key)) continue;
                        matched = true;
                        std::string e = validate(sub, val, p, depth + 1);
                        if (!e.empty()) return e;
                    }
                }
                if (s.contains("propertyNames")) {
                    std::string e = validate(s["propertyNames"], Json(key), p, depth + 1);
                    if (!e.empty()) return e;
                }
                if (!matched && s.contains("additionalProperties")) {
                    std::string e = validate(s["additionalProperties"], val, p, depth + 1);
                    if (!e.empty()) return path + ": additional property " + key + ": " + e;
                }
            }
        }
        return "";
    }

private:
    const Json& root_;
};

}  // namespace

std::string validate_json(const std::string& schema_json, std::string_view instance_text) {
    Json schema = Json::parse(schema_json);
    Json instance;
    try {
        instance = Json::parse(instance_text);
    } catch (const Json::parse_error& e) {
        return std::string("not JSON: ") + e.what();
    }
    Validator v(schema);
    return v.validate(schema, instance, "#");
}

}  // namespace deepinfer::grammar::testing
