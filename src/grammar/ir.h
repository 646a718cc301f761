// The grammar IR: every front end (regex, EBNF, JSON schema, choice) lowers to a set of rules whose
// bodies are byte-level regular expressions with references to other rules. The automaton builder
// (automaton.h) turns it into one DFA per rule that is not inlined.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of Unicode scalar values (surrogates are never members): sorted, disjoint, non-adjacent ranges.
class CharSet {
public:
    struct Range {
        uint32_t lo, hi;  // inclusive
    };

    CharSet() = default;
    static CharSet of(uint32_t lo, uint32_t hi);
    static CharSet single(uint32_t c) { return of(c, c); }
    static CharSet all() { return of(0, kMaxCodePoint); }

    void add(uint32_t lo, uint32_t hi);
    void add(const CharSet& other);
    CharSet complement() const;
    CharSet minus(const CharSet& other) const;
    CharSet intersect(const CharSet& other) const;
    bool contains(uint32_t c) const;
    bool empty() const { return ranges_.empty(); }
    const std::vector<Range>& ranges() const { return ranges_; }
    bool operator==(const CharSet& o) const;

private:
    void normalize();
    std::vector<Range> ranges_;
};

// 256-bit byte set.
struct ByteSet {
    std::array<uint64_t, 4> bits{};
    void set(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
    void set_range(uint8_t lo, uint8_t hi) {
        for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
    }
    bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
    ByteSet& operator|=(const ByteSet& o) {
        for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
        return *this;
    }
    bool empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
    bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

// A byte-level DFA embedded in an expression (the result of intersecting or subtracting regular
// languages, see automaton.h). Every state can reach an accepting state.
struct ByteDfa {
    int32_t num_states = 0;
    int32_t start = 0;
    std::vector<uint8_t> accept;  // [num_states]
    std::vector<int32_t> next;    // [num_states * 256], -1 = none
};

// A JSON string whose length (in characters) is bounded: the content language (between the quotes)
// as a DFA whose states know whether they sit at a character boundary, plus the bounds. It compiles to
// a virtual automaton whose states (count, content state) are computed, not tabulated, so that
// maxLength: 65535 costs no more than maxLength: 5.
struct CountedString {
    static constexpr int32_t kUnboundedChars = 1 << 30;
    ByteDfa content;                 // trimmed; accepting states are at character boundaries
    std::vector<uint8_t> boundary;   // [states] a character ends on entering this state
    std::vector<int32_t> min_chars;  // [states] fewest further characters to reach acceptance
    std::vector<int32_t> max_chars;  // [states] most (kUnboundedChars when unbounded)
    // next_len[s * (len_bound + 1) + x]: the fewest further characters >= x that reach acceptance from
    // s (kUnboundedChars: none up to len_bound). Above len_bound every length is achievable from states
    // with unbounded max_chars.
    int32_t len_bound = 0;
    std::vector<int32_t> next_len;
    // Can state s reach acceptance with a number of further characters in [lo, hi] (hi < 0: none)?
    bool can_finish(int32_t s, int64_t lo, int64_t hi) const {
        if (hi < 0) return false;
        if (lo < 0) lo = 0;
        int64_t nl = lo <= len_bound ? next_len[static_cast<size_t>(s) * (len_bound + 1) + lo]
                                     : (max_chars[s] >= kUnboundedChars ? lo : kUnboundedChars);
        return nl <= hi;
    }
    int64_t min_length = 0;
    int64_t max_length = -1;  // -1: unbounded
    std::string signature;    // identifies the content DFA (masks are shared across grammars by it)
};

enum class ExprKind : uint8_t {
    kBytes,    // a literal byte string; "" is the empty string
    kByteSet,  // one byte from a set
    kChars,    // one UTF-8 encoded code point from a CharSet
    kSeq,      // children in order
    kAlt,      // any one child; no children matches nothing
    kRepeat,   // the child repeated [min, max] times
    kRef,      // another rule
    kDfa,      // a precompiled byte DFA
};

inline constexpr int32_t kUnbounded = -1;

struct Expr {
    ExprKind kind = ExprKind::kBytes;
    int32_t min = 0, max = 0;            // kRepeat (max may be kUnbounded)
    int32_t rule = -1;                   // kRef
    std::string bytes;                   // kBytes
    ByteSet byteset;                     // kByteSet
    CharSet chars;                       // kChars
    std::shared_ptr<const ByteDfa> dfa;  // kDfa
    std::vector<int32_t> kids;           // kSeq, kAlt, kRepeat (one)
};

struct Rule {
    std::string name;
    int32_t body = -1;
    // Keep this rule as its own automaton even when it could be inlined: its per-state token masks are
    // then shared by every place (and every grammar) that uses it. Set for wide lexical rules (JSON strings).
    bool separate = false;
    // When set, the rule is this counted string (its body is ignored).
    std::shared_ptr<const CountedString> counted;
};

class Grammar {
public:
    // Expressions. Constructors simplify (flatten nested seq/alt, merge adjacent literals, drop empties).
    int32_t bytes(std::string_view s);
    int32_t empty() { return bytes(""); }
    int32_t nothing();
    int32_t byteset(const ByteSet& set);
    int32_t chars(const CharSet& set);
    int32_t seq(std::vector<int32_t> kids);
    int32_t alt(std::vector<int32_t> kids);
    int32_t repeat(int32_t kid, int32_t min, int32_t max);
    int32_t optional(int32_t kid) { return repeat(kid, 0, 1); }
    int32_t star(int32_t kid) { return repeat(kid, 0, kUnbounded); }
    int32_t plus(int32_t kid) { return repeat(kid, 1, kUnbounded); }
    int32_t ref(int32_t rule);
    int32_t dfa(std::shared_ptr<const ByteDfa> d);  // nothing() when d has no states

    // Rules. add_rule() creates a rule with no body yet (so that bodies can refer to it).
    int32_t add_rule(std::string name);
    void set_body(int32_t rule, int32_t body) { rules_[rule].body = body; }
    void set_separate(int32_t rule, bool v = true) { rules_[rule].separate = v; }
    void set_counted(int32_t rule, std::shared_ptr<const CountedString> c) {
        rules_[rule].counted = std::move(c);
        rules_[rule].separate = true;
        if (rules_[rule].body < 0) rules_[rule].body = nothing();
    }
    int32_t find_rule(std::string_view name) const;  // -1 when absent
    void set_root(int32_t rule) { root_ = rule; }

    int32_t root() const { return root_; }
    const Expr& expr(int32_t id) const { return exprs_[id]; }
    const Rule& rule(int32_t id) const { return rules_[id]; }
    int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
    int32_t num_exprs() const { return static_cast<int32_t>(exprs_.size()); }
    bool is_nothing(int32_t id) const { return exprs_[id].kind == ExprKind::kAlt && exprs_[id].kids.empty(); }
    bool is_empty(int32_t id) const { return exprs_[id].kind == ExprKind::kBytes && exprs_[id].bytes.empty(); }

    // EBNF-like text of every rule, for debugging and `deepinfer grammar --stats`.
    std::string to_string() const;
    std::string expr_to_string(int32_t id) const;

private:
    int32_t push(Expr e);
    std::vector<Expr> exprs_;
    std::vector<Rule> rules_;
    int32_t root_ = -1;
    int32_t nothing_id_ = -1, empty_id_ = -1;
};

// UTF-8 encoding of one code point (no validation of surrogates).
std::string utf8_encode(uint32_t c);

// Byte-range sequences whose union is exactly the UTF-8 encodings of the code points in [lo, hi].
// Each sequence is 1-4 (lo, hi) byte ranges.
struct ByteRange {
    uint8_t lo, hi;
};
std::vector<std::vector<ByteRange>> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace deepinfer::grammar
