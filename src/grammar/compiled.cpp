#include "grammar/compiled.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "deepinfer/error.h"

namespace deepinfer::grammar {

// ---------------------------------------------------------------------------------------------
// StackPool

namespace {
inline uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}
}  // namespace

void StackPool::grow() {
    size_t cap = table_.empty() ? 64 : table_.size() * 2;
    table_.assign(cap, -1);
    for (int32_t id = 0; id < size(); ++id) {
        size_t i = hash_pair(nodes_[id].state, nodes_[id].parent) & (cap - 1);
        while (table_[i] >= 0) i = (i + 1) & (cap - 1);
        table_[i] = id;
    }
}

int32_t StackPool::make(int32_t state, int32_t parent) {
    if ((nodes_.size() + 1) * 2 > table_.size()) grow();
    size_t mask = table_.size() - 1;
    size_t i = hash_pair(state, parent) & mask;
    while (table_[i] >= 0) {
        const Node& n = nodes_[table_[i]];
        if (n.state == state && n.parent == parent) return table_[i];
        i = (i + 1) & mask;
    }
    int32_t id = size();
    nodes_.push_back({state, parent});
    table_[i] = id;
    return id;
}

void StackPool::clear() {
    nodes_.clear();
    std::fill(table_.begin(), table_.end(), -1);
}

// ---------------------------------------------------------------------------------------------
// MaskTable

MaskTable::MaskTable(int32_t num_states) : n_(num_states), slots_(new std::atomic<const StateMask*>[num_states]) {
    for (int32_t i = 0; i < n_; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

MaskTable::~MaskTable() {
    for (int32_t i = 0; i < n_; ++i) delete slots_[i].load(std::memory_order_relaxed);
}

const StateMask* MaskTable::publish(int32_t local, std::unique_ptr<StateMask> mask) const {
    const StateMask* expected = nullptr;
    const StateMask* mine = mask.get();
    if (slots_[local].compare_exchange_strong(expected, mine, std::memory_order_acq_rel)) {
        mask.release();
        return mine;
    }
    return expected;  // another thread won; ours is freed
}

int32_t MaskTable::filled() const {
    int32_t c = 0;
    for (int32_t i = 0; i < n_; ++i) c += slots_[i].load(std::memory_order_relaxed) != nullptr;
    return c;
}

const StateMask* ClassMaskCache::get(uint64_t key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second.get();
}

const StateMask* ClassMaskCache::publish(uint64_t key, std::unique_ptr<StateMask> mask) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.get();
    return map_.emplace(key, std::move(mask)).first->second.get();
}

size_t ClassMaskCache::size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
}

// ---------------------------------------------------------------------------------------------
// Stepper

void sort_unique(std::vector<Pos>& v) {
    if (v.size() < 2) return;
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
}

void Stepper::step(Pos p, uint8_t b, std::vector<Pos>& out) {
    visited_.clear();
    rec(p, b, out);
}

void Stepper::rec(Pos p, uint8_t b, std::vector<Pos>& out) {
    int32_t s = p.state;
    uint8_t f = g_.flags_of(s);
    int32_t t = g_.step(s, b);
    if (t >= 0) out.push_back({t, p.parent});
    bool can_pop = (f & CompiledGrammarImpl::kAccept) && p.parent >= 0;
    if (!(f & CompiledGrammarImpl::kHasCalls) && !can_pop) return;
    // Epsilon moves (push, pop) can cycle through nullable rules; visit each position once.
    for (const Pos& v : visited_) {
        if (v == p) return;
    }
    visited_.push_back(p);
    if (f & CompiledGrammarImpl::kHasCalls) {
        for (int32_t i = g_.calls_begin(s), e = g_.calls_end(s); i < e; ++i) {
            const CompiledGrammarImpl::Call& call = g_.calls[i];
            const CompiledGrammarImpl::Automaton& c = g_.automata[call.callee];
            if (!c.first.test(b) && !c.nullable) continue;
            int32_t frame = pool_.make(call.ret, p.parent);
            rec(Pos{c.start, frame}, b, out);
        }
    }
    if (can_pop) {
        StackPool::Node n = pool_.node(p.parent);
        rec(Pos{n.state, n.parent}, b, out);
    }
}

