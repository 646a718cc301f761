// GBNF-style EBNF -> grammar IR.
//
//   root  ::= greeting ", " name ("!" | "?")*   # comments run to the end of the line
//   greeting ::= "hello" | 'hi'
//   name  ::= [A-Z] [a-z]{1,15} | /[0-9]+/       # character classes, repetition, regex literals
//
// A rule's body runs until the next `name ::=` or the end of the text, so bodies may span lines.
// `.` is any character (newline included). The start rule is `root`.
#include <utf8proc.h>

#include <cctype>
#include <map>

#include "deepinfer/error.h"
#include "grammar/frontend.h"

namespace deepinfer::grammar {
namespace {

constexpr int32_t kMaxRepeat = 100000;

class EbnfParser {
public:
    EbnfParser(std::string_view text, Grammar& g) : s_(text), g_(g) {}

    void parse() {
        skip_space();
        while (!at_end()) {
            size_t at = pos_;
            std::string name = parse_name();
            if (name.empty()) fail(at, "expected a rule name");
            skip_space();
            if (s_.compare(pos_, 3, "::=") != 0) fail(pos_, "expected '::=' after rule name '" + name + "'");
            pos_ += 3;
            int32_t rule = rule_id(name, at);
            if (defined_.count(name)) fail(at, "rule '" + name + "' is defined twice");
            defined_[name] = at;
            g_.set_body(rule, parse_alternatives(0));
            skip_space();
            if (!at_end() && !at_rule_start()) fail(pos_, std::string("unexpected character '") + s_[pos_] + "'");
        }
        for (const auto& [name, at] : used_) {
            if (!defined_.count(name)) fail(at, "rule '" + name + "' is used but never defined");
        }
        int32_t root = g_.find_rule("root");
        if (root < 0 || !defined_.count("root")) fail(0, "the grammar has no rule named 'root'");
        g_.set_root(root);
    }

private:
    [[noreturn]] void fail(size_t at, const std::string& why) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        DI_THROW("ebnf error at line ", line, ", column ", col, ": ", why);
    }

    bool at_end() const { return pos_ >= s_.size(); }

