// Internal: the flattened automata of a compiled grammar, the parser stacks, and the per-state token
// classification cache.
//
// A parser position is a stack of frames; the top frame is (global DFA state, parent node) and the
// frames below live in a hash-consed StackPool. Per DFA state we cache (lazily) which tokens are
// accepted without leaving that state's rule (context-independent: a bitset or id list) and which
// tokens leave the rule with bytes left over (context-dependent: a trie of the leftover suffixes, walked
// at mask time from the caller's frame). Tokens in neither are rejected.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/token_trie.h"

namespace deepinfer::grammar {

inline constexpr int32_t kRootParent = -1;  // below the bottom frame: the end of the whole grammar
inline constexpr int32_t kExitParent = -2;  // below the bottom frame of a cache walk: the unknown caller

struct Pos {
    int32_t state;   // global DFA state of the top frame
    int32_t parent;  // StackPool node of the frame below, or kRootParent / kExitParent
    bool operator==(const Pos& o) const { return state == o.state && parent == o.parent; }
    bool operator<(const Pos& o) const { return state != o.state ? state < o.state : parent < o.parent; }
};

// Hash-consed stack frames: node (state, parent) is created once, so equal stacks are equal ids.
class StackPool {
public:
    struct Node {
        int32_t state;  // the frame's return state
        int32_t parent;
    };
    int32_t make(int32_t state, int32_t parent);
    const Node& node(int32_t id) const { return nodes_[id]; }
    int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
    void clear();

private:
    void grow();
    std::vector<Node> nodes_;
    std::vector<int32_t> table_;  // open addressing, -1 = empty
};

struct StateMask {
    bool dense = false;
    std::vector<uint32_t> bits;  // dense: [mask_words]
    std::vector<int32_t> ids;    // sparse: sorted token ids
    int32_t num_accepted = 0;
    TokenTrie exits;                  // leftover suffixes of tokens leaving the rule (size() <= 1: none)
    std::vector<int32_t> exit_nodes;  // vocabulary trie nodes after which the rule may be left (sorted)
    double build_us = 0;
    bool has_exits() const { return exits.size() > 1; }
};

// Lazily filled per-state masks of one automaton; thread-safe publication.
class MaskTable {
public:
    explicit MaskTable(int32_t num_states);
    ~MaskTable();
    MaskTable(const MaskTable&) = delete;
    MaskTable& operator=(const MaskTable&) = delete;
    const StateMask* get(int32_t local) const { return slots_[local].load(std::memory_order_acquire); }
    const StateMask* publish(int32_t local, std::unique_ptr<StateMask> mask) const;
    int32_t filled() const;

private:
    int32_t n_;
    std::unique_ptr<std::atomic<const StateMask*>[]> slots_;
};

// Masks of virtual (counted-string) states, keyed by an equivalence class of states that classify
// every token alike; shared by all grammars using the same content automaton.
class ClassMaskCache {
public:
    const StateMask* get(uint64_t key) const;
    const StateMask* publish(uint64_t key, std::unique_ptr<StateMask> mask);
    size_t size() const;

private:
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, std::unique_ptr<StateMask>> map_;
};

using SharedTableFn = std::function<std::shared_ptr<MaskTable>(const std::string& signature, int32_t n)>;
using SharedClassCacheFn = std::function<std::shared_ptr<ClassMaskCache>(const std::string& signature)>;

class CompiledGrammarImpl {
public:
    enum Flag : uint8_t { kAccept = 1, kEpsAccept = 2, kReachCalls = 4, kHasCalls = 8 };
    struct Automaton {
        std::string name;
        int32_t base = 0;  // first global state id
        int32_t num_states = 0, num_classes = 0;
        int32_t start = 0;     // global
        int64_t next_off = 0;  // into next
        std::array<uint8_t, 256> cls{};
        bool nullable = false;
        bool leaf = false;    // no call edges at all
        bool called = false;  // some call edge enters it (else it is only the root: nothing to return to)
        ByteSet first;
        // Virtual counted string: states base + 0 (before the opening quote), base + 1 (after the
        // closing quote), base + 2 + count * K + content_state; count in [0, counts).
        std::shared_ptr<const CountedString> counted;
        int64_t counts = 0;
        int32_t clamp_rem = 0, clamp_gap = 0;  // class clamps (see class_key)
        std::vector<ByteSet> content_first;    // [content states] bytes with a transition (a superset)
    };
    struct Call {
        int32_t callee;  // automaton
        int32_t ret;     // global state
    };