ByteSet Stepper::viable(Pos p) const {
    ByteSet v = g_.first_of(p.state);
    while (g_.eps_accepting(p.state) && p.parent >= 0) {
        StackPool::Node n = pool_.node(p.parent);
        p = Pos{n.state, n.parent};
        v |= g_.first_of(p.state);
    }
    return v;
}

bool Stepper::can_exit(Pos p) const {
    for (;;) {
        if (!g_.eps_accepting(p.state)) return false;
        if (p.parent == kExitParent) return true;
        if (p.parent < 0) return false;
        StackPool::Node n = pool_.node(p.parent);
        p = Pos{n.state, n.parent};
    }
}

bool Stepper::can_finish(Pos p) const {
    for (;;) {
        if (!g_.eps_accepting(p.state)) return false;
        if (p.parent == kRootParent) return true;
        if (p.parent < 0) return false;
        StackPool::Node n = pool_.node(p.parent);
        p = Pos{n.state, n.parent};
    }
}

// ---------------------------------------------------------------------------------------------
// Trie walks

namespace {

inline void set_tokens(const TokenTrie& trie, int32_t node, uint32_t* bits) {
    for (int32_t k = trie.tok_off[node]; k < trie.tok_off[node + 1]; ++k) {
        int32_t id = trie.toks[k];
        bits[id >> 5] |= uint32_t{1} << (id & 31);
    }
}

// Generic walk over positions with pushes and pops. exits != nullptr: record nodes after which the
// bottom frame (kExitParent) may be left with bytes remaining.
void walk_generic(const TokenTrie& trie, const std::vector<Pos>& start, Stepper& stepper, uint32_t* bits,
                  std::vector<int32_t>* exits) {
    const CompiledGrammarImpl& g = stepper.grammar();
    int32_t n = trie.size();
    std::vector<std::vector<Pos>> sets(trie.max_depth + 1);
    std::vector<ByteSet> viable(trie.max_depth + 1);
    // fast[d]: sets[d] is one position whose next step is a plain table lookup (no calls, no pops).
    std::vector<char> fast(trie.max_depth + 1, 0);
    auto is_fast = [&](const std::vector<Pos>& set) {
        if (set.size() != 1 || g.is_virtual(set[0].state)) return false;
        uint8_t f = g.flags_of(set[0].state);
        return !(f & CompiledGrammarImpl::kHasCalls) && !((f & CompiledGrammarImpl::kAccept) && set[0].parent >= 0);
    };
    sets[0] = start;
    fast[0] = is_fast(start);
    if (!fast[0]) {
        for (const Pos& p : start) viable[0] |= stepper.viable(p);
    }
    for (int32_t i = 1; i < n;) {
        int32_t d = trie.depth[i];
        uint8_t b = trie.byte[i];
        std::vector<Pos>& cur = sets[d];
        if (fast[d - 1]) {
            const Pos& p = sets[d - 1][0];
            int32_t t = g.step(p.state, b);
            if (t < 0) {
                i = trie.end[i];
                continue;
            }
            cur.assign(1, Pos{t, p.parent});
        } else {
            if (!viable[d - 1].test(b)) {
                i = trie.end[i];
                continue;
            }
            cur.clear();
            for (const Pos& p : sets[d - 1]) stepper.step(p, b, cur);
            if (cur.empty()) {
                i = trie.end[i];
                continue;
            }
            sort_unique(cur);
            DI_CHECK(cur.size() <= 4096, "grammar too ambiguous: more than 4096 parse stacks at once");
        }
        set_tokens(trie, i, bits);
        if (trie.has_children(i)) {
            bool ex = false;
            fast[d] = is_fast(cur);
            if (fast[d]) {
                if (exits) ex = stepper.can_exit(cur[0]);
            } else {
                ByteSet v;
                for (const Pos& p : cur) {
                    v |= stepper.viable(p);
                    if (exits && !ex) ex = stepper.can_exit(p);
                }
                viable[d] = v;
            }
            if (ex) exits->push_back(i);
        }
        ++i;
    }
}

}  // namespace