    void skip_space() {
        while (!at_end()) {
            char c = s_[pos_];
            if (c == '#') {
                while (!at_end() && s_[pos_] != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                ++pos_;
            } else {
                break;
            }
        }
    }

    static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

    std::string parse_name() {
        size_t start = pos_;
        while (!at_end() && name_char(s_[pos_])) ++pos_;
        return std::string(s_.substr(start, pos_ - start));
    }

    // Is the text at pos_ the start of a new rule (`name ::=`)?
    bool at_rule_start() const {
        size_t i = pos_;
        while (i < s_.size() && name_char(s_[i])) ++i;
        if (i == pos_) return false;
        while (i < s_.size() && (s_[i] == ' ' || s_[i] == '\t' || s_[i] == '\n' || s_[i] == '\r')) ++i;
        return s_.compare(i, 3, "::=") == 0;
    }

    int32_t rule_id(const std::string& name, size_t at) {
        auto it = ids_.find(name);
        if (it != ids_.end()) return it->second;
        int32_t id = g_.add_rule(name);
        ids_[name] = id;
        if (!used_.count(name)) used_[name] = at;
        return id;
    }

    int32_t parse_alternatives(int depth) {
        std::vector<int32_t> alts{parse_sequence(depth)};
        for (;;) {
            skip_space();
            if (!at_end() && s_[pos_] == '|') {
                ++pos_;
                alts.push_back(parse_sequence(depth));
                continue;
            }
            return g_.alt(alts);
        }
    }

    int32_t parse_sequence(int depth) {
        std::vector<int32_t> items;
        for (;;) {
            skip_space();
            if (at_end()) break;
            char c = s_[pos_];
            if (c == '|' || c == ')') break;
            if (depth == 0 && at_rule_start()) break;
            items.push_back(parse_quantified(depth));
        }
        return g_.seq(items);
    }

    int32_t parse_quantified(int depth) {
        int32_t item = parse_item(depth);
        for (;;) {
            if (at_end()) return item;
            char c = s_[pos_];
            if (c == '*') {
                ++pos_;
                item = g_.star(item);
            } else if (c == '+') {
                ++pos_;
                item = g_.plus(item);
            } else if (c == '?') {
                ++pos_;
                item = g_.optional(item);
            } else if (c == '{') {
                size_t at = pos_;
                ++pos_;
                skip_space();
                int64_t lo = parse_int(at), hi = lo;
                skip_space();
                if (!at_end() && s_[pos_] == ',') {
                    ++pos_;
                    skip_space();
                    hi = (!at_end() && s_[pos_] == '}') ? -1 : parse_int(at);
                    skip_space();
                }
                if (at_end() || s_[pos_] != '}') fail(at, "expected '}' to close the repetition");
                ++pos_;
                if (lo > kMaxRepeat || hi > kMaxRepeat)
                    fail(at, "repetition count above " + std::to_string(kMaxRepeat));
                if (hi >= 0 && hi < lo) fail(at, "repetition {m,n} with n < m");
                item = g_.repeat(item, static_cast<int32_t>(lo), hi < 0 ? kUnbounded : static_cast<int32_t>(hi));
            } else {
                return item;
            }
        }
    }

    int64_t parse_int(size_t at) {
        size_t start = pos_;
        int64_t v = 0;
        while (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
            v = std::min<int64_t>(v * 10 + (s_[pos_] - '0'), int64_t{1} << 40);
            ++pos_;
        }
        if (pos_ == start) fail(at, "expected a number in the repetition");
        return v;
    }

    int32_t parse_item(int depth) {
        size_t at = pos_;
        char c = s_[pos_];
        if (c == '"' || c == '\'') {
            ++pos_;
            std::string bytes;
            for (;;) {
                if (at_end() || s_[pos_] == '\n') fail(at, "unterminated string literal");
                if (s_[pos_] == c) {
                    ++pos_;
                    break;
                }
                bytes += utf8_encode(parse_char());
            }
            return g_.bytes(bytes);
        }
        if (c == '[') return g_.chars(parse_class());
        if (c == '.') {
            ++pos_;
            return g_.chars(CharSet::all());
        }
        if (c == '(') {
            ++pos_;
            int32_t inner = parse_alternatives(depth + 1);
            skip_space();
            if (at_end() || s_[pos_] != ')') fail(at, "unclosed '('");
            ++pos_;
            return inner;
        }
        if (c == '/') {
            // A regex literal: up to the next unescaped '/' outside a class.
            size_t i = pos_ + 1;
            bool in_class = false;
            for (; i < s_.size(); ++i) {
                if (s_[i] == '\\') {
                    ++i;
                } else if (s_[i] == '[') {
                    in_class = true;
                } else if (s_[i] == ']') {
                    in_class = false;
                } else if (s_[i] == '/' && !in_class) {
                    break;
                } else if (s_[i] == '\n') {
                    fail(at, "unterminated regex literal");
                }
            }
            if (i >= s_.size()) fail(at, "unterminated regex literal");
            std::string_view re = s_.substr(pos_ + 1, i - pos_ - 1);
            pos_ = i + 1;
            try {
                return parse_regex(g_, re, RegexContext::kText, false);
            } catch (const Error& e) {
                fail(at, e.what());
            }
        }
        if (name_char(c)) {
            std::string name = parse_name();
            return g_.ref(rule_id(name, at));
        }
        if (c == '*' || c == '+' || c == '?' || c == '{') fail(at, std::string("nothing to repeat before '") + c + "'");
        fail(at, std::string("unexpected character '") + c + "'");
    }

    // One (possibly escaped) character of a literal or class.
    uint32_t parse_char() {
        size_t at = pos_;
        if (s_[pos_] != '\\') {
            unsigned char c = static_cast<unsigned char>(s_[pos_]);
            if (c < 0x80) {
                ++pos_;
                return c;
            }
            utf8proc_int32_t cp = 0;
            utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s_.data() + pos_),
                                                  static_cast<utf8proc_ssize_t>(s_.size() - pos_), &cp);
            if (n <= 0) fail(at, "invalid UTF-8");
            pos_ += static_cast<size_t>(n);
            return static_cast<uint32_t>(cp);
        }
        ++pos_;
        if (at_end()) fail(at, "trailing backslash");
        char e = s_[pos_++];
        auto hex = [&](int n) -> uint32_t {
            uint32_t v = 0;
            for (int i = 0; i < n; ++i) {
                if (at_end() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) fail(at, "bad hex escape");
                char h = s_[pos_++];
                v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                               : (h | 0x20) - 'a' + 10);
            }
            if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail(at, "escape is not a Unicode scalar value");
            return v;
        };
        switch (e) {
            case 'n':
                return '\n';
            case 'r':
                return '\r';
            case 't':
                return '\t';
            case '0':
                return 0;
            case 'x':
                return hex(2);
            case 'u':
                return hex(4);
            case 'U':
                return hex(8);
            case '\\':
            case '"':
            case '\'':
            case '[':
            case ']':
            case '-':
            case '^':
            case '/':
                return static_cast<uint8_t>(e);
            default:
                fail(at, std::string("unknown escape \\") + e);
        }
    }

    CharSet parse_class() {
        size_t at = pos_;
        ++pos_;  // '['
        bool negate = false;
        if (!at_end() && s_[pos_] == '^') {
            negate = true;
            ++pos_;
        }
        CharSet set;
        for (;;) {
            if (at_end() || s_[pos_] == '\n') fail(at, "unterminated character class");
            if (s_[pos_] == ']') {
                ++pos_;
                break;
            }
            uint32_t lo = parse_char();
            if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
                ++pos_;
                uint32_t hi = parse_char();
                if (hi < lo) fail(at, "character class range out of order");
                set.add(lo, hi);
            } else {
                set.add(lo, lo);
            }
        }
        return negate ? set.complement() : set;
    }

    std::string_view s_;
    Grammar& g_;
    size_t pos_ = 0;
    std::map<std::string, int32_t> ids_;
    std::map<std::string, size_t> defined_, used_;
};

}  // namespace

Lowered lower_ebnf(std::string_view text) {
    Lowered out;
    EbnfParser parser(text, out.grammar);
    parser.parse();
    return out;
}

}  // namespace deepinfer::grammar
