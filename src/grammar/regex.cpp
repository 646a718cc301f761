// ECMAScript-style regular expressions -> grammar IR.
#include <utf8proc.h>

#include <cctype>
#include <mutex>

#include "deepinfer/error.h"
#include "grammar/frontend.h"

namespace deepinfer::grammar {
namespace {

constexpr int32_t kMaxRepeat = 100000;

// Unicode general categories (utf8proc numbering), built once.
const std::vector<CharSet>& category_sets() {
    static std::vector<CharSet> sets;
    static std::once_flag once;
    std::call_once(once, [] {
        sets.assign(30, CharSet{});
        std::vector<std::vector<CharSet::Range>> runs(30);
        int prev = -1;
        uint32_t run_start = 0;
        for (uint32_t c = 0; c <= kMaxCodePoint + 1; ++c) {
            int cat = c <= kMaxCodePoint ? static_cast<int>(utf8proc_category(static_cast<utf8proc_int32_t>(c))) : -2;
            if (cat != prev) {
                if (prev >= 0 && prev < 30) runs[prev].push_back({run_start, c - 1});
                prev = cat;
                run_start = c;
            }
        }
        for (int k = 0; k < 30; ++k) {
            for (const auto& r : runs[k]) sets[k].add(r.lo, r.hi);
        }
    });
    return sets;
}

CharSet category(std::initializer_list<int> cats) {
    CharSet s;
    for (int c : cats) s.add(category_sets()[c]);
    return s;
}

// \p{...} names: one- and two-letter general categories and their long names.
bool unicode_property(std::string_view name, CharSet& out) {
    struct Entry {
        const char* short_name;
        const char* long_name;
        std::initializer_list<int> cats;
    };
    static const Entry kEntries[] = {
        {"L", "Letter", {1, 2, 3, 4, 5}},
        {"Lu", "Uppercase_Letter", {1}},
        {"Ll", "Lowercase_Letter", {2}},
        {"Lt", "Titlecase_Letter", {3}},
        {"LC", "Cased_Letter", {1, 2, 3}},
        {"Lm", "Modifier_Letter", {4}},
        {"Lo", "Other_Letter", {5}},
        {"M", "Mark", {6, 7, 8}},
        {"Mn", "Nonspacing_Mark", {6}},
        {"Mc", "Spacing_Mark", {7}},
        {"Me", "Enclosing_Mark", {8}},
        {"N", "Number", {9, 10, 11}},
        {"Nd", "Decimal_Number", {9}},
        {"Nl", "Letter_Number", {10}},
        {"No", "Other_Number", {11}},
        {"P", "Punctuation", {12, 13, 14, 15, 16, 17, 18}},
        {"Pc", "Connector_Punctuation", {12}},
        {"Pd", "Dash_Punctuation", {13}},
        {"Ps", "Open_Punctuation", {14}},
        {"Pe", "Close_Punctuation", {15}},
        {"Pi", "Initial_Punctuation", {16}},
        {"Pf", "Final_Punctuation", {17}},
        {"Po", "Other_Punctuation", {18}},
        {"S", "Symbol", {19, 20, 21, 22}},
        {"Sm", "Math_Symbol", {19}},
        {"Sc", "Currency_Symbol", {20}},
        {"Sk", "Modifier_Symbol", {21}},
        {"So", "Other_Symbol", {22}},
        {"Z", "Separator", {23, 24, 25}},
        {"Zs", "Space_Separator", {23}},
        {"Zl", "Line_Separator", {24}},
        {"Zp", "Paragraph_Separator", {25}},
        {"C", "Other", {0, 26, 27, 29}},
        {"Cc", "Control", {26}},
        {"Cf", "Format", {27}},
        {"Co", "Private_Use", {29}},
        {"Cn", "Unassigned", {0}},
    };
    if (name.substr(0, 3) == "gc=") name.remove_prefix(3);
    if (name.substr(0, 17) == "General_Category=") name.remove_prefix(17);
    for (const Entry& e : kEntries) {
        if (name == e.short_name || name == e.long_name) {
            out = category(e.cats);
            return true;
        }
    }
    if (name == "Any") {
        out = CharSet::all();
        return true;
    }
    if (name == "ASCII") {
        out = CharSet::of(0, 0x7F);
        return true;
    }
    return false;
}

CharSet digit_set() { return CharSet::of('0', '9'); }
CharSet word_set() {
    CharSet s = CharSet::of('a', 'z');
    s.add('A', 'Z');
    s.add('0', '9');
    s.add('_', '_');
    return s;
}
// ECMAScript \s: WhiteSpace and LineTerminator.
CharSet space_set() {
    CharSet s = CharSet::of('\t', '\r');  // \t \n \v \f \r
    s.add(' ', ' ');
    for (uint32_t c : {0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) s.add(c, c);
    s.add(0x2000, 0x200A);
    return s;
}

class RegexParser {
public:
    RegexParser(Grammar& g, std::string_view p, RegexContext ctx) : g_(g), p_(p), ctx_(ctx) {}

    int32_t parse_top(bool search) {
        std::vector<int32_t> alts;
        for (;;) {
            bool anchor_start = false, anchor_end = false;
            while (pos_ < p_.size() && p_[pos_] == '^') {
                anchor_start = true;
                ++pos_;
            }
            int32_t body = parse_seq(0, &anchor_end);
            if (search) {
                int32_t any = g_.star(emit(CharSet::all()));
                body = g_.seq({anchor_start ? g_.empty() : any, body, anchor_end ? g_.empty() : any});
            }
            alts.push_back(body);
            if (pos_ < p_.size() && p_[pos_] == '|') {
                ++pos_;
                continue;
            }
            break;
        }
        if (pos_ < p_.size()) fail(pos_, "unmatched ')'");
        return g_.alt(alts);
    }

private:
    [[noreturn]] void fail(size_t at, const std::string& why) {
        DI_THROW("regex error at offset ", at, ": ", why, " in /", std::string(p_), "/");
    }

    int32_t emit(const CharSet& s) { return ctx_ == RegexContext::kText ? g_.chars(s) : json_string_chars(g_, s); }

    bool at_end() const { return pos_ >= p_.size(); }

    uint32_t next_code_point() {
        unsigned char c = static_cast<unsigned char>(p_[pos_]);
        if (c < 0x80) {
            ++pos_;
            return c;
        }
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(p_.data() + pos_),
                                              static_cast<utf8proc_ssize_t>(p_.size() - pos_), &cp);
        if (n <= 0) fail(pos_, "invalid UTF-8");
        pos_ += static_cast<size_t>(n);
        return static_cast<uint32_t>(cp);
    }

    int32_t parse_alt(int depth) {
        std::vector<int32_t> alts;
        for (;;) {
            alts.push_back(parse_seq(depth, nullptr));
            if (!at_end() && p_[pos_] == '|') {
                ++pos_;
                continue;
            }
            return g_.alt(alts);
        }
    }

    // Stops at '|', ')' or the end. At depth 0, a '$' just before those ends the alternative.
    int32_t parse_seq(int depth, bool* anchor_end) {
        std::vector<int32_t> items;
        while (!at_end() && p_[pos_] != '|' && p_[pos_] != ')') {
            char c = p_[pos_];
            if (c == '$') {
                size_t at = pos_;
                ++pos_;
                while (!at_end() && p_[pos_] == '$') ++pos_;
                bool last = at_end() || p_[pos_] == '|' || (p_[pos_] == ')' && depth > 0);
                if (depth == 0 && last && anchor_end) {
                    *anchor_end = true;
                    break;
                }
                fail(at, "'$' is only supported at the end of the pattern");
            }
            if (c == '^') fail(pos_, "'^' is only supported at the start of the pattern");
            size_t atom_pos = pos_;
            int32_t atom = parse_atom(depth);
            items.push_back(parse_quantifiers(atom, atom_pos));
        }
        return g_.seq(items);
    }

    int32_t parse_quantifiers(int32_t atom, size_t atom_pos) {
        for (;;) {
            if (at_end()) return atom;
            char c = p_[pos_];
            int32_t min = 0, max = 0;
            if (c == '*') {
                min = 0, max = kUnbounded;
                ++pos_;
            } else if (c == '+') {
                min = 1, max = kUnbounded;
                ++pos_;
            } else if (c == '?') {
                min = 0, max = 1;
                ++pos_;
            } else if (c == '{' && parse_braces(min, max)) {
                // parsed
            } else {
                return atom;
            }
            if (!at_end() && p_[pos_] == '?') ++pos_;  // lazy: same language
            if (!at_end() && p_[pos_] == '+') fail(pos_, "possessive quantifiers are not supported");
            atom = g_.repeat(atom, min, max);
            if (!at_end()) {
                int32_t a, b;
                size_t save = pos_;
                char n = p_[pos_];
                if (n == '*' || n == '+' || n == '?' || (n == '{' && parse_braces(a, b))) {
                    fail(save,
                         "nothing to repeat (quantifier after quantifier at offset " + std::to_string(atom_pos) + ")");
                }
            }
            return atom;
        }
    }

    // {n}, {n,}, {n,m}; anything else leaves '{' as a literal (ECMAScript Annex B).
    bool parse_braces(int32_t& min, int32_t& max) {
        size_t i = pos_ + 1;
        auto number = [&](int64_t& v) {
            size_t start = i;
            v = 0;
            while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
                v = std::min<int64_t>(v * 10 + (p_[i] - '0'), int64_t{1} << 40);
                ++i;
            }
            return i > start;
        };
        int64_t lo = 0, hi = 0;
        if (!number(lo)) return false;
        if (i < p_.size() && p_[i] == '}') {
            hi = lo;
        } else if (i < p_.size() && p_[i] == ',') {
            ++i;
            if (i < p_.size() && p_[i] == '}') {
                hi = -1;
            } else if (!number(hi) || i >= p_.size() || p_[i] != '}') {
                return false;
            }
        } else {
            return false;
        }
        if (lo > kMaxRepeat || hi > kMaxRepeat) fail(pos_, "repetition count above " + std::to_string(kMaxRepeat));
        if (hi >= 0 && hi < lo) fail(pos_, "repetition range {n,m} with m < n");
        min = static_cast<int32_t>(lo);
        max = hi < 0 ? kUnbounded : static_cast<int32_t>(hi);
        pos_ = i + 1;
        return true;
    }