void walk_suffixes(const TokenTrie& trie, const std::vector<Pos>& start, Stepper& stepper, uint32_t* mask) {
    walk_generic(trie, start, stepper, mask, nullptr);
}

// ---------------------------------------------------------------------------------------------
// CompiledGrammarImpl

CompiledGrammarImpl::CompiledGrammarImpl(std::shared_ptr<const Vocabulary> v, const Automata& a,
                                         const SharedTableFn& shared_table, const SharedClassCacheFn& shared_classes)
    : vocab(std::move(v)) {
    int64_t total = 0, next_total = 0;
    automata.resize(a.dfas.size());
    for (size_t ai = 0; ai < a.dfas.size(); ++ai) {
        const Dfa& d = a.dfas[ai];
        Automaton& r = automata[ai];
        r.name = d.name;
        r.nullable = d.nullable;
        r.first = d.rule_first;
        r.leaf = true;
        for (const auto& cs : d.calls) r.leaf = r.leaf && cs.empty();
        if (d.counted) continue;
        r.base = static_cast<int32_t>(total);
        r.num_states = d.num_states;
        r.num_classes = d.num_classes;
        r.start = r.base + d.start;
        r.next_off = next_total;
        r.cls = d.byte_class;
        total += d.num_states;
        next_total += static_cast<int64_t>(d.num_states) * d.num_classes;
    }
    real_states_ = static_cast<int32_t>(total);
    // Counted strings take virtual id ranges after the tabulated states.
    int32_t max_token = vocab->trie().max_depth;
    for (size_t ai = 0; ai < a.dfas.size(); ++ai) {
        const Dfa& d = a.dfas[ai];
        if (!d.counted) continue;
        Automaton& r = automata[ai];
        const CountedString& cs = *d.counted;
        r.counted = d.counted;
        int64_t k = cs.content.num_states;
        r.counts = (cs.max_length >= 0 ? cs.max_length : cs.min_length) + 1;
        int64_t size = 2 + r.counts * k;
        DI_CHECK(total + size < (int64_t{1} << 31) - 1,
                 "grammar too large: string length bounds need more than 2^31 states");
        DI_ICHECK(k < (1 << 22), "counted string content automaton too large");
        r.base = static_cast<int32_t>(total);
        r.start = r.base;
        r.num_states = 0;
        // States whose distance to the bounds exceeds what one token can cover (plus the exact-length
        // window) classify tokens alike.
        r.content_first.resize(k);
        for (int64_t cd = 0; cd < k; ++cd) {
            for (int b = 0; b < 256; ++b) {
                if (cs.content.next[cd * 256 + b] >= 0) r.content_first[cd].set(static_cast<uint8_t>(b));
            }
            if (cs.content.accept[cd]) r.content_first[cd].set('"');
        }
        r.clamp_rem = std::min(max_token + 2 + cs.len_bound, (1 << 20) - 1);
        r.clamp_gap = std::min(max_token + 2 + cs.len_bound, (1 << 20) - 1);
        total += size;
        virtual_automata_.push_back(static_cast<int32_t>(ai));
    }
    total_states_ = total;
    next.resize(next_total);
    state_automaton.resize(real_states_);
    flags.resize(real_states_);
    first.resize(real_states_);
    call_off.assign(real_states_ + 1, 0);
    for (size_t ai = 0; ai < a.dfas.size(); ++ai) {
        const Dfa& d = a.dfas[ai];
        const Automaton& r = automata[ai];
        if (d.counted) continue;
        for (int64_t k = 0; k < static_cast<int64_t>(d.num_states) * d.num_classes; ++k) {
            next[r.next_off + k] = d.next[k] < 0 ? -1 : r.base + d.next[k];
        }
        for (int32_t s = 0; s < d.num_states; ++s) {
            int32_t gs = r.base + s;
            state_automaton[gs] = static_cast<int32_t>(ai);
            flags[gs] = (d.accept[s] ? kAccept : 0) | (d.eps_accept[s] ? kEpsAccept : 0) |
                        (d.reach_calls[s] ? kReachCalls : 0) | (d.calls[s].empty() ? 0 : kHasCalls);
            first[gs] = d.first[s];
            for (const auto& c : d.calls[s]) calls.push_back({c.callee, r.base + c.ret});
            call_off[gs + 1] = static_cast<int32_t>(calls.size());
        }
    }
    for (const auto& c : calls) automata[c.callee].called = true;
    tables.resize(a.dfas.size());
    class_caches.resize(a.dfas.size());
    for (size_t ai = 0; ai < a.dfas.size(); ++ai) {
        const Dfa& d = a.dfas[ai];
        if (d.counted) {
            class_caches[ai] = shared_classes(d.counted->signature);
        } else if (automata[ai].leaf && d.separate) {
            // Structure signature: classes, transitions and accepting states.
            std::string sig;
            sig.append(reinterpret_cast<const char*>(d.byte_class.data()), 256);
            sig.append(reinterpret_cast<const char*>(&d.num_states), sizeof d.num_states);
            sig.append(reinterpret_cast<const char*>(&d.start), sizeof d.start);
            sig.append(reinterpret_cast<const char*>(d.next.data()), d.next.size() * sizeof(int32_t));
            sig.append(reinterpret_cast<const char*>(d.accept.data()), d.accept.size());
            tables[ai] = shared_table(sig, d.num_states);
        } else {
            tables[ai] = std::make_shared<MaskTable>(d.num_states);
        }
    }
}

