#include "grammar/ir.h"

#include <algorithm>
#include <cstdio>

#include "deepinfer/error.h"

namespace deepinfer::grammar {

// ---------------------------------------------------------------------------------------------
// CharSet

CharSet CharSet::of(uint32_t lo, uint32_t hi) {
    CharSet s;
    s.add(lo, hi);
    return s;
}

void CharSet::add(uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    hi = std::min(hi, kMaxCodePoint);
    // Surrogates are not scalar values and have no UTF-8 encoding.
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) ranges_.push_back({lo, 0xD7FF});
        if (hi > 0xDFFF) ranges_.push_back({0xE000, hi});
    } else {
        ranges_.push_back({lo, hi});
    }
    normalize();
}

void CharSet::add(const CharSet& other) {
    ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
    normalize();
}

void CharSet::normalize() {
    std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    std::vector<Range> out;
    for (const Range& r : ranges_) {
        if (!out.empty() && r.lo <= out.back().hi + 1) {
            out.back().hi = std::max(out.back().hi, r.hi);
        } else {
            out.push_back(r);
        }
    }
    // Re-merge across the surrogate gap is not wanted: [..D7FF] and [E000..] stay apart, which is fine.
    ranges_ = std::move(out);
}

CharSet CharSet::complement() const {
    CharSet out;
    uint32_t next = 0;
    for (const Range& r : ranges_) {
        if (r.lo > next) out.add(next, r.lo - 1);
        next = r.hi + 1;
    }
    if (next <= kMaxCodePoint) out.add(next, kMaxCodePoint);
    return out;
}

CharSet CharSet::intersect(const CharSet& other) const {
    CharSet out;
    size_t i = 0, j = 0;
    while (i < ranges_.size() && j < other.ranges_.size()) {
        uint32_t lo = std::max(ranges_[i].lo, other.ranges_[j].lo);
        uint32_t hi = std::min(ranges_[i].hi, other.ranges_[j].hi);
        if (lo <= hi) out.ranges_.push_back({lo, hi});
        if (ranges_[i].hi < other.ranges_[j].hi) {
            ++i;
        } else {
            ++j;
        }
    }
    out.normalize();
    return out;
}

CharSet CharSet::minus(const CharSet& other) const { return intersect(other.complement()); }

bool CharSet::contains(uint32_t c) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c, [](uint32_t v, const Range& r) { return v < r.lo; });
    if (it == ranges_.begin()) return false;
    --it;
    return c >= it->lo && c <= it->hi;
}

bool CharSet::operator==(const CharSet& o) const {
    if (ranges_.size() != o.ranges_.size()) return false;
    for (size_t i = 0; i < ranges_.size(); ++i) {
        if (ranges_[i].lo != o.ranges_[i].lo || ranges_[i].hi != o.ranges_[i].hi) return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// UTF-8

std::string utf8_encode(uint32_t c) {
    std::string s;
    if (c < 0x80) {
        s += static_cast<char>(c);
    } else if (c < 0x800) {
        s += static_cast<char>(0xC0 | (c >> 6));
        s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        s += static_cast<char>(0xE0 | (c >> 12));
        s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (c >> 18));
        s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (c & 0x3F));
    }
    return s;
}

namespace {

int utf8_length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// [lo, hi] share one encoded length n. Splits until every byte position is one contiguous range.
void split_same_length(uint32_t lo, uint32_t hi, int n, std::vector<std::vector<ByteRange>>& out) {
    for (int i = 1; i < n; ++i) {
        uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low i continuation bytes
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split_same_length(lo, lo | m, n, out);
                split_same_length((lo | m) + 1, hi, n, out);
                return;
            }
            if ((hi & m) != m) {
                split_same_length(lo, (hi & ~m) - 1, n, out);
                split_same_length(hi & ~m, hi, n, out);
                return;
            }
        }
    }
    std::string a = utf8_encode(lo), b = utf8_encode(hi);
    std::vector<ByteRange> seq;
    for (int k = 0; k < n; ++k) seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
    out.push_back(std::move(seq));
}

}  // namespace

