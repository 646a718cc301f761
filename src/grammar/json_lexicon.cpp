#include "grammar/json_lexicon.h"

#include <algorithm>

#include "core/json_text.h"
#include "deepinfer/error.h"
#include "grammar/frontend.h"

namespace deepinfer::grammar {

// ---------------------------------------------------------------------------------------------
// Decimal

Decimal Decimal::parse(std::string_view s) {
    Decimal d;
    size_t i = 0;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) d.negative = s[i++] == '-';
    std::string digits;
    int64_t point = -1;
    for (; i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'); ++i) {
        if (s[i] == '.') {
            DI_CHECK(point < 0, "bad number '", std::string(s), "'");
            point = static_cast<int64_t>(digits.size());
        } else {
            digits += s[i];
        }
    }
    DI_CHECK(!digits.empty(), "bad number '", std::string(s), "'");
    if (point < 0) point = static_cast<int64_t>(digits.size());
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        bool eneg = false;
        if (i < s.size() && (s[i] == '-' || s[i] == '+')) eneg = s[i++] == '-';
        int64_t e = 0;
        DI_CHECK(i < s.size(), "bad number '", std::string(s), "'");
        for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i)
            e = std::min<int64_t>(e * 10 + (s[i] - '0'), 100000);
        DI_CHECK(e < 4000, "number exponent out of range in '", std::string(s), "'");
        point += eneg ? -e : e;
    }
    DI_CHECK(i == s.size(), "bad number '", std::string(s), "'");
    // Place the decimal point, padding with zeros as needed.
    if (point < 0) {
        digits.insert(0, static_cast<size_t>(-point), '0');
        point = 0;
    }
    if (point > static_cast<int64_t>(digits.size())) digits.append(point - digits.size(), '0');
    d.int_digits = digits.substr(0, point);
    d.frac_digits = digits.substr(point);
    size_t nz = d.int_digits.find_first_not_of('0');
    d.int_digits = nz == std::string::npos ? "0" : d.int_digits.substr(nz);
    while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
    if (d.is_zero()) d.negative = false;
    return d;
}

std::string Decimal::to_string() const {
    return (negative ? "-" : "") + int_digits + (frac_digits.empty() ? "" : "." + frac_digits);
}

namespace {

// Non-negative canonical digit strings.
std::string uint_inc(std::string s) {
    int i = static_cast<int>(s.size()) - 1;
    while (i >= 0 && s[i] == '9') s[i--] = '0';
    if (i < 0) return "1" + s;
    ++s[i];
    return s;
}

std::string uint_dec(std::string s) {  // s >= 1
    int i = static_cast<int>(s.size()) - 1;
    while (s[i] == '0') s[i--] = '9';
    --s[i];
    size_t nz = s.find_first_not_of('0');
    return nz == std::string::npos ? "0" : s.substr(nz);
}

int uint_cmp(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
}

// Signed integers as (negative, digits).
struct SInt {
    bool neg = false;
    std::string digits = "0";
};

SInt sint_inc(SInt v) {
    if (!v.neg) return {false, uint_inc(v.digits)};
    std::string m = uint_dec(v.digits);
    return {m != "0", m};
}

SInt sint_dec(SInt v) {
    if (v.neg) return {true, uint_inc(v.digits)};
    if (v.digits == "0") return {true, "1"};
    return {false, uint_dec(v.digits)};
}

// Digit-wise range languages (IR).
class Ranges {
public:
    explicit Ranges(Grammar& g) : g_(g) {}

    int32_t digits(char lo, char hi) { return lo > hi ? g_.nothing() : g_.chars(CharSet::of(lo, hi)); }
    int32_t any_digit() { return digits('0', '9'); }
    int32_t uint_any() { return g_.alt({g_.bytes("0"), g_.seq({digits('1', '9'), g_.star(any_digit())})}); }