int32_t CompiledGrammarImpl::automaton_index(int32_t s) const {
    if (s < real_states_) return state_automaton[s];
    auto it = std::upper_bound(virtual_automata_.begin(), virtual_automata_.end(), s,
                               [this](int32_t x, int32_t ai) { return x < automata[ai].base; });
    DI_ICHECK(it != virtual_automata_.begin(), "bad virtual state ", s);
    return *(it - 1);
}

namespace {

// One step of a counted string; states are local indices (0 before, 1 after, 2 + c * K + d).
inline int32_t counted_step(const CompiledGrammarImpl::Automaton& a, int32_t v, uint8_t b) {
    const CountedString& cs = *a.counted;
    const int32_t k = cs.content.num_states;
    // Some completion must bring the count into [min_length, max_length].
    auto live = [&](int64_t c, int32_t d) {
        int64_t hi = cs.max_length < 0 ? int64_t{1} << 40 : cs.max_length - c;
        return cs.can_finish(d, cs.min_length - c, hi);
    };
    if (v == 1) return -1;
    if (v == 0) {
        if (b != '"' || !live(0, cs.content.start)) return -1;
        return 2 + cs.content.start;
    }
    int64_t c = (v - 2) / k;
    int32_t d = (v - 2) % k;
    if (b == '"' && cs.content.accept[d]) {  // the closing quote (inside an escape, '"' is content)
        bool ok = c >= cs.min_length && (cs.max_length < 0 || c <= cs.max_length);
        return ok ? 1 : -1;
    }
    int32_t t = cs.content.next[static_cast<size_t>(d) * 256 + b];
    if (t < 0) return -1;
    int64_t c2 = c + cs.boundary[t];
    if (cs.max_length < 0) c2 = std::min<int64_t>(c2, cs.min_length);
    if (!live(c2, t)) return -1;
    return static_cast<int32_t>(2 + c2 * k + t);
}

}  // namespace

int32_t CompiledGrammarImpl::virtual_step(int32_t s, uint8_t b) const {
    const Automaton& a = automata[automaton_index(s)];
    int32_t t = counted_step(a, s - a.base, b);
    return t < 0 ? -1 : a.base + t;
}

uint8_t CompiledGrammarImpl::virtual_flags(int32_t s) const {
    const Automaton& a = automata[automaton_index(s)];
    return s - a.base == 1 ? (kAccept | kEpsAccept) : 0;
}