    // Builds the runtime tables; separate leaf automata take their mask tables from `shared_table`
    // (keyed by structure), counted strings their class caches from `shared_classes`.
    CompiledGrammarImpl(std::shared_ptr<const Vocabulary> vocab, const Automata& automata,
                        const SharedTableFn& shared_table, const SharedClassCacheFn& shared_classes);

    int64_t num_states() const { return total_states_; }  // tabulated + virtual
    int32_t root_start() const { return automata[0].start; }
    bool is_virtual(int32_t s) const { return s >= real_states_; }
    int32_t automaton_index(int32_t s) const;
    int32_t step(int32_t s, uint8_t b) const {
        if (s >= real_states_) return virtual_step(s, b);
        const Automaton& a = automata[state_automaton[s]];
        return next[a.next_off + static_cast<int64_t>(s - a.base) * a.num_classes + a.cls[b]];
    }
    uint8_t flags_of(int32_t s) const { return s < real_states_ ? flags[s] : virtual_flags(s); }
    ByteSet first_of(int32_t s) const;
    int32_t calls_begin(int32_t s) const { return s < real_states_ ? call_off[s] : 0; }
    int32_t calls_end(int32_t s) const { return s < real_states_ ? call_off[s + 1] : 0; }
    bool accepting(int32_t s) const { return flags_of(s) & kAccept; }
    bool eps_accepting(int32_t s) const { return flags_of(s) & kEpsAccept; }
    // The token classification of state s, built on first use.
    const StateMask& state_mask(int32_t s) const;
    int64_t min_finish(int32_t s) const;  // fewest bytes from s to the rule's end (counted strings: chars)

    std::shared_ptr<const Vocabulary> vocab;
    std::vector<Automaton> automata;
    std::vector<int32_t> next;             // global targets, -1 = none
    std::vector<int32_t> state_automaton;  // [S]
    std::vector<uint8_t> flags;            // [S]
    std::vector<int32_t> call_off;         // [S + 1]
    std::vector<Call> calls;
    std::vector<ByteSet> first;                                 // [S]
    std::vector<std::shared_ptr<MaskTable>> tables;             // per automaton (null for counted strings)
    std::vector<std::shared_ptr<ClassMaskCache>> class_caches;  // per automaton (counted strings only)
    GrammarStats stats;
    std::string description;

private:
    int32_t virtual_step(int32_t s, uint8_t b) const;
    int64_t virtual_min_finish(int32_t s) const;
    uint8_t virtual_flags(int32_t s) const;
    uint64_t class_key(const Automaton& a, int32_t v) const;
    std::unique_ptr<StateMask> build_counted_mask(const Automaton& a, int32_t v) const;
    bool delta_walk(int32_t s, std::vector<uint32_t>& bits, std::vector<int32_t>& exit_nodes) const;
    int32_t real_states_ = 0;
    int64_t total_states_ = 0;
    std::vector<int32_t> virtual_automata_;  // indices of counted automata, by base
    void compute_min_finish() const;
    mutable std::once_flag min_finish_once_;
    mutable std::vector<int64_t> min_finish_;
};

// Steps parser positions byte by byte: pushes into callees, pops out of finished frames.
class Stepper {
public:
    Stepper(const CompiledGrammarImpl& g, StackPool& pool) : g_(g), pool_(pool) {}
    // Appends to out every position reached from p by reading byte b (duplicates possible).
    void step(Pos p, uint8_t b, std::vector<Pos>& out);
    // Bytes that can be read next from p (popping through finished frames, not past the bottom).
    ByteSet viable(Pos p) const;
    // Whether p can pop past a kExitParent bottom without reading bytes.
    bool can_exit(Pos p) const;
    // Whether p can pop past the kRootParent bottom (the text is a complete match).
    bool can_finish(Pos p) const;
    StackPool& pool() { return pool_; }
    const CompiledGrammarImpl& grammar() const { return g_; }

private:
    void rec(Pos p, uint8_t b, std::vector<Pos>& out);
    const CompiledGrammarImpl& g_;
    StackPool& pool_;
    std::vector<Pos> visited_;
};

void sort_unique(std::vector<Pos>& v);

// Walks `trie` from the positions `start`: on_token(id) for every token whose bytes can be read.
// Used at mask time for the leftover suffixes of tokens that leave a rule.
void walk_suffixes(const TokenTrie& trie, const std::vector<Pos>& start, Stepper& stepper, uint32_t* mask);

}  // namespace deepinfer::grammar