    int32_t parse_atom(int depth) {
        size_t at = pos_;
        char c = p_[pos_];
        switch (c) {
            case '(': {
                ++pos_;
                if (!at_end() && p_[pos_] == '?') {
                    ++pos_;
                    if (at_end()) fail(at, "unterminated group");
                    char k = p_[pos_];
                    if (k == ':') {
                        ++pos_;
                    } else if (k == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
                        size_t close = p_.find('>', pos_);
                        if (close == std::string_view::npos) fail(at, "unterminated group name");
                        pos_ = close + 1;
                    } else if (k == 'P' && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
                        size_t close = p_.find('>', pos_);
                        if (close == std::string_view::npos) fail(at, "unterminated group name");
                        pos_ = close + 1;
                    } else if (k == '=' || k == '!' || k == '<') {
                        fail(at, "lookaround assertions are not supported");
                    } else {
                        fail(at, "unsupported group syntax '(?" + std::string(1, k) + "'");
                    }
                }
                int32_t inner = parse_alt(depth + 1);
                if (at_end() || p_[pos_] != ')') fail(at, "unterminated group '('");
                ++pos_;
                return inner;
            }
            case ')':
                fail(at, "unmatched ')'");
            case '[':
                return emit(parse_class());
            case '.':
                ++pos_;
                return emit(CharSet::all().minus(CharSet::single('\n')));
            case '*':
            case '+':
            case '?':
                fail(at, "nothing to repeat");
            case '{': {
                int32_t mn, mx;
                size_t save = pos_;
                if (parse_braces(mn, mx)) fail(save, "nothing to repeat");
                ++pos_;
                return emit(CharSet::single('{'));
            }
            case '\\': {
                ++pos_;
                CharSet set;
                parse_escape(false, set);
                return emit(set);
            }
            default:
                return emit(CharSet::single(next_code_point()));
        }
    }