ByteSet CompiledGrammarImpl::first_of(int32_t s) const {
    if (s < real_states_) return first[s];
    // A superset (bounds not applied): used to prune, every byte is still stepped exactly.
    const Automaton& a = automata[automaton_index(s)];
    int32_t v = s - a.base;
    ByteSet out;
    if (v == 0) {
        out.set('"');
    } else if (v > 1) {
        out = a.content_first[(v - 2) % a.counted->content.num_states];
    }
    return out;
}

uint64_t CompiledGrammarImpl::class_key(const Automaton& a, int32_t v) const {
    const CountedString& cs = *a.counted;
    uint64_t kind = v == 0 ? 0 : v == 1 ? 1 : 2;
    int64_t c = 0, d = 0;
    if (kind == 2) {
        c = (v - 2) / cs.content.num_states;
        d = (v - 2) % cs.content.num_states;
    }
    if (kind == 1) return 1;
    uint64_t gap = static_cast<uint64_t>(std::min<int64_t>(std::max<int64_t>(cs.min_length - c, 0), a.clamp_gap));
    uint64_t rem =
        cs.max_length < 0 ? a.clamp_rem : static_cast<uint64_t>(std::min<int64_t>(cs.max_length - c, a.clamp_rem));
    return kind | (static_cast<uint64_t>(d) << 2) | (gap << 24) | (rem << 44);
}

namespace {

// Packs a walk's results: the accepted bits (dense or sparse) and the trie of leftover suffixes of
// tokens that leave the rule (at exit_nodes) without being accepted inside it.
std::unique_ptr<StateMask> finish_mask(const TokenTrie& trie, int32_t words, std::vector<uint32_t>& bits,
                                       const std::vector<int32_t>& exit_nodes) {
    auto mask = std::make_unique<StateMask>();
    mask->exit_nodes = exit_nodes;
    std::sort(mask->exit_nodes.begin(), mask->exit_nodes.end());
    if (!exit_nodes.empty()) {
        std::vector<std::pair<std::string, int32_t>> entries;
        std::string path(trie.max_depth + 1, '\0');
        for (int32_t e : exit_nodes) {
            int32_t de = trie.depth[e];
            for (int32_t j = e + 1; j < trie.end[e]; ++j) {
                int32_t dj = trie.depth[j];
                path[dj] = static_cast<char>(trie.byte[j]);
                for (int32_t k = trie.tok_off[j]; k < trie.tok_off[j + 1]; ++k) {
                    int32_t id = trie.toks[k];
                    if (bits[id >> 5] >> (id & 31) & 1) continue;
                    entries.emplace_back(path.substr(de + 1, dj - de), id);
                }
            }
        }
        if (!entries.empty()) mask->exits = TokenTrie::build(std::move(entries));
    }
    int32_t count = 0;
    for (uint32_t w : bits) count += __builtin_popcount(w);
    mask->num_accepted = count;
    if (count >= words / 2) {
        mask->dense = true;
        mask->bits = std::move(bits);
    } else {
        mask->ids.reserve(count);
        for (int32_t w = 0; w < words; ++w) {
            for (uint32_t x = bits[w]; x; x &= x - 1) mask->ids.push_back(w * 32 + __builtin_ctz(x));
        }
    }
    return mask;
}

}  // namespace

std::unique_ptr<StateMask> CompiledGrammarImpl::build_counted_mask(const Automaton& a, int32_t v0) const {
    const TokenTrie& trie = vocab->trie();
    int32_t words = vocab->mask_words();
    std::vector<uint32_t> bits(words, 0);
    std::vector<int32_t> exit_nodes;
    std::vector<int32_t> st(trie.max_depth + 1);
    st[0] = v0;
    int32_t n = trie.size();
    for (int32_t i = 1; i < n;) {
        int32_t d = trie.depth[i];
        int32_t t = counted_step(a, st[d - 1], trie.byte[i]);
        if (t < 0) {
            i = trie.end[i];
            continue;
        }
        st[d] = t;
        set_tokens(trie, i, bits.data());
        if (t == 1 && trie.has_children(i)) exit_nodes.push_back(i);
        ++i;
    }
    return finish_mask(trie, words, bits, exit_nodes);
}