    // Fixed-length digit strings (leading zeros allowed) >= / <= s.
    int32_t fixed_ge(std::string_view s) {
        if (s.empty()) return g_.empty();
        int32_t n = static_cast<int32_t>(s.size()) - 1;
        return g_.alt({g_.seq({g_.bytes(s.substr(0, 1)), fixed_ge(s.substr(1))}),
                       g_.seq({digits(s[0] + 1, '9'), g_.repeat(any_digit(), n, n)})});
    }
    int32_t fixed_le(std::string_view s) {
        if (s.empty()) return g_.empty();
        int32_t n = static_cast<int32_t>(s.size()) - 1;
        return g_.alt({g_.seq({g_.bytes(s.substr(0, 1)), fixed_le(s.substr(1))}),
                       g_.seq({digits('0', s[0] - 1), g_.repeat(any_digit(), n, n)})});
    }
    // Canonical non-negative integers >= / <= d.
    int32_t uint_ge(const std::string& d) {
        if (d == "0") return uint_any();
        int32_t n = static_cast<int32_t>(d.size());
        int32_t same = n == 1 ? digits(d[0], '9')
                              : g_.alt({g_.seq({g_.bytes(d.substr(0, 1)), fixed_ge(std::string_view(d).substr(1))}),
                                        g_.seq({digits(d[0] + 1, '9'), g_.repeat(any_digit(), n - 1, n - 1)})});
        int32_t longer = g_.seq({digits('1', '9'), g_.repeat(any_digit(), n, kUnbounded)});
        return g_.alt({same, longer});
    }
    int32_t uint_le(const std::string& d) {
        int32_t n = static_cast<int32_t>(d.size());
        if (n == 1) return digits('0', d[0]);
        int32_t shorter = g_.alt({g_.bytes("0"), g_.seq({digits('1', '9'), g_.repeat(any_digit(), 0, n - 2)})});
        int32_t same = g_.alt({g_.seq({g_.bytes(d.substr(0, 1)), fixed_le(std::string_view(d).substr(1))}),
                               g_.seq({digits('1', d[0] - 1), g_.repeat(any_digit(), n - 1, n - 1)})});
        return g_.alt({shorter, same});
    }
    // Fraction digit strings (possibly empty) whose value 0.xxx is >= / <= 0.r (strict when excl).
    int32_t frac_ge(std::string_view r, bool excl) {
        if (r.empty()) {
            return excl ? g_.seq({g_.star(any_digit()), digits('1', '9'), g_.star(any_digit())}) : g_.star(any_digit());
        }
        return g_.alt({g_.seq({g_.bytes(r.substr(0, 1)), frac_ge(r.substr(1), excl)}),
                       g_.seq({digits(r[0] + 1, '9'), g_.star(any_digit())})});
    }
    int32_t frac_le(std::string_view r, bool excl) {
        if (r.empty()) return excl ? g_.nothing() : g_.star(g_.bytes("0"));
        return g_.alt({g_.seq({g_.bytes(r.substr(0, 1)), frac_le(r.substr(1), excl)}),
                       g_.seq({digits('0', r[0] - 1), g_.star(any_digit())})});
    }
    int32_t frac_opt() { return g_.optional(g_.seq({g_.bytes("."), g_.plus(any_digit())})); }
    int32_t any_magnitude() { return g_.seq({uint_any(), frac_opt()}); }
    // Unsigned decimals (no exponent) >= / <= i.f.
    int32_t mag_ge(const std::string& i, const std::string& f, bool excl) {
        int32_t above = g_.seq({uint_ge(uint_inc(i)), frac_opt()});
        int32_t at = g_.seq({g_.bytes(i), g_.alt({(f.empty() && !excl) ? g_.empty() : g_.nothing(),
                                                  g_.seq({g_.bytes("."), frac_ge(f, excl)})})});
        return g_.alt({above, at});
    }
    int32_t mag_le(const std::string& i, const std::string& f, bool excl) {
        int32_t below = i == "0" ? g_.nothing() : g_.seq({uint_le(uint_dec(i)), frac_opt()});
        int32_t at = g_.seq({g_.bytes(i), g_.alt({(f.empty() && excl) ? g_.nothing() : g_.empty(),
                                                  g_.seq({g_.bytes("."), frac_le(f, excl)})})});
        return g_.alt({below, at});
    }

private:
    Grammar& g_;
};

// Multiples of m (> 0, given as M / 10^d) among number texts -?digits(.digits)?.
std::shared_ptr<const ByteDfa> multiple_of_dfa(const Decimal& m, const BuildLimits& limits) {
    std::string all = m.int_digits + m.frac_digits;
    size_t nz = all.find_first_not_of('0');
    DI_CHECK(nz != std::string::npos, "multipleOf must be positive");
    all = all.substr(nz);
    DI_CHECK(all.size() <= 6, "multipleOf ", m.to_string(), " has too many significant digits (supported: up to 6)");
    int64_t M = std::stoll(all);
    int32_t d = static_cast<int32_t>(m.frac_digits.size());
    // States: 0 start, 1 after '-', INT(r), DOT(r), FRAC(r, j) for j in 1..d, TAIL(r).
    int64_t n64 = 2 + M * (3 + d);
    DI_CHECK(n64 <= limits.max_states, "multipleOf ", m.to_string(), " needs too many automaton states");
    int32_t n = static_cast<int32_t>(n64);
    auto INT = [&](int64_t r) { return static_cast<int32_t>(2 + r); };
    auto DOT = [&](int64_t r) { return static_cast<int32_t>(2 + M + r); };
    auto TAIL = [&](int64_t r) { return static_cast<int32_t>(2 + 2 * M + r); };
    auto FRAC = [&](int64_t r, int32_t j) { return static_cast<int32_t>(2 + (2 + j) * M + r); };  // j in 1..d
    auto pow10mod = [&](int32_t e) {
        int64_t p = 1 % M;
        for (int32_t k = 0; k < e; ++k) p = p * 10 % M;
        return p;
    };
    auto out = std::make_shared<ByteDfa>();
    out->num_states = n;
    out->start = 0;
    out->accept.assign(n, 0);
    out->next.assign(static_cast<size_t>(n) * 256, -1);
    auto set = [&](int32_t from, int c, int32_t to) { out->next[static_cast<size_t>(from) * 256 + c] = to; };
    set(0, '-', 1);
    for (int c = '0'; c <= '9'; ++c) {
        set(0, c, INT((c - '0') % M));
        set(1, c, INT((c - '0') % M));
    }
    for (int64_t r = 0; r < M; ++r) {
        out->accept[INT(r)] = (r * pow10mod(d)) % M == 0;
        out->accept[TAIL(r)] = r == 0;
        for (int c = '0'; c <= '9'; ++c) set(INT(r), c, INT((10 * r + c - '0') % M));
        set(INT(r), '.', DOT(r));
        set(TAIL(r), '0', TAIL(r));
        if (d == 0) {
            set(DOT(r), '0', TAIL(r));
        } else {
            for (int c = '0'; c <= '9'; ++c) set(DOT(r), c, FRAC((10 * r + c - '0') % M, 1));
        }
        for (int32_t j = 1; j <= d; ++j) {
            out->accept[FRAC(r, j)] = (r * pow10mod(d - j)) % M == 0;
            if (j < d) {
                for (int c = '0'; c <= '9'; ++c) set(FRAC(r, j), c, FRAC((10 * r + c - '0') % M, j + 1));
            } else {
                set(FRAC(r, j), '0', TAIL(r));
            }
        }
    }
    return out;
}

std::string pad_id(const std::string& s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// JsonLexicon

JsonLexicon::JsonLexicon(Grammar& g, const CompileOptions& options, const BuildLimits& limits,
                         std::vector<std::string>& warnings)
    : g_(g), options_(options), limits_(limits), warnings_(warnings) {}

int32_t JsonLexicon::ws() {
    if (ws_ < 0) {
        if (options_.compact_json || options_.max_whitespace == 0) {
            ws_ = g_.empty();
        } else {
            ByteSet s;
            for (char c : {' ', '\t', '\n', '\r'}) s.set(static_cast<uint8_t>(c));
            ws_ = g_.repeat(g_.byteset(s), 0, options_.max_whitespace);
        }
    }
    return ws_;
}

int32_t JsonLexicon::json_char() {
    if (json_char_ < 0) {
        CharSet plain = CharSet::all().minus(CharSet::of(0, 0x1F));
        plain = plain.minus(CharSet::single('"')).minus(CharSet::single('\\'));
        CharSet hex = CharSet::of('0', '9');
        hex.add('a', 'f');
        hex.add('A', 'F');
        ByteSet esc;
        for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) esc.set(static_cast<uint8_t>(c));
        int32_t escape = g_.seq(
            {g_.bytes("\\"), g_.alt({g_.byteset(esc), g_.seq({g_.bytes("u"), g_.repeat(g_.chars(hex), 4, 4)})})});
        json_char_ = g_.alt({g_.chars(plain), escape});
    }
    return json_char_;
}

int32_t JsonLexicon::any_string() {
    if (string_rule_ < 0) {
        string_rule_ = g_.add_rule("string");
        g_.set_body(string_rule_, g_.seq({g_.bytes("\""), g_.star(json_char()), g_.bytes("\"")}));
        g_.set_separate(string_rule_);
    }
    return g_.ref(string_rule_);
}

int32_t JsonLexicon::exponent_opt() {
    CharSet e = CharSet::single('e');
    e.add('E', 'E');
    CharSet sign = CharSet::single('+');
    sign.add('-', '-');
    return g_.optional(g_.seq({g_.chars(e), g_.optional(g_.chars(sign)), g_.plus(Ranges(g_).any_digit())}));
}

int32_t JsonLexicon::any_number() {
    Ranges r(g_);
    const int32_t exponent = exponent_opt();
    return g_.seq({g_.optional(g_.bytes("-")), r.uint_any(), r.frac_opt(), exponent});
}

int32_t JsonLexicon::any_integer() {
    Ranges r(g_);
    return g_.seq({g_.optional(g_.bytes("-")), r.uint_any()});
}

int32_t JsonLexicon::any_value() {
    if (value_rule_ < 0) {
        value_rule_ = g_.add_rule("value");
        int32_t v = g_.ref(value_rule_);
        int32_t member = g_.seq({any_string(), ws(), g_.bytes(":"), ws(), v});
        // One whitespace run inside empty brackets, so that the bound holds there too.
        int32_t object = g_.seq(
            {g_.bytes("{"), ws(),
             g_.optional(g_.seq({member, g_.star(g_.seq({ws(), g_.bytes(","), ws(), member})), ws()})), g_.bytes("}")});
        int32_t array =
            g_.seq({g_.bytes("["), ws(),
                    g_.optional(g_.seq({v, g_.star(g_.seq({ws(), g_.bytes(","), ws(), v})), ws()})), g_.bytes("]")});
        g_.set_body(value_rule_, g_.alt({object, array, any_string(), any_number(), g_.bytes("true"), g_.bytes("false"),
                                         g_.bytes("null")}));
    }
    return g_.ref(value_rule_);
}

std::string JsonLexicon::encode_string(std::string_view utf8) {
    std::string out;
    append_json_string(out, utf8);
    return out;
}

int32_t JsonLexicon::string_literal(std::string_view utf8) { return g_.bytes(encode_string(utf8)); }

std::shared_ptr<const ByteDfa> JsonLexicon::any_content_dfa() {
    if (!any_content_) any_content_ = expr_to_dfa(g_, g_.star(json_char()), limits_);
    return any_content_;
}

int32_t JsonLexicon::format_expr(const std::string& format, const std::string& path) {
    // Regexes over the decoded string; compiled in JSON string context (escapes handled there).
    static const char* kDate =
        "(?:\\d{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|\\d{4}-(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|"
        "\\d{4}-02-(?:0[1-9]|1\\d|2[0-8])|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-"
        "02-29)";
    static const char* kTime =
        "(?:[01]\\d|2[0-3]):[0-5]\\d:(?:[0-5]\\d|60)(?:\\.\\d+)?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
    static const char* kUriChars = "(?:[A-Za-z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})";
    static const char* kIriChars = "(?:[A-Za-z0-9\\-._~:/?#\\[\\]@!$&'()*+,;=\\u00a0-\\u{10ffff}]|%[0-9A-Fa-f]{2})";
    static const char* kLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    static const char* kOctet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    std::string re;
    if (format == "date") {
        re = kDate;
    } else if (format == "time") {
        re = kTime;
    } else if (format == "date-time") {
        re = std::string(kDate) + "[Tt]" + kTime;
    } else if (format == "duration") {
        re = "P(?:(?:\\d+Y)?(?:\\d+M)?(?:\\d+D)?(?:T(?:\\d+H)?(?:\\d+M)?(?:\\d+(?:\\.\\d+)?S)?)?|\\d+W)";
    } else if (format == "uuid") {
        re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    } else if (format == "email" || format == "idn-email") {
        std::string local = format == "email" ? "[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+" : "[^\\s@\"(),:;<>\\[\\\\\\]]+";
        re = local + "@" + kLabel + "(?:\\." + kLabel + ")*";
    } else if (format == "hostname" || format == "idn-hostname") {
        re = std::string(kLabel) + "(?:\\." + kLabel + ")*";
    } else if (format == "ipv4") {
        re = std::string(kOctet) + "(?:\\." + kOctet + "){3}";
    } else if (format == "ipv6") {
        std::string h = "[0-9A-Fa-f]{1,4}";
        std::string v4 = std::string(kOctet) + "(?:\\." + kOctet + "){3}";
        re = "(?:(?:" + h + ":){7}" + h + "|(?:" + h + ":){1,7}:|(?:" + h + ":){1,6}:" + h + "|(?:" + h +
             ":){1,5}(?::" + h + "){1,2}|(?:" + h + ":){1,4}(?::" + h + "){1,3}|(?:" + h + ":){1,3}(?::" + h +
             "){1,4}|(?:" + h + ":){1,2}(?::" + h + "){1,5}|" + h + ":(?::" + h + "){1,6}|:(?:(?::" + h +
             "){1,7}|:)|(?:" + h + ":){6}" + v4 + "|::(?:" + h + ":){0,5}" + v4 + "|(?:" + h + ":){1,5}:" + v4 + ")";
    } else if (format == "uri" || format == "iri") {
        re = std::string("[A-Za-z][A-Za-z0-9+.-]*:") + (format == "uri" ? kUriChars : kIriChars) + "*";
    } else if (format == "uri-reference" || format == "iri-reference") {
        // An absolute URI, or a relative reference whose first path segment has no ':' (RFC 3986 4.2).
        std::string c = format == "uri-reference" ? kUriChars : kIriChars;
        std::string seg = format == "uri-reference"
                              ? "(?:[A-Za-z0-9\\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})"
                              : "(?:[A-Za-z0-9\\-._~!$&'()*+,;=@\\u00a0-\\u{10ffff}]|%[0-9A-Fa-f]{2})";
        re = "[A-Za-z][A-Za-z0-9+.-]*:" + c + "*|(?:/" + c + "*|" + seg + "+(?:/" + c + "*)?)?(?:[?#]" + c + "*)?";
    } else if (format == "json-pointer") {
        re = "(?:/(?:[^/~]|~[01])*)*";
    } else if (format == "relative-json-pointer") {
        re = "(?:0|[1-9]\\d*)(?:#|(?:/(?:[^/~]|~[01])*)*)";
    } else {
        warnings_.push_back("format '" + format + "' at " + path + " is not enforced");
        return -1;
    }
    return parse_regex(g_, re, RegexContext::kJsonString, false);
}

int32_t JsonLexicon::content_expr(const StringConstraints& c, const std::string& path) {
    std::vector<int32_t> parts;
    for (const auto& p : c.patterns) {
        try {
            parts.push_back(parse_regex(g_, p, RegexContext::kJsonString, true));
        } catch (const Error& e) {
            DI_THROW("pattern at ", path, ": ", e.what());
        }
    }
    for (const auto& f : c.formats) {
        int32_t e = format_expr(f, path);
        if (e >= 0) parts.push_back(e);
    }
    bool has_length = c.min_length > 0 || c.max_length >= 0;
    if (has_length) {
        DI_CHECK(c.max_length < 0 || c.max_length >= c.min_length, "maxLength < minLength at ", path);
        if (!parts.empty()) {
            // Length bounds next to a pattern: materialized (kept small); bounds the pattern implies
            // are dropped by the intersection below anyway.
            DI_CHECK(c.min_length <= 4096 && c.max_length <= 4096, "minLength/maxLength above 4096 combined with ",
                     "pattern or format at ", path, " is not supported");
        }
        DI_CHECK(c.min_length <= 100000 && c.max_length <= 100000, "minLength/maxLength above 100000 at ", path,
                 " is not supported here");
        parts.push_back(g_.repeat(json_char(), static_cast<int32_t>(c.min_length),
                                  c.max_length < 0 ? kUnbounded : static_cast<int32_t>(c.max_length)));
    }
    if (parts.empty()) return g_.star(json_char());
    if (parts.size() == 1) return parts[0];
    std::shared_ptr<const ByteDfa> acc = expr_to_dfa(g_, parts[0], limits_);
    for (size_t i = 1; i < parts.size(); ++i) acc = dfa_intersect(*acc, *expr_to_dfa(g_, parts[i], limits_), limits_);
    return g_.dfa(acc);
}

std::shared_ptr<const ByteDfa> JsonLexicon::string_content_dfa(const StringConstraints& c, const std::string& path) {
    if (c.unconstrained()) return any_content_dfa();
    return expr_to_dfa(g_, content_expr(c, path), limits_);
}

int32_t JsonLexicon::string(const StringConstraints& c, const std::string& path) {
    if (c.unconstrained()) return any_string();
    std::string key = std::to_string(c.min_length) + "," + std::to_string(c.max_length);
    for (const auto& p : c.patterns) key += "|p:" + p;
    for (const auto& f : c.formats) key += "|f:" + f;
    auto it = string_rules_.find(key);
    if (it != string_rules_.end()) return it->second < 0 ? g_.nothing() : g_.ref(it->second);
    // Length bounds beyond a few characters: a counted string (states computed, masks shared).
    bool has_length = c.min_length > 0 || c.max_length >= 0;
    if (has_length && (c.max_length > 16 || (c.max_length < 0 && c.min_length > 16))) {
        StringConstraints inner = c;
        inner.min_length = 0;
        inner.max_length = -1;
        std::shared_ptr<const ByteDfa> content =
            inner.unconstrained() ? any_content_dfa() : string_content_dfa(inner, path);
        if (content->num_states == 0) {
            string_rules_[key] = -1;
            return g_.nothing();
        }
        auto counted = make_counted_string(*content, *any_content_dfa(), c.min_length, c.max_length, limits_);
        if (counted) {
            const auto& cs = *counted;
            bool satisfiable =
                cs.can_finish(cs.content.start, cs.min_length, cs.max_length < 0 ? int64_t{1} << 40 : cs.max_length);
            if (!satisfiable) {
                string_rules_[key] = -1;
                return g_.nothing();
            }
            int32_t rule =
                g_.add_rule("string_len" + std::to_string(c.min_length) + "_" + std::to_string(c.max_length) +
                            (inner.unconstrained() ? "" : "_" + std::to_string(string_rules_.size())));
            g_.set_counted(rule, counted);
            string_rules_[key] = rule;
            return g_.ref(rule);
        }
    }
    int32_t content = content_expr(c, path);
    if (g_.is_nothing(content)) {
        string_rules_[key] = -1;
        return g_.nothing();
    }
    std::string name = "string";
    if (!c.formats.empty()) name += "_" + pad_id(c.formats[0]);
    if (c.min_length > 0 || c.max_length >= 0)
        name += "_len" + std::to_string(c.min_length) + "_" + std::to_string(c.max_length);
    if (!c.patterns.empty()) name += "_pattern" + std::to_string(string_rules_.size());
    int32_t rule = g_.add_rule(name);
    g_.set_body(rule, g_.seq({g_.bytes("\""), content, g_.bytes("\"")}));
    g_.set_separate(rule);
    string_rules_[key] = rule;
    return g_.ref(rule);
}

// ---------------------------------------------------------------------------------------------
// Numbers

int32_t JsonLexicon::integer_range(const NumberConstraints& c) {
    Ranges r(g_);
    // Integer bounds: lo = ceil(min) (+1 when exclusive and integral), hi = floor(max) (-1 likewise).
    bool has_lo = c.has_min, has_hi = c.has_max;
    SInt lo, hi;
    if (has_lo) {
        const Decimal& a = c.min;
        lo = {a.negative, a.int_digits};
        if (a.is_integer()) {
            if (c.min_exclusive) lo = sint_inc(lo);
        } else if (!a.negative) {
            lo = sint_inc(lo);
        } else if (lo.digits == "0") {
            lo.neg = false;
        }
    }
    if (has_hi) {
        const Decimal& b = c.max;
        hi = {b.negative, b.int_digits};
        if (b.is_integer()) {
            if (c.max_exclusive) hi = sint_dec(hi);
        } else if (b.negative) {
            hi = sint_dec(hi);
        } else {
            hi.neg = false;
        }
    }
    auto sint_le = [](const SInt& x, const SInt& y) {  // x <= y
        if (x.neg != y.neg) return x.neg;
        int c = uint_cmp(x.digits, y.digits);
        return x.neg ? c >= 0 : c <= 0;
    };
    if (has_lo && has_hi && !sint_le(lo, hi)) return g_.nothing();
    std::vector<int32_t> alts;
    auto both = [&](int32_t a, int32_t b) {
        if (a < 0) return b;
        if (b < 0) return a;
        return g_.dfa(dfa_intersect(*expr_to_dfa(g_, a, limits_), *expr_to_dfa(g_, b, limits_), limits_));
    };
    // Non-negative part: [max(lo, 0), hi].
    bool nonneg = !has_hi || !hi.neg;
    if (nonneg) {
        int32_t ge = (has_lo && !lo.neg) ? r.uint_ge(lo.digits) : -1;
        int32_t le = has_hi ? r.uint_le(hi.digits) : -1;
        int32_t part = both(ge, le);
        alts.push_back(part < 0 ? r.uint_any() : part);
    }
    // Negative part: magnitudes in [max(-hi, 1), -lo].
    bool neg = !has_lo || lo.neg;
    if (neg) {
        std::string mlo = (has_hi && hi.neg) ? hi.digits : "1";
        int32_t ge = r.uint_ge(mlo);
        int32_t le = has_lo ? r.uint_le(lo.digits) : -1;
        alts.push_back(g_.seq({g_.bytes("-"), both(ge, le)}));
    }
    // -0 is 0.
    bool zero_in = (!has_lo || lo.neg || lo.digits == "0") && (!has_hi || !hi.neg);
    if (zero_in) alts.push_back(g_.bytes("-0"));
    return g_.alt(alts);
}

int32_t JsonLexicon::decimal_range(const NumberConstraints& c) {
    Ranges r(g_);
    int32_t lower = -1, upper = -1;
    if (c.has_min) {
        const Decimal& a = c.min;
        if (!a.negative) {
            int32_t neg = (a.is_zero() && !c.min_exclusive)
                              ? g_.seq({g_.bytes("-0"), g_.optional(g_.seq({g_.bytes("."), g_.plus(g_.bytes("0"))}))})
                              : g_.nothing();
            lower = g_.alt({r.mag_ge(a.int_digits, a.frac_digits, c.min_exclusive), neg});
        } else {
            lower = g_.alt(
                {r.any_magnitude(), g_.seq({g_.bytes("-"), r.mag_le(a.int_digits, a.frac_digits, c.min_exclusive)})});
        }
    }
    if (c.has_max) {
        const Decimal& b = c.max;
        if (!b.negative) {
            int32_t neg = (b.is_zero() && c.max_exclusive) ? g_.seq({g_.bytes("-"), r.mag_ge("0", "", true)})
                                                           : g_.seq({g_.bytes("-"), r.any_magnitude()});
            upper = g_.alt({r.mag_le(b.int_digits, b.frac_digits, c.max_exclusive), neg});
        } else {
            upper = g_.seq({g_.bytes("-"), r.mag_ge(b.int_digits, b.frac_digits, c.max_exclusive)});
        }
    }
    int32_t canonical = g_.seq({g_.optional(g_.bytes("-")), r.any_magnitude()});
    std::shared_ptr<const ByteDfa> acc = expr_to_dfa(g_, canonical, limits_);
    if (lower >= 0) acc = dfa_intersect(*acc, *expr_to_dfa(g_, lower, limits_), limits_);
    if (upper >= 0) acc = dfa_intersect(*acc, *expr_to_dfa(g_, upper, limits_), limits_);
    return g_.dfa(acc);
}

int32_t JsonLexicon::number(const NumberConstraints& c, const std::string& path) {
    bool bounded = c.has_min || c.has_max;
    if (c.has_multiple) {
        DI_CHECK(!c.multiple_of.negative && !c.multiple_of.is_zero(), "multipleOf must be positive at ", path);
        int32_t base = c.integer ? (bounded ? integer_range(c) : any_integer()) : (bounded ? decimal_range(c) : -1);
        if (base < 0) {
            Ranges r(g_);
            base = g_.seq({g_.optional(g_.bytes("-")), r.any_magnitude()});
            warnings_.push_back("number with multipleOf at " + path + ": exponent notation is not allowed");
        }
        auto dfa = dfa_intersect(*expr_to_dfa(g_, base, limits_), *multiple_of_dfa(c.multiple_of, limits_), limits_);
        return g_.dfa(dfa);
    }
    if (c.integer) return bounded ? integer_range(c) : any_integer();
    if (!bounded) return any_number();
    // Bounds at zero keep exponent notation (the sign decides); other bounds use plain decimals.
    Ranges r(g_);
    const int32_t exponent = exponent_opt();
    int32_t zero_mant = g_.seq({g_.bytes("0"), g_.optional(g_.seq({g_.bytes("."), g_.plus(g_.bytes("0"))}))});
    int32_t nonzero_mant =
        g_.alt({g_.seq({r.digits('1', '9'), g_.star(r.any_digit()), r.frac_opt()}),
                g_.seq({g_.bytes("0."), g_.star(r.any_digit()), r.digits('1', '9'), g_.star(r.any_digit())})});
    int32_t any_mant = r.any_magnitude();
    if (c.has_min && !c.has_max && c.min.is_zero()) {
        if (c.min_exclusive) return g_.seq({nonzero_mant, exponent});
        return g_.alt({g_.seq({any_mant, exponent}), g_.seq({g_.bytes("-"), zero_mant, exponent})});
    }
    if (c.has_max && !c.has_min && c.max.is_zero()) {
        if (c.max_exclusive) return g_.seq({g_.bytes("-"), nonzero_mant, exponent});
        return g_.alt({g_.seq({g_.bytes("-"), any_mant, exponent}), g_.seq({zero_mant, exponent})});
    }
    warnings_.push_back("number with bounds at " + path + ": exponent notation is not allowed");
    return decimal_range(c);
}

// ---------------------------------------------------------------------------------------------

Lowered lower_json_object(const CompileOptions& options) {
    Lowered out;
    BuildLimits limits;
    limits.max_states = options.max_states;
    std::vector<std::string> warnings;
    JsonLexicon lex(out.grammar, options, limits, warnings);
    int32_t root = out.grammar.add_rule("root");
    // An object at the top level; any JSON values inside.
    int32_t value = lex.any_value();
    int32_t member = out.grammar.seq({lex.any_string(), lex.ws(), out.grammar.bytes(":"), lex.ws(), value});
    Grammar& g = out.grammar;
    g.set_body(root,
               g.seq({g.bytes("{"), lex.ws(),
                      g.optional(g.seq({member, g.star(g.seq({lex.ws(), g.bytes(","), lex.ws(), member})), lex.ws()})),
                      g.bytes("}")}));
    g.set_root(root);
    return out;
}

}  // namespace deepinfer::grammar