    // After a backslash. Fills `out` with the escaped character or class.
    void parse_escape(bool in_class, CharSet& out) {
        size_t at = pos_ - 1;
        if (at_end()) fail(at, "trailing backslash");
        char c = p_[pos_++];
        auto hex_value = [&](size_t n) -> uint32_t {
            if (pos_ + n > p_.size()) fail(at, "incomplete hex escape");
            uint32_t v = 0;
            for (size_t i = 0; i < n; ++i) {
                char h = p_[pos_ + i];
                int d = (h >= '0' && h <= '9')   ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
                if (d < 0) fail(at, "bad hex digit in escape");
                v = v * 16 + static_cast<uint32_t>(d);
            }
            pos_ += n;
            return v;
        };
        switch (c) {
            case 'd':
                out = digit_set();
                return;
            case 'D':
                out = digit_set().complement();
                return;
            case 'w':
                out = word_set();
                return;
            case 'W':
                out = word_set().complement();
                return;
            case 's':
                out = space_set();
                return;
            case 'S':
                out = space_set().complement();
                return;
            case 'n':
                out = CharSet::single('\n');
                return;
            case 'r':
                out = CharSet::single('\r');
                return;
            case 't':
                out = CharSet::single('\t');
                return;
            case 'v':
                out = CharSet::single('\v');
                return;
            case 'f':
                out = CharSet::single('\f');
                return;
            case '0':
                if (!at_end() && p_[pos_] >= '0' && p_[pos_] <= '9') fail(at, "octal escapes are not supported");
                out = CharSet::single(0);
                return;
            case 'b':
                if (in_class) {
                    out = CharSet::single('\b');
                    return;
                }
                fail(at, "word boundary \\b is not supported");
            case 'B':
                fail(at, "word boundary \\B is not supported");
            case 'x':
                out = CharSet::single(hex_value(2));
                return;
            case 'u': {
                uint32_t v;
                if (!at_end() && p_[pos_] == '{') {
                    size_t close = p_.find('}', pos_);
                    if (close == std::string_view::npos || close == pos_ + 1 || close - pos_ - 1 > 6) {
                        fail(at, "bad \\u{...} escape");
                    }
                    ++pos_;
                    v = hex_value(close - pos_);
                    ++pos_;
                } else {
                    v = hex_value(4);
                    // A surrogate pair written as two escapes.
                    if (v >= 0xD800 && v <= 0xDBFF && pos_ + 6 <= p_.size() && p_[pos_] == '\\' &&
                        p_[pos_ + 1] == 'u') {
                        pos_ += 2;
                        uint32_t lo = hex_value(4);
                        if (lo < 0xDC00 || lo > 0xDFFF) fail(at, "unpaired surrogate escape");
                        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                    }
                }
                if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail(at, "escape is not a Unicode scalar value");
                out = CharSet::single(v);
                return;
            }
            case 'c': {
                if (at_end() || !std::isalpha(static_cast<unsigned char>(p_[pos_]))) fail(at, "bad \\c escape");
                out = CharSet::single(static_cast<uint32_t>(p_[pos_++]) % 32);
                return;
            }
            case 'p':
            case 'P': {
                if (at_end() || p_[pos_] != '{') fail(at, "\\p needs {Property}");
                size_t close = p_.find('}', pos_);
                if (close == std::string_view::npos) fail(at, "unterminated \\p{...}");
                std::string_view name = p_.substr(pos_ + 1, close - pos_ - 1);
                if (!unicode_property(name, out)) {
                    fail(at, "unsupported Unicode property \\p{" + std::string(name) + "}");
                }
                if (c == 'P') out = out.complement();
                pos_ = close + 1;
                return;
            }
            case 'k':
                fail(at, "backreferences are not supported");
            default:
                break;
        }
        if (c >= '1' && c <= '9') fail(at, "backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) fail(at, std::string("unsupported escape \\") + c);
        --pos_;
        out = CharSet::single(next_code_point());  // identity escape of punctuation (or any non-ASCII)
    }

    CharSet parse_class() {
        size_t at = pos_;
        ++pos_;  // '['
        bool negate = false;
        if (!at_end() && p_[pos_] == '^') {
            negate = true;
            ++pos_;
        }
        CharSet set;
        bool first = true;
        for (;;) {
            if (at_end()) fail(at, "unterminated character class '['");
            if (p_[pos_] == ']' && !first) {
                ++pos_;
                break;
            }
            if (p_[pos_] == ']' && first) {
                // ECMAScript: [] matches nothing, [^] matches anything.
                ++pos_;
                break;
            }
            first = false;
            CharSet lo_set;
            bool lo_single = class_atom(lo_set);
            if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
                size_t dash = pos_;
                ++pos_;
                CharSet hi_set;
                bool hi_single = class_atom(hi_set);
                if (!lo_single || !hi_single) fail(dash, "class escape used as a range bound");
                uint32_t lo = lo_set.ranges()[0].lo, hi = hi_set.ranges()[0].lo;
                if (lo > hi) fail(dash, "character class range out of order");
                set.add(lo, hi);
            } else {
                set.add(lo_set);
            }
        }
        return negate ? set.complement() : set;
    }