// A state q whose runs soon merge with those of a reference state r (r = q's successor on some byte
// x, with an x-loop on r: e.g. a key automaton after a prefix of a declared name, r = "any other
// key") classifies tokens like r except where the two runs differ. Starting from r's cached mask,
// only the trie nodes where the runs are in different states are walked. Returns false (nothing
// changed) when no reference exists or the runs stay apart for too long.
bool CompiledGrammarImpl::delta_walk(int32_t s, std::vector<uint32_t>& bits, std::vector<int32_t>& exit_nodes) const {
    thread_local int depth = 0;
    if (depth > 0) return false;  // references are filled by full walks
    const Automaton& a = automata[state_automaton[s]];
    int32_t r = -1;
    for (uint8_t x : {'z', 'x', 'q', 'e', 'a', '0', '_', ' '}) {
        int32_t t = step(s, x);
        if (t >= 0 && t != s && step(t, x) == t && !(flags[t] & kReachCalls)) {
            r = t;
            break;
        }
    }
    if (r < 0) return false;
    ++depth;
    const StateMask* ref;
    try {
        ref = &state_mask(r);
    } catch (...) {
        --depth;
        throw;
    }
    --depth;
    const TokenTrie& trie = vocab->trie();
    std::vector<uint32_t> out(bits.size(), 0);
    if (ref->dense) {
        out = ref->bits;
    } else {
        for (int32_t id : ref->ids) out[id >> 5] |= uint32_t{1} << (id & 31);
    }
    const int32_t* tab = next.data() + a.next_off;
    const int32_t nc = a.num_classes, base = a.base, n = trie.size();
    const uint8_t* cls = a.cls.data();
    std::vector<int32_t> sq(trie.max_depth + 1), sr(trie.max_depth + 1);
    std::vector<int32_t> added, removed;
    sq[0] = s - base;
    sr[0] = r - base;
    int64_t budget = n / 4;
    for (int32_t i = 1; i < n;) {
        if (--budget < 0) return false;
        int32_t d = trie.depth[i];
        int32_t cb = cls[trie.byte[i]];
        int32_t tq = sq[d - 1] < 0 ? -1 : tab[sq[d - 1] * nc + cb];
        int32_t tr = sr[d - 1] < 0 ? -1 : tab[sr[d - 1] * nc + cb];
        if (tq == tr) {  // identical from here on (or both dead)
            i = trie.end[i];
            continue;
        }
        for (int32_t k = trie.tok_off[i]; k < trie.tok_off[i + 1]; ++k) {
            int32_t id = trie.toks[k];
            if (tq >= 0) {
                out[id >> 5] |= uint32_t{1} << (id & 31);
            } else {
                out[id >> 5] &= ~(uint32_t{1} << (id & 31));
            }
        }
        if (a.called && trie.has_children(i)) {
            bool eq = tq >= 0 && (flags[tq] & kAccept);
            bool er = tr >= 0 && (flags[tr] & kAccept);
            if (eq && !er) added.push_back(i);
            if (er && !eq) removed.push_back(i);
        }
        sq[d] = tq < 0 ? -1 : tq - base;
        sr[d] = tr < 0 ? -1 : tr - base;
        ++i;
    }
    bits.swap(out);
    exit_nodes.clear();
    std::sort(removed.begin(), removed.end());
    for (int32_t e : ref->exit_nodes) {
        if (!std::binary_search(removed.begin(), removed.end(), e)) exit_nodes.push_back(e);
    }
    exit_nodes.insert(exit_nodes.end(), added.begin(), added.end());
    return true;
}