std::vector<std::vector<ByteRange>> utf8_sequences(uint32_t lo, uint32_t hi) {
    std::vector<std::vector<ByteRange>> out;
    static const uint32_t kBounds[][2] = {
        {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (const auto& b : kBounds) {
        uint32_t l = std::max(lo, b[0]), h = std::min(hi, b[1]);
        if (l <= h) split_same_length(l, h, utf8_length(l), out);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Grammar

int32_t Grammar::push(Expr e) {
    exprs_.push_back(std::move(e));
    return static_cast<int32_t>(exprs_.size()) - 1;
}

int32_t Grammar::bytes(std::string_view s) {
    if (s.empty() && empty_id_ >= 0) return empty_id_;
    Expr e;
    e.kind = ExprKind::kBytes;
    e.bytes = std::string(s);
    int32_t id = push(std::move(e));
    if (s.empty()) empty_id_ = id;
    return id;
}

int32_t Grammar::nothing() {
    if (nothing_id_ >= 0) return nothing_id_;
    Expr e;
    e.kind = ExprKind::kAlt;
    nothing_id_ = push(std::move(e));
    return nothing_id_;
}

int32_t Grammar::byteset(const ByteSet& set) {
    if (set.empty()) return nothing();
    Expr e;
    e.kind = ExprKind::kByteSet;
    e.byteset = set;
    return push(std::move(e));
}

int32_t Grammar::chars(const CharSet& set) {
    if (set.empty()) return nothing();
    if (set.ranges().size() == 1 && set.ranges()[0].lo == set.ranges()[0].hi) {
        return bytes(utf8_encode(set.ranges()[0].lo));
    }
    Expr e;
    e.kind = ExprKind::kChars;
    e.chars = set;
    return push(std::move(e));
}

int32_t Grammar::seq(std::vector<int32_t> kids) {
    std::vector<int32_t> flat;
    for (int32_t k : kids) {
        if (is_nothing(k)) return nothing();
        if (is_empty(k)) continue;
        const Expr& e = exprs_[k];
        if (e.kind == ExprKind::kSeq) {
            flat.insert(flat.end(), e.kids.begin(), e.kids.end());
        } else {
            flat.push_back(k);
        }
    }
    // Merge adjacent literals.
    std::vector<int32_t> merged;
    for (int32_t k : flat) {
        if (!merged.empty() && exprs_[k].kind == ExprKind::kBytes && exprs_[merged.back()].kind == ExprKind::kBytes) {
            merged.back() = bytes(exprs_[merged.back()].bytes + exprs_[k].bytes);
        } else {
            merged.push_back(k);
        }
    }
    if (merged.empty()) return empty();
    if (merged.size() == 1) return merged[0];
    Expr e;
    e.kind = ExprKind::kSeq;
    e.kids = std::move(merged);
    return push(std::move(e));
}

int32_t Grammar::alt(std::vector<int32_t> kids) {
    std::vector<int32_t> flat;
    for (int32_t k : kids) {
        if (is_nothing(k)) continue;
        const Expr& e = exprs_[k];
        if (e.kind == ExprKind::kAlt) {
            flat.insert(flat.end(), e.kids.begin(), e.kids.end());
        } else if (std::find(flat.begin(), flat.end(), k) == flat.end()) {
            flat.push_back(k);
        }
    }
    if (flat.empty()) return nothing();
    if (flat.size() == 1) return flat[0];
    Expr e;
    e.kind = ExprKind::kAlt;
    e.kids = std::move(flat);
    return push(std::move(e));
}

int32_t Grammar::repeat(int32_t kid, int32_t min, int32_t max) {
    DI_ICHECK(min >= 0 && (max == kUnbounded || max >= min), "bad repeat bounds ", min, ",", max);
    if (max == 0) return empty();
    if (min == 1 && max == 1) return kid;
    if (is_empty(kid)) return kid;
    if (is_nothing(kid)) return min == 0 ? empty() : nothing();
    Expr e;
    e.kind = ExprKind::kRepeat;
    e.min = min;
    e.max = max;
    e.kids = {kid};
    return push(std::move(e));
}

int32_t Grammar::ref(int32_t rule) {
    DI_ICHECK(rule >= 0 && rule < num_rules(), "bad rule id ", rule);
    Expr e;
    e.kind = ExprKind::kRef;
    e.rule = rule;
    return push(std::move(e));
}

int32_t Grammar::dfa(std::shared_ptr<const ByteDfa> d) {
    if (!d || d->num_states == 0) return nothing();
    if (d->num_states == 1 && d->accept[0]) {
        bool any = false;
        for (int32_t t : d->next) any = any || t >= 0;
        if (!any) return empty();
    }
    Expr e;
    e.kind = ExprKind::kDfa;
    e.dfa = std::move(d);
    return push(std::move(e));
}

int32_t Grammar::add_rule(std::string name) {
    rules_.push_back(Rule{std::move(name), -1, false, nullptr});
    return static_cast<int32_t>(rules_.size()) - 1;
}

int32_t Grammar::find_rule(std::string_view name) const {
    for (int32_t i = 0; i < num_rules(); ++i) {
        if (rules_[i].name == name) return i;
    }
    return -1;
}

namespace {

void append_escaped_byte(std::string& out, unsigned char c, bool in_class) {
    if (c == '\\' || c == '"' || (in_class && (c == ']' || c == '-' || c == '^'))) {
        out += '\\';
        out += static_cast<char>(c);
    } else if (c == '\n') {
        out += "\\n";
    } else if (c == '\t') {
        out += "\\t";
    } else if (c == '\r') {
        out += "\\r";
    } else if (c < 0x20 || c >= 0x7F) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
        out += buf;
    } else {
        out += static_cast<char>(c);
    }
}

void append_code_point(std::string& out, uint32_t c) {
    if (c < 0x80) {
        append_escaped_byte(out, static_cast<unsigned char>(c), true);
    } else {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u{%X}", c);
        out += buf;
    }
}

}  // namespace

std::string Grammar::expr_to_string(int32_t id) const {
    const Expr& e = exprs_[id];
    std::string out;
    switch (e.kind) {
        case ExprKind::kBytes:
            out += '"';
            for (unsigned char c : e.bytes) append_escaped_byte(out, c, false);
            out += '"';
            break;
        case ExprKind::kByteSet: {
            out += "[";
            for (int b = 0; b < 256; ++b) {
                if (!e.byteset.test(static_cast<uint8_t>(b))) continue;
                int end = b;
                while (end + 1 < 256 && e.byteset.test(static_cast<uint8_t>(end + 1))) ++end;
                append_escaped_byte(out, static_cast<unsigned char>(b), true);
                if (end > b) {
                    out += '-';
                    append_escaped_byte(out, static_cast<unsigned char>(end), true);
                }
                b = end;
            }
            out += "]";
            break;
        }
        case ExprKind::kChars: {
            CharSet c = e.chars;
            bool negate = c.contains(kMaxCodePoint) && c.ranges().size() > 1;
            if (negate) c = c.complement();
            out += negate ? "[^" : "[";
            for (const auto& r : c.ranges()) {
                append_code_point(out, r.lo);
                if (r.hi > r.lo) {
                    out += '-';
                    append_code_point(out, r.hi);
                }
            }
            out += "]";
            break;
        }
        case ExprKind::kSeq:
        case ExprKind::kAlt: {
            if (e.kids.empty()) return "(!)";  // nothing
            out += "(";
            for (size_t i = 0; i < e.kids.size(); ++i) {
                if (i) out += e.kind == ExprKind::kSeq ? " " : " | ";
                out += expr_to_string(e.kids[i]);
            }
            out += ")";
            break;
        }
        case ExprKind::kRepeat:
            out += expr_to_string(e.kids[0]);
            if (e.min == 0 && e.max == kUnbounded) {
                out += "*";
            } else if (e.min == 1 && e.max == kUnbounded) {
                out += "+";
            } else if (e.min == 0 && e.max == 1) {
                out += "?";
            } else {
                out += '{';
                out += std::to_string(e.min);
                out += ',';
                if (e.max != kUnbounded) out += std::to_string(e.max);
                out += '}';
            }
            break;
        case ExprKind::kRef:
            out += rules_[e.rule].name;
            break;
        case ExprKind::kDfa:
            out += "<dfa:";
            out += std::to_string(e.dfa->num_states);
            out += " states>";
            break;
    }
    return out;
}

std::string Grammar::to_string() const {
    std::string out;
    for (int32_t i = 0; i < num_rules(); ++i) {
        out += rules_[i].name;
        out += " ::= ";
        if (rules_[i].counted) {
            const CountedString& c = *rules_[i].counted;
            out += "\"\\\"\" <content:";
            out += std::to_string(c.content.num_states);
            out += " states>{";
            out += std::to_string(c.min_length);
            out += ",";
            if (c.max_length >= 0) out += std::to_string(c.max_length);
            out += "} \"\\\"\"";
        } else {
            out += rules_[i].body >= 0 ? expr_to_string(rules_[i].body) : "<undefined>";
        }
        out += "\n";
    }
    return out;
}

}  // namespace deepinfer::grammar