    // One class member; returns true when it is a single character.
    bool class_atom(CharSet& out) {
        if (p_[pos_] == '\\') {
            ++pos_;
            parse_escape(true, out);
        } else {
            uint32_t cp = next_code_point();
            if (cp >= 0xD800 && cp <= 0xDFFF) fail(pos_, "surrogate in class");
            out = CharSet::single(cp);
        }
        return out.ranges().size() == 1 && out.ranges()[0].lo == out.ranges()[0].hi;
    }

    Grammar& g_;
    std::string_view p_;
    RegexContext ctx_;
    size_t pos_ = 0;
};

}  // namespace

int32_t json_string_chars(Grammar& g, const CharSet& set) {
    CharSet specials = CharSet::of(0, 0x1F);
    specials.add('"', '"');
    specials.add('\\', '\\');
    std::vector<int32_t> alts{g.chars(set.minus(specials))};
    if (set.contains('"')) alts.push_back(g.bytes("\\\""));
    if (set.contains('\\')) alts.push_back(g.bytes("\\\\"));
    if (set.contains('/')) alts.push_back(g.bytes("\\/"));
    static const std::pair<uint32_t, const char*> kShort[] = {
        {'\b', "\\b"}, {'\f', "\\f"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}};
    for (const auto& [c, esc] : kShort) {
        if (set.contains(c)) alts.push_back(g.bytes(esc));
    }
    CharSet controls = set.intersect(CharSet::of(0, 0x1F));
    if (!controls.empty()) {
        CharSet hex = CharSet::of('0', '9');
        hex.add('a', 'f');
        hex.add('A', 'F');
        if (controls == CharSet::of(0, 0x1F)) {
            alts.push_back(g.seq({g.bytes("\\u00"), g.chars(CharSet::of('0', '1')), g.chars(hex)}));
        } else {
            for (const auto& r : controls.ranges()) {
                for (uint32_t c = r.lo; c <= r.hi; ++c) {
                    const char* digits = "0123456789abcdef";
                    CharSet lo = CharSet::single(static_cast<uint8_t>(digits[c & 15]));
                    if ((c & 15) >= 10)
                        lo.add(static_cast<uint8_t>(digits[c & 15] - 32), static_cast<uint8_t>(digits[c & 15] - 32));
                    alts.push_back(g.seq({g.bytes(std::string("\\u00") + digits[c >> 4]), g.chars(lo)}));
                }
            }
        }
    }
    return g.alt(alts);
}

int32_t parse_regex(Grammar& g, std::string_view pattern, RegexContext context, bool search) {
    RegexParser parser(g, pattern, context);
    return parser.parse_top(search);
}

Lowered lower_regex(std::string_view pattern) {
    Lowered out;
    Grammar& g = out.grammar;
    int32_t root = g.add_rule("root");
    g.set_body(root, parse_regex(g, pattern, RegexContext::kText, false));
    g.set_root(root);
    return out;
}

}  // namespace deepinfer::grammar