const StateMask& CompiledGrammarImpl::state_mask(int32_t s) const {
    if (s >= real_states_) {
        int32_t ai = automaton_index(s);
        const Automaton& a = automata[ai];
        uint64_t key = class_key(a, s - a.base);
        ClassMaskCache& cache = *class_caches[ai];
        if (const StateMask* m = cache.get(key)) return *m;
        auto t0 = std::chrono::steady_clock::now();
        auto mask = build_counted_mask(a, s - a.base);
        mask->build_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        return *cache.publish(key, std::move(mask));
    }
    int32_t ai = state_automaton[s];
    const Automaton& a = automata[ai];
    const MaskTable& table = *tables[ai];
    if (const StateMask* m = table.get(s - a.base)) return *m;

    auto t0 = std::chrono::steady_clock::now();
    const TokenTrie& trie = vocab->trie();
    int32_t words = vocab->mask_words();
    std::vector<uint32_t> bits(words, 0);
    std::vector<int32_t> exit_nodes;
    if (!(flags[s] & kReachCalls) && delta_walk(s, bits, exit_nodes)) {
        // Derived from a neighbouring state's mask.
    } else if (!(flags[s] & kReachCalls)) {
        // Plain DFA walk: no calls can happen before leaving the rule.
        const int32_t* tab = next.data() + a.next_off;
        int32_t nc = a.num_classes, base = a.base, n = trie.size();
        const uint8_t* cls = a.cls.data();
        std::vector<int32_t> st(trie.max_depth + 1);
        st[0] = s - base;
        for (int32_t i = 1; i < n;) {
            int32_t d = trie.depth[i];
            int32_t t = tab[st[d - 1] * nc + cls[trie.byte[i]]];
            if (t < 0) {
                i = trie.end[i];
                continue;
            }
            st[d] = t - base;
            set_tokens(trie, i, bits.data());
            if (a.called && (flags[t] & kAccept) && trie.has_children(i)) exit_nodes.push_back(i);
            ++i;
        }
    } else {
        StackPool pool;
        Stepper stepper(*this, pool);
        walk_generic(trie, {Pos{s, kExitParent}}, stepper, bits.data(), a.called ? &exit_nodes : nullptr);
    }
    auto mask = finish_mask(trie, words, bits, exit_nodes);
    mask->build_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return *table.publish(s - a.base, std::move(mask));
}

void CompiledGrammarImpl::compute_min_finish() const {
    constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
    int32_t S = real_states_;
    min_finish_.assign(S, kInf);
    for (int32_t s = 0; s < S; ++s) {
        if (flags[s] & kAccept) min_finish_[s] = 0;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = S - 1; s >= 0; --s) {
            int64_t best = min_finish_[s];
            for (int b = 0; b < 256; ++b) {
                int32_t t = step(s, static_cast<uint8_t>(b));
                if (t >= 0 && min_finish_[t] + 1 < best) best = min_finish_[t] + 1;
            }
            for (int32_t i = call_off[s]; i < call_off[s + 1]; ++i) {
                int32_t start = automata[calls[i].callee].start;
                int64_t callee = start < real_states_ ? min_finish_[start] : virtual_min_finish(start);
                int64_t c = callee + min_finish_[calls[i].ret];
                if (c < best) best = c;
            }
            if (best < min_finish_[s]) {
                min_finish_[s] = best;
                changed = true;
            }
        }
    }
}

int64_t CompiledGrammarImpl::virtual_min_finish(int32_t s) const {
    const Automaton& a = automata[automaton_index(s)];
    const CountedString& cs = *a.counted;
    int32_t v = s - a.base;
    if (v == 1) return 0;
    if (v == 0) return 2 + std::max<int64_t>(cs.min_length, cs.min_chars[cs.content.start]);
    int64_t c = (v - 2) / cs.content.num_states;
    int32_t d = (v - 2) % cs.content.num_states;
    return 1 + std::max<int64_t>(cs.min_chars[d], cs.min_length - c);
}

int64_t CompiledGrammarImpl::min_finish(int32_t s) const {
    if (s >= real_states_) return virtual_min_finish(s);
    std::call_once(min_finish_once_, [this] { compute_min_finish(); });
    return min_finish_[s];
}

}  // namespace deepinfer::grammar
