// Grammar IR -> one minimal DFA per rule that is not inlined (a recursive transition network).
// Rules that are not recursive are inlined into their callers (so most of a JSON schema becomes one
// DFA); recursive rules and rules marked `separate` stay as call edges. Each DFA reads bytes and
// "calls" other DFAs; the matcher keeps a stack of frames.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/ir.h"

namespace deepinfer::grammar {

struct BuildLimits {
    int64_t max_states = 200000;  // DFA states over all rules (and 8x that for NFA states)
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    int32_t inline_max_size = 4000;  // a non-recursive rule larger than this (estimated NFA states) stays a call
};

struct Dfa {
    struct Call {
        int32_t callee;  // index into Automata::dfas
        int32_t ret;     // local state reached when the callee returns
    };
    std::string name;       // the IR rule's name
    bool separate = false;  // the IR rule asked to stay separate (its masks are shareable across grammars)
    std::shared_ptr<const CountedString> counted;  // a virtual counted-string automaton (num_states == 0)
    int32_t num_states = 0;
    int32_t num_classes = 0;
    int32_t start = 0;
    std::array<uint8_t, 256> byte_class{};
    std::vector<int32_t> next;             // [num_states * num_classes] local target, -1 = none
    std::vector<uint8_t> accept;           // [num_states]
    std::vector<std::vector<Call>> calls;  // [num_states]
    // Filled by analysis:
    std::vector<uint8_t> eps_accept;   // [num_states] accepting, possibly after calls to nullable rules
    std::vector<ByteSet> first;        // [num_states] bytes that can come next without returning from this rule
    std::vector<uint8_t> reach_calls;  // [num_states] some call edge is reachable from this state
    bool nullable = false;
    ByteSet rule_first;  // first[start]

    int32_t step(int32_t state, uint8_t byte) const { return next[state * num_classes + byte_class[byte]]; }
};

struct Automata {
    std::vector<Dfa> dfas;   // dfas[0] is the root rule
    int64_t nfa_states = 0;  // total, before determinization (for --stats)
};

// Throws deepinfer::Error when the grammar is left-recursive, matches nothing, or exceeds the limits.
Automata build_automata(const Grammar& g, const BuildLimits& limits);

// Regular-language operations for the front ends (JSON schema string constraints, key sets).
// expr must not reach recursive rules. Results are trimmed (every state can reach acceptance).
enum class RegularMode {
    kExact,            // recursive rules are an error; counted strings are spelled out
    kOverApproximate,  // recursive rules become "any bytes", counted strings lose their bounds (a superset)
};
std::shared_ptr<const ByteDfa> expr_to_dfa(const Grammar& g, int32_t expr, const BuildLimits& limits,
                                           RegularMode mode = RegularMode::kExact);
bool dfa_empty(const ByteDfa& a);  // the language is empty (trimmed DFAs have no states then)
std::shared_ptr<const ByteDfa> dfa_intersect(const ByteDfa& a, const ByteDfa& b, const BuildLimits& limits);
std::shared_ptr<const ByteDfa> dfa_subtract(const ByteDfa& a, const ByteDfa& b, const BuildLimits& limits);

// The counted form of JSON strings with content language `content` (between the quotes) and length
// bounds; `jchar_star` is the DFA of all JSON string contents (it marks character boundaries). Returns
// nullptr when some state's achievable completion lengths are not an interval (then the caller spells
// the bounds out as a repetition instead).
std::shared_ptr<const CountedString> make_counted_string(const ByteDfa& content, const ByteDfa& jchar_star,
                                                         int64_t min_length, int64_t max_length,
                                                         const BuildLimits& limits);

}  // namespace deepinfer::grammar
