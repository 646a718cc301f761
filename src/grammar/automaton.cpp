#include "grammar/automaton.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>

#include "deepinfer/error.h"

namespace deepinfer::grammar {
namespace {

using Clock = std::chrono::steady_clock;

void check_deadline(const BuildLimits& limits) {
    DI_CHECK(Clock::now() < limits.deadline, "grammar compile exceeded its time limit");
}

// ---------------------------------------------------------------------------------------------
// Rule graph: which rules are recursive, and which are inlined into their callers.

struct RuleRefs {
    std::vector<std::vector<int32_t>> all;   // every referenced rule (with repeats), per rule
    std::vector<std::vector<int32_t>> tail;  // references in tail position (end == rule end), distinct
    std::vector<std::vector<std::pair<int32_t, int64_t>>> non_tail;  // (rule, multiplicity)
    std::vector<int64_t> own;  // NFA states for the body itself, refs counted as 1
};

int64_t sat_add(int64_t a, int64_t b) { return std::min<int64_t>(a + b, int64_t{1} << 50); }
int64_t sat_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a > (int64_t{1} << 50) / b) return int64_t{1} << 50;
    return a * b;
}

void collect_refs(const Grammar& g, int32_t id, bool tail, int64_t mult, int32_t rule, RuleRefs& refs) {
    const Expr& e = g.expr(id);
    switch (e.kind) {
        case ExprKind::kBytes:
            refs.own[rule] = sat_add(refs.own[rule], sat_mul(mult, std::max<int64_t>(1, e.bytes.size())));
            break;
        case ExprKind::kByteSet:
            refs.own[rule] = sat_add(refs.own[rule], mult);
            break;
        case ExprKind::kChars:
            refs.own[rule] = sat_add(refs.own[rule], sat_mul(mult, 3 * static_cast<int64_t>(e.chars.ranges().size())));
            break;
        case ExprKind::kSeq:
            for (size_t i = 0; i < e.kids.size(); ++i) {
                collect_refs(g, e.kids[i], tail && i + 1 == e.kids.size(), mult, rule, refs);
            }
            refs.own[rule] = sat_add(refs.own[rule], sat_mul(mult, static_cast<int64_t>(e.kids.size())));
            break;
        case ExprKind::kAlt:
            for (int32_t k : e.kids) collect_refs(g, k, tail, mult, rule, refs);
            break;
        case ExprKind::kRepeat: {
            int64_t copies = e.max == kUnbounded ? std::max(e.min, 1) : e.max;
            collect_refs(g, e.kids[0], false, sat_mul(mult, copies), rule, refs);
            refs.own[rule] = sat_add(refs.own[rule], sat_mul(mult, copies + 1));
            break;
        }
        case ExprKind::kDfa:
            refs.own[rule] = sat_add(refs.own[rule], sat_mul(mult, e.dfa->num_states));
            break;
        case ExprKind::kRef:
            refs.all[rule].push_back(e.rule);
            if (tail && mult == 1) {
                if (std::find(refs.tail[rule].begin(), refs.tail[rule].end(), e.rule) == refs.tail[rule].end()) {
                    refs.tail[rule].push_back(e.rule);
                }
            } else {
                refs.non_tail[rule].push_back({e.rule, mult});
            }
            break;
    }
}

// Tarjan's SCC; a rule is recursive when its component has several rules or a self reference.
std::vector<char> find_recursive(const RuleRefs& refs, int32_t n) {
    std::vector<int32_t> index(n, -1), low(n, 0), stack;
    std::vector<char> on_stack(n, 0), recursive(n, 0);
    int32_t counter = 0;
    std::function<void(int32_t)> visit = [&](int32_t v) {
        index[v] = low[v] = counter++;
        stack.push_back(v);
        on_stack[v] = 1;
        for (int32_t w : refs.all[v]) {
            if (index[w] < 0) {
                visit(w);
                low[v] = std::min(low[v], low[w]);
            } else if (on_stack[w]) {
                low[v] = std::min(low[v], index[w]);
            }
        }
        if (low[v] == index[v]) {
            std::vector<int32_t> comp;
            int32_t w;
            do {
                w = stack.back();
                stack.pop_back();
                on_stack[w] = 0;
                comp.push_back(w);
            } while (w != v);
            bool self = std::find(refs.all[v].begin(), refs.all[v].end(), v) != refs.all[v].end();
            if (comp.size() > 1 || self) {
                for (int32_t c : comp) recursive[c] = 1;
            }
        }
    };
    for (int32_t v = 0; v < n; ++v) {
        if (index[v] < 0) visit(v);
    }
    return recursive;
}

// Decides per rule whether references to it are inlined. Estimated size of an inlined rule: its own
// body, plus each non-tail reference (copied per use), plus each rule in its tail closure once
// (tail references with the same end share one NFA fragment).
std::vector<char> decide_inline(const Grammar& g, const RuleRefs& refs, const std::vector<char>& recursive,
                                const BuildLimits& limits) {
    int32_t n = g.num_rules();
    std::vector<char> candidate(n), inl(n, 0);
    for (int32_t r = 0; r < n; ++r) candidate[r] = !recursive[r] && !g.rule(r).separate;
    // How many copies inlining a rule would make: references from every rule, with repeat multiplicity.
    std::vector<int64_t> uses(n, 0);
    for (int32_t r = 0; r < n; ++r) {
        for (int32_t y : refs.tail[r]) uses[y] = sat_add(uses[y], 1);
        for (auto [y, mult] : refs.non_tail[r]) uses[y] = sat_add(uses[y], mult);
    }
    std::vector<int64_t> base(n, -1), est(n, -1);
    std::function<int64_t(int32_t)> estimate;
    std::function<int64_t(int32_t)> base_of = [&](int32_t r) -> int64_t {
        if (base[r] >= 0) return base[r];
        int64_t b = refs.own[r];
        for (auto [y, mult] : refs.non_tail[r]) b = sat_add(b, sat_mul(mult, estimate(y)));
        return base[r] = b;
    };
    estimate = [&](int32_t r) -> int64_t {  // cost of referencing r from another rule
        if (!candidate[r]) return 1;
        if (est[r] >= 0) return est[r];
        // Tail closure over inlinable rules.
        std::vector<int32_t> todo{r}, seen{r};
        int64_t total = 0;
        while (!todo.empty()) {
            int32_t x = todo.back();
            todo.pop_back();
            total = sat_add(total, base_of(x));
            for (int32_t y : refs.tail[x]) {
                if (!candidate[y] || std::find(seen.begin(), seen.end(), y) != seen.end()) continue;
                seen.push_back(y);
                todo.push_back(y);
            }
        }
        est[r] = total;
        inl[r] = total <= limits.inline_max_size &&
                 sat_mul(total, std::max<int64_t>(uses[r], 1)) <= 16 * limits.inline_max_size;
        if (!inl[r]) est[r] = 1;  // referenced as a call
        return est[r];
    };
    for (int32_t r = 0; r < n; ++r) estimate(r);
    return inl;
}

// ---------------------------------------------------------------------------------------------
// NFA

// Built as flat edge lists, then compacted into per-state ranges (CSR) for determinization.
struct Nfa {
    struct Edge {
        int32_t from;
        uint8_t lo, hi;
        int32_t to;
    };
    struct CallEdge {
        int32_t from;
        int32_t callee;  // IR rule id
        int32_t to;
    };
    std::vector<std::pair<int32_t, int32_t>> eps;  // (from, to)
    std::vector<Edge> edges;
    std::vector<CallEdge> calls;
    int32_t num_states = 0;
    int32_t start = 0, final = 0;
    // CSR views, filled by compact().
    std::vector<int32_t> eps_off, eps_to, edge_off, call_off;

    int32_t add_state() { return num_states++; }
    int32_t size() const { return num_states; }
    void add_eps(int32_t from, int32_t to) { eps.push_back({from, to}); }
    void add_edge(int32_t from, uint8_t lo, uint8_t hi, int32_t to) { edges.push_back({from, lo, hi, to}); }
    void add_call(int32_t from, int32_t callee, int32_t to) { calls.push_back({from, callee, to}); }

    void compact() {
        auto by_from = [](auto& v, std::vector<int32_t>& off, int32_t n, auto from) {
            off.assign(n + 1, 0);
            for (const auto& x : v) off[from(x) + 1]++;
            for (int32_t i = 0; i < n; ++i) off[i + 1] += off[i];
            std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return from(a) < from(b); });
        };
        by_from(eps, eps_off, num_states, [](const std::pair<int32_t, int32_t>& e) { return e.first; });
        eps_to.resize(eps.size());
        for (size_t i = 0; i < eps.size(); ++i) eps_to[i] = eps[i].second;
        by_from(edges, edge_off, num_states, [](const Edge& e) { return e.from; });
        by_from(calls, call_off, num_states, [](const CallEdge& e) { return e.from; });
    }
};

class NfaBuilder {
public:
    NfaBuilder(const Grammar& g, const std::vector<char>& inl, Nfa& nfa, const BuildLimits& limits)
        : g_(g), inl_(inl), nfa_(nfa), limits_(limits) {}

    // Regular-language mode (expr_to_dfa): every reference is inlined; recursive rules (flagged in
    // `recursive`) and counted strings are spelled out exactly or, when over-approximating, replaced
    // by a superset (any bytes / the unbounded string).
    void set_regular_mode(RegularMode mode, const std::vector<char>* recursive) {
        regular_ = true;
        mode_ = mode;
        recursive_ = recursive;
    }

    // Adds paths from `from` to `to` spelling `id`. Never adds edges into `from` or out of `to`,
    // so alternatives may share their end points.
    void build(int32_t id, int32_t from, int32_t to) {
        if (nfa_.size() > limits_.max_states * 8) {
            DI_THROW("grammar too large: more than ", limits_.max_states * 8, " automaton states (limit max_states)");
        }
        if ((++ops_ & 4095) == 0) check_deadline(limits_);
        const Expr& e = g_.expr(id);
        switch (e.kind) {
            case ExprKind::kBytes: {
                if (e.bytes.empty()) {
                    nfa_.add_eps(from, to);
                    return;
                }
                int32_t cur = from;
                for (size_t i = 0; i < e.bytes.size(); ++i) {
                    int32_t nxt = i + 1 == e.bytes.size() ? to : nfa_.add_state();
                    uint8_t b = static_cast<uint8_t>(e.bytes[i]);
                    nfa_.add_edge(cur, b, b, nxt);
                    cur = nxt;
                }
                return;
            }
            case ExprKind::kByteSet:
                for (int b = 0; b < 256; ++b) {
                    if (!e.byteset.test(static_cast<uint8_t>(b))) continue;
                    int end = b;
                    while (end + 1 < 256 && e.byteset.test(static_cast<uint8_t>(end + 1))) ++end;
                    nfa_.add_edge(from, static_cast<uint8_t>(b), static_cast<uint8_t>(end), to);
                    b = end;
                }
                return;
            case ExprKind::kChars:
                build_chars(e.chars, from, to);
                return;
            case ExprKind::kSeq: {
                int32_t cur = from;
                for (size_t i = 0; i < e.kids.size(); ++i) {
                    int32_t nxt = i + 1 == e.kids.size() ? to : nfa_.add_state();
                    build(e.kids[i], cur, nxt);
                    cur = nxt;
                }
                return;
            }
            case ExprKind::kAlt:
                for (int32_t k : e.kids) build(k, from, to);
                return;
            case ExprKind::kRepeat: {
                int32_t kid = e.kids[0];
                int32_t cur = from;
                for (int32_t i = 0; i < e.min; ++i) {
                    int32_t nxt = (i + 1 == e.min && e.max == e.min) ? to : nfa_.add_state();
                    build(kid, cur, nxt);
                    cur = nxt;
                }
                if (e.max == e.min) return;
                if (e.max == kUnbounded) {
                    int32_t loop = nfa_.add_state(), back = nfa_.add_state();
                    nfa_.add_eps(cur, loop);
                    build(kid, loop, back);
                    nfa_.add_eps(back, loop);
                    nfa_.add_eps(loop, to);
                    return;
                }
                for (int32_t i = e.min; i < e.max; ++i) {
                    nfa_.add_eps(cur, to);
                    int32_t nxt = i + 1 == e.max ? to : nfa_.add_state();
                    build(kid, cur, nxt);
                    cur = nxt;
                }
                return;
            }
            case ExprKind::kDfa: {
                const ByteDfa& d = *e.dfa;
                int32_t base = nfa_.size();
                for (int32_t i = 0; i < d.num_states; ++i) nfa_.add_state();
                nfa_.add_eps(from, base + d.start);
                for (int32_t i = 0; i < d.num_states; ++i) {
                    if (d.accept[i]) nfa_.add_eps(base + i, to);
                    const int32_t* row = d.next.data() + static_cast<size_t>(i) * 256;
                    for (int b = 0; b < 256;) {
                        int32_t t = row[b];
                        int end = b;
                        while (end + 1 < 256 && row[end + 1] == t) ++end;
                        if (t >= 0)
                            nfa_.add_edge(base + i, static_cast<uint8_t>(b), static_cast<uint8_t>(end), base + t);
                        b = end + 1;
                    }
                }
                return;
            }
            case ExprKind::kRef: {
                int32_t r = e.rule;
                DI_CHECK(g_.rule(r).body >= 0, "rule '", g_.rule(r).name, "' is used but never defined");
                if (regular_ && g_.rule(r).counted) {
                    build_counted(*g_.rule(r).counted, from, to);
                    return;
                }
                if (regular_ && (*recursive_)[r]) {
                    DI_CHECK(mode_ == RegularMode::kOverApproximate, "rule '", g_.rule(r).name,
                             "' is recursive where a regular language is needed");
                    int32_t loop = nfa_.add_state();  // any bytes: a superset of the rule's language
                    nfa_.add_eps(from, loop);
                    nfa_.add_edge(loop, 0, 255, loop);
                    nfa_.add_eps(loop, to);
                    return;
                }
                if (!inl_[r]) {
                    nfa_.add_call(from, r, to);
                    return;
                }
                auto key = std::make_pair(r, to);
                auto it = memo_.find(key);
                if (it == memo_.end()) {
                    int32_t entry = nfa_.add_state();
                    memo_[key] = entry;
                    build(g_.rule(r).body, entry, to);
                    it = memo_.find(key);
                }
                nfa_.add_eps(from, it->second);
                return;
            }
        }
    }

private:
    // '"' content '"' with the count bounds spelled out (exact mode), or unbounded (over-approximation).
    void build_counted(const CountedString& cs, int32_t from, int32_t to) {
        const ByteDfa& c = cs.content;
        int32_t k = c.num_states;
        bool exact = mode_ == RegularMode::kExact;
        int64_t levels = exact ? (cs.max_length >= 0 ? cs.max_length : cs.min_length) + 1 : 1;
        DI_CHECK(levels * k <= 100000, "string length bounds too large to spell out");
        int32_t base = nfa_.size();
        for (int64_t i = 0; i < levels * k; ++i) nfa_.add_state();
        auto id = [&](int64_t level, int32_t d) { return static_cast<int32_t>(base + level * k + d); };
        nfa_.add_edge(from, '"', '"', id(0, c.start));
        for (int64_t level = 0; level < levels; ++level) {
            for (int32_t d = 0; d < k; ++d) {
                bool count_ok = !exact || (level >= cs.min_length && (cs.max_length < 0 || level <= cs.max_length));
                if (c.accept[d] && count_ok) nfa_.add_edge(id(level, d), '"', '"', to);
                for (int b = 0; b < 256; ++b) {
                    int32_t t = c.next[static_cast<size_t>(d) * 256 + b];
                    if (t < 0) continue;
                    int64_t nl = exact ? level + cs.boundary[t] : 0;
                    if (exact && cs.max_length < 0) nl = std::min<int64_t>(nl, cs.min_length);
                    if (nl >= levels) continue;
                    nfa_.add_edge(id(level, d), static_cast<uint8_t>(b), static_cast<uint8_t>(b), id(nl, t));
                }
            }
        }
    }

    void build_chars(const CharSet& set, int32_t from, int32_t to) {
        // Share prefixes of the UTF-8 byte-range sequences: (state, lo, hi) -> next state.
        std::map<std::tuple<int32_t, uint8_t, uint8_t>, int32_t> shared;
        for (const auto& r : set.ranges()) {
            for (const auto& seq : utf8_sequences(r.lo, r.hi)) {
                int32_t cur = from;
                for (size_t i = 0; i < seq.size(); ++i) {
                    if (i + 1 == seq.size()) {
                        nfa_.add_edge(cur, seq[i].lo, seq[i].hi, to);
                        break;
                    }
                    auto key = std::make_tuple(cur, seq[i].lo, seq[i].hi);
                    auto it = shared.find(key);
                    if (it == shared.end()) {
                        int32_t nxt = nfa_.add_state();
                        nfa_.add_edge(cur, seq[i].lo, seq[i].hi, nxt);
                        it = shared.emplace(key, nxt).first;
                    }
                    cur = it->second;
                }
            }
        }
    }

    const Grammar& g_;
    const std::vector<char>& inl_;
    Nfa& nfa_;
    const BuildLimits& limits_;
    std::map<std::pair<int32_t, int32_t>, int32_t> memo_;
    int64_t ops_ = 0;
    bool regular_ = false;
    RegularMode mode_ = RegularMode::kExact;
    const std::vector<char>* recursive_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Subset construction

// Raw DFA whose call edges name IR rules (mapped to automaton indices later).
Dfa determinize(Nfa& nfa, int64_t& state_budget, const BuildLimits& limits) {
    nfa.compact();
    Dfa dfa;
    // Byte classes: bytes no edge distinguishes share a class.
    std::array<char, 257> boundary{};
    boundary[0] = 1;
    for (const auto& e : nfa.edges) {
        boundary[e.lo] = 1;
        boundary[e.hi + 1] = 1;
    }
    int32_t cls = -1;
    for (int b = 0; b < 256; ++b) {
        if (boundary[b]) ++cls;
        dfa.byte_class[b] = static_cast<uint8_t>(cls);
    }
    dfa.num_classes = cls + 1;
    const int32_t nc = dfa.num_classes;
    const int32_t n = nfa.size();

    // Only states with edges or calls, and the final state, matter inside a subset.
    std::vector<char> relevant(n, 0);
    for (int32_t s = 0; s < n; ++s) {
        relevant[s] = nfa.edge_off[s + 1] > nfa.edge_off[s] || nfa.call_off[s + 1] > nfa.call_off[s] || s == nfa.final;
    }
    std::vector<uint32_t> stamp(n, 0);
    uint32_t gen = 0;
    std::vector<int32_t> work;
    // In: seeds (any order, may repeat). Out: sorted relevant states of the epsilon closure.
    auto closure = [&](const int32_t* seeds, size_t count, std::vector<int32_t>& out) {
        ++gen;
        work.clear();
        out.clear();
        for (size_t i = 0; i < count; ++i) {
            int32_t s = seeds[i];
            if (stamp[s] != gen) {
                stamp[s] = gen;
                work.push_back(s);
            }
        }
        while (!work.empty()) {
            int32_t s = work.back();
            work.pop_back();
            if (relevant[s]) out.push_back(s);
            for (int32_t k = nfa.eps_off[s]; k < nfa.eps_off[s + 1]; ++k) {
                int32_t t = nfa.eps_to[k];
                if (stamp[t] != gen) {
                    stamp[t] = gen;
                    work.push_back(t);
                }
            }
        }
        std::sort(out.begin(), out.end());
    };

    // Subsets in one pool; an open-addressing table maps their contents to ids.
    std::vector<int32_t> pool;
    std::vector<int64_t> off{0};
    std::vector<uint64_t> hashes;
    std::vector<int32_t> table(1024, -1);
    auto hash_of = [](const std::vector<int32_t>& v) {
        uint64_t h = 1469598103934665603ull ^ v.size();
        for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
        return h ^ (h >> 29);
    };
    auto intern = [&](const std::vector<int32_t>& set) -> int32_t {
        uint64_t h = hash_of(set);
        size_t mask = table.size() - 1;
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            int32_t id = table[i];
            if (id < 0) break;
            if (hashes[id] == h && off[id + 1] - off[id] == static_cast<int64_t>(set.size()) &&
                std::equal(set.begin(), set.end(), pool.begin() + off[id])) {
                return id;
            }
        }
        DI_CHECK(--state_budget >= 0, "grammar too large: more than ", limits.max_states,
                 " DFA states (limit max_states)");
        int32_t id = static_cast<int32_t>(hashes.size());
        pool.insert(pool.end(), set.begin(), set.end());
        off.push_back(static_cast<int64_t>(pool.size()));
        hashes.push_back(h);
        if (hashes.size() * 2 > table.size()) {
            table.assign(table.size() * 2, -1);
            mask = table.size() - 1;
            for (int32_t j = 0; j < static_cast<int32_t>(hashes.size()); ++j) {
                size_t i = hashes[j] & mask;
                while (table[i] >= 0) i = (i + 1) & mask;
                table[i] = j;
            }
        } else {
            size_t i = h & mask;
            while (table[i] >= 0) i = (i + 1) & mask;
            table[i] = id;
        }
        dfa.next.resize(hashes.size() * nc, -1);
        dfa.accept.push_back(0);
        dfa.calls.emplace_back();
        return id;
    };
    std::vector<int32_t> set, seeds;
    int32_t init = nfa.start;
    closure(&init, 1, set);
    dfa.start = intern(set);

    std::vector<std::pair<int32_t, int32_t>> moves;  // (class or callee, target)
    // For each key of `moves`, in ascending order: the DFA state of the closure of its targets.
    auto for_each_key = [&](auto&& emit) {
        std::sort(moves.begin(), moves.end());
        for (size_t i = 0; i < moves.size();) {
            size_t j = i;
            seeds.clear();
            while (j < moves.size() && moves[j].first == moves[i].first) seeds.push_back(moves[j++].second);
            closure(seeds.data(), seeds.size(), set);
            emit(moves[i].first, intern(set));
            i = j;
        }
    };
    for (int32_t d = 0; d < static_cast<int32_t>(hashes.size()); ++d) {
        if ((d & 255) == 0) check_deadline(limits);
        moves.clear();
        bool accept = false;
        for (int64_t k = off[d]; k < off[d + 1]; ++k) {
            int32_t s = pool[k];
            if (s == nfa.final) accept = true;
            for (int32_t j = nfa.edge_off[s]; j < nfa.edge_off[s + 1]; ++j) {
                const Nfa::Edge& e = nfa.edges[j];
                for (int c = dfa.byte_class[e.lo]; c <= dfa.byte_class[e.hi]; ++c) moves.push_back({c, e.to});
            }
        }
        dfa.accept[d] = accept;
        for_each_key([&](int32_t cls, int32_t id) { dfa.next[static_cast<size_t>(d) * nc + cls] = id; });
        moves.clear();
        for (int64_t k = off[d]; k < off[d + 1]; ++k) {
            int32_t s = pool[k];
            for (int32_t j = nfa.call_off[s]; j < nfa.call_off[s + 1]; ++j)
                moves.push_back({nfa.calls[j].callee, nfa.calls[j].to});
        }
        for_each_key([&](int32_t callee, int32_t id) { dfa.calls[d].push_back({callee, id}); });
    }
    dfa.num_states = static_cast<int32_t>(hashes.size());
    return dfa;
}

// ---------------------------------------------------------------------------------------------
// Minimization: Valmari & Lehtinen's partition refinement for partial DFAs, O(m log n).

class RefinablePartition {
public:
    explicit RefinablePartition(int32_t n) : elems_(n), loc_(n), set_(n, 0), first_{0}, past_{n}, marked_{0} {
        for (int32_t i = 0; i < n; ++i) elems_[i] = loc_[i] = i;
        count_ = n > 0 ? 1 : 0;
    }
    // Regroups elements so that equal keys form one set each.
    void init_by_key(const std::vector<int64_t>& key) {
        int32_t n = static_cast<int32_t>(elems_.size());
        if (n == 0) return;
        std::sort(elems_.begin(), elems_.end(), [&](int32_t a, int32_t b) { return key[a] < key[b]; });
        first_.clear();
        past_.clear();
        marked_.clear();
        for (int32_t i = 0; i < n; ++i) {
            if (i == 0 || key[elems_[i]] != key[elems_[i - 1]]) {
                if (i) past_.push_back(i);
                first_.push_back(i);
                marked_.push_back(0);
            }
            set_[elems_[i]] = static_cast<int32_t>(first_.size()) - 1;
            loc_[elems_[i]] = i;
        }
        past_.push_back(n);
        count_ = static_cast<int32_t>(first_.size());
    }
    void mark(int32_t e) {
        int32_t s = set_[e], i = loc_[e], j = first_[s] + marked_[s];
        if (i < j) return;  // already marked
        elems_[i] = elems_[j];
        loc_[elems_[i]] = i;
        elems_[j] = e;
        loc_[e] = j;
        if (marked_[s]++ == 0) touched_.push_back(s);
    }
    void split() {
        while (!touched_.empty()) {
            int32_t s = touched_.back();
            touched_.pop_back();
            int32_t j = first_[s] + marked_[s];
            if (j == past_[s]) {
                marked_[s] = 0;
                continue;
            }
            // The smaller part becomes the new set.
            int32_t z = count_++;
            first_.push_back(0);
            past_.push_back(0);
            marked_.push_back(0);
            if (marked_[s] <= past_[s] - j) {
                first_[z] = first_[s];
                past_[z] = first_[s] = j;
            } else {
                past_[z] = past_[s];
                first_[z] = past_[s] = j;
            }
            for (int32_t i = first_[z]; i < past_[z]; ++i) set_[elems_[i]] = z;
            marked_[s] = marked_[z] = 0;
        }
    }
    int32_t count() const { return count_; }
    int32_t set_of(int32_t e) const { return set_[e]; }
    int32_t first(int32_t s) const { return first_[s]; }
    int32_t past(int32_t s) const { return past_[s]; }
    int32_t elem(int32_t i) const { return elems_[i]; }

private:
    std::vector<int32_t> elems_, loc_, set_, first_, past_, marked_, touched_;
    int32_t count_ = 0;
};

// Returns the minimal DFA equivalent to `dfa` (all states reachable and co-reachable).
Dfa minimize(const Dfa& dfa) {
    int32_t n = dfa.num_states, nc = dfa.num_classes;
    if (n <= 1) return dfa;
    struct Trans {
        int32_t from;
        int64_t label;  // byte class, or nc + callee
        int32_t to;
    };
    std::vector<Trans> trans;
    for (int32_t s = 0; s < n; ++s) {
        for (int32_t c = 0; c < nc; ++c) {
            int32_t t = dfa.next[s * nc + c];
            if (t >= 0) trans.push_back({s, c, t});
        }
        for (const auto& call : dfa.calls[s]) trans.push_back({s, int64_t{nc} + call.callee, call.ret});
    }
    int32_t m = static_cast<int32_t>(trans.size());
    RefinablePartition blocks(n), cords(m);
    std::vector<int64_t> key(n);
    for (int32_t s = 0; s < n; ++s) key[s] = dfa.accept[s];
    blocks.init_by_key(key);
    std::vector<int64_t> tkey(m);
    for (int32_t t = 0; t < m; ++t) tkey[t] = trans[t].label;
    cords.init_by_key(tkey);
    // Incoming transitions per state.
    std::vector<int32_t> in_first(n + 1, 0), in_list(m);
    for (const auto& t : trans) in_first[t.to + 1]++;
    for (int32_t s = 0; s < n; ++s) in_first[s + 1] += in_first[s];
    {
        std::vector<int32_t> pos(in_first.begin(), in_first.end() - 1);
        for (int32_t t = 0; t < m; ++t) in_list[pos[trans[t].to]++] = t;
    }
    int32_t b = 1, c = 0;
    while (c < cords.count()) {
        for (int32_t i = cords.first(c); i < cords.past(c); ++i) blocks.mark(trans[cords.elem(i)].from);
        blocks.split();
        ++c;
        while (b < blocks.count()) {
            for (int32_t i = blocks.first(b); i < blocks.past(b); ++i) {
                int32_t s = blocks.elem(i);
                for (int32_t j = in_first[s]; j < in_first[s + 1]; ++j) cords.mark(in_list[j]);
            }
            cords.split();
            ++b;
        }
    }
    if (blocks.count() == n) return dfa;
    Dfa out;
    out.name = dfa.name;
    out.separate = dfa.separate;
    out.num_classes = nc;
    out.byte_class = dfa.byte_class;
    // Renumber blocks so that the start block is 0 and the order is deterministic (BFS).
    std::vector<int32_t> block_id(blocks.count(), -1);
    std::vector<int32_t> order;
    std::deque<int32_t> q{dfa.start};
    block_id[blocks.set_of(dfa.start)] = 0;
    order.push_back(dfa.start);
    while (!q.empty()) {
        int32_t s = q.front();
        q.pop_front();
        auto visit = [&](int32_t t) {
            int32_t bt = blocks.set_of(t);
            if (block_id[bt] < 0) {
                block_id[bt] = static_cast<int32_t>(order.size());
                order.push_back(t);
                q.push_back(t);
            }
        };
        for (int32_t cc = 0; cc < nc; ++cc) {
            int32_t t = dfa.next[s * nc + cc];
            if (t >= 0) visit(t);
        }
        for (const auto& call : dfa.calls[s]) visit(call.ret);
    }
    out.num_states = static_cast<int32_t>(order.size());
    out.start = 0;
    out.next.assign(static_cast<size_t>(out.num_states) * nc, -1);
    out.accept.resize(out.num_states);
    out.calls.resize(out.num_states);
    for (int32_t i = 0; i < out.num_states; ++i) {
        int32_t s = order[i];
        out.accept[i] = dfa.accept[s];
        for (int32_t cc = 0; cc < nc; ++cc) {
            int32_t t = dfa.next[s * nc + cc];
            if (t >= 0) out.next[i * nc + cc] = block_id[blocks.set_of(t)];
        }
        for (const auto& call : dfa.calls[s]) out.calls[i].push_back({call.callee, block_id[blocks.set_of(call.ret)]});
    }
    return out;
}

// States from which an accepting state can be reached, given each state's predecessors.
std::vector<char> co_reachable(const std::vector<std::vector<int32_t>>& rev, const std::vector<uint8_t>& accept) {
    const auto n = static_cast<int32_t>(rev.size());
    std::vector<char> live(n, 0);
    std::vector<int32_t> todo;
    for (int32_t s = 0; s < n; ++s) {
        if (accept[s]) {
            live[s] = 1;
            todo.push_back(s);
        }
    }
    while (!todo.empty()) {
        const int32_t s = todo.back();
        todo.pop_back();
        for (int32_t p : rev[s]) {
            if (!live[p]) {
                live[p] = 1;
                todo.push_back(p);
            }
        }
    }
    return live;
}

// Keeps only states reachable from the start and able to reach an accepting state, given which
// callees can produce something. Returns false when the start state itself is dead.
bool prune(Dfa& dfa, const std::vector<char>& productive) {
    int32_t n = dfa.num_states, nc = dfa.num_classes;
    for (auto& cs : dfa.calls) {
        cs.erase(std::remove_if(cs.begin(), cs.end(), [&](const Dfa::Call& c) { return !productive[c.callee]; }),
                 cs.end());
    }
    // Co-reachability (backwards from accepting states).
    std::vector<std::vector<int32_t>> rev(n);
    for (int32_t s = 0; s < n; ++s) {
        for (int32_t c = 0; c < nc; ++c) {
            int32_t t = dfa.next[s * nc + c];
            if (t >= 0) rev[t].push_back(s);
        }
        for (const auto& call : dfa.calls[s]) rev[call.ret].push_back(s);
    }
    const std::vector<char> live = co_reachable(rev, dfa.accept);
    if (!live[dfa.start]) return false;
    // Reachability over live states, renumbering in BFS order.
    std::vector<int32_t> id(n, -1), order{dfa.start};
    id[dfa.start] = 0;
    for (size_t i = 0; i < order.size(); ++i) {
        int32_t s = order[i];
        auto visit = [&](int32_t t) {
            if (t >= 0 && live[t] && id[t] < 0) {
                id[t] = static_cast<int32_t>(order.size());
                order.push_back(t);
            }
        };
        for (int32_t c = 0; c < nc; ++c) visit(dfa.next[s * nc + c]);
        for (const auto& call : dfa.calls[s]) visit(call.ret);
    }
    int32_t m = static_cast<int32_t>(order.size());
    std::vector<int32_t> next(static_cast<size_t>(m) * nc, -1);
    std::vector<uint8_t> accept(m);
    std::vector<std::vector<Dfa::Call>> calls(m);
    for (int32_t i = 0; i < m; ++i) {
        int32_t s = order[i];
        accept[i] = dfa.accept[s];
        for (int32_t c = 0; c < nc; ++c) {
            int32_t t = dfa.next[s * nc + c];
            if (t >= 0 && live[t]) next[i * nc + c] = id[t];
        }
        for (const auto& call : dfa.calls[s]) {
            if (live[call.ret]) calls[i].push_back({call.callee, id[call.ret]});
        }
    }
    dfa.num_states = m;
    dfa.start = 0;
    dfa.next = std::move(next);
    dfa.accept = std::move(accept);
    dfa.calls = std::move(calls);
    return true;
}

// Can the DFA reach an accepting state from its start, given productive callees?
bool reaches_accept(const Dfa& dfa, const std::vector<char>& productive) {
    std::vector<char> seen(dfa.num_states, 0);
    std::vector<int32_t> todo{dfa.start};
    seen[dfa.start] = 1;
    while (!todo.empty()) {
        int32_t s = todo.back();
        todo.pop_back();
        if (dfa.accept[s]) return true;
        auto visit = [&](int32_t t) {
            if (t >= 0 && !seen[t]) {
                seen[t] = 1;
                todo.push_back(t);
            }
        };
        for (int32_t c = 0; c < dfa.num_classes; ++c) visit(dfa.next[s * dfa.num_classes + c]);
        for (const auto& call : dfa.calls[s]) {
            if (productive[call.callee]) visit(call.ret);
        }
    }
    return false;
}

void analyze(Automata& a) {
    auto& dfas = a.dfas;
    int32_t n = static_cast<int32_t>(dfas.size());
    // eps_accept and nullable: least fixpoint.
    for (auto& d : dfas) {
        d.eps_accept.assign(d.accept.begin(), d.accept.end());
        d.nullable = d.counted ? false : d.eps_accept[d.start];
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (auto& d : dfas) {
            for (bool local = true; local;) {
                local = false;
                for (int32_t s = 0; s < d.num_states; ++s) {
                    if (d.eps_accept[s]) continue;
                    for (const auto& call : d.calls[s]) {
                        if (dfas[call.callee].nullable && d.eps_accept[call.ret]) {
                            d.eps_accept[s] = 1;
                            local = changed = true;
                            break;
                        }
                    }
                }
            }
            if (!d.counted && d.eps_accept[d.start] && !d.nullable) {
                d.nullable = true;
                changed = true;
            }
        }
    }
    // Left recursion: rule X calls Y at a position reachable from X's start without consuming bytes.
    std::vector<std::vector<int32_t>> left(n);
    for (int32_t r = 0; r < n; ++r) {
        const Dfa& d = dfas[r];
        if (d.counted) continue;
        std::vector<char> seen(d.num_states, 0);
        std::vector<int32_t> todo{d.start};
        seen[d.start] = 1;
        while (!todo.empty()) {
            int32_t s = todo.back();
            todo.pop_back();
            for (const auto& call : d.calls[s]) {
                left[r].push_back(call.callee);
                if (dfas[call.callee].nullable && !seen[call.ret]) {
                    seen[call.ret] = 1;
                    todo.push_back(call.ret);
                }
            }
        }
    }
    {
        std::vector<int32_t> color(n, 0), path;
        std::function<void(int32_t)> dfs = [&](int32_t v) {
            color[v] = 1;
            path.push_back(v);
            for (int32_t w : left[v]) {
                if (color[w] == 1) {
                    std::string cycle;
                    auto it = std::find(path.begin(), path.end(), w);
                    for (; it != path.end(); ++it) cycle += dfas[*it].name + " -> ";
                    cycle += dfas[w].name;
                    DI_THROW("grammar is left-recursive (", cycle, "); rewrite the rule with repetition");
                }
                if (color[w] == 0) dfs(w);
            }
            path.pop_back();
            color[v] = 2;
        };
        for (int32_t r = 0; r < n; ++r) {
            if (color[r] == 0) dfs(r);
        }
    }
    // First bytes per state (within the rule, entering callees): least fixpoint.
    for (auto& d : dfas) {
        d.first.assign(d.num_states, ByteSet{});
        if (d.counted) d.rule_first.set('"');
    }
    auto rule_first = [&](const Dfa& d) -> const ByteSet& { return d.counted ? d.rule_first : d.first[d.start]; };
    // Own byte transitions first (per class), then propagate through calls until stable.
    for (auto& d : dfas) {
        if (d.counted) continue;
        std::vector<ByteSet> class_bytes(d.num_classes);
        for (int b = 0; b < 256; ++b) class_bytes[d.byte_class[b]].set(static_cast<uint8_t>(b));
        for (int32_t s = 0; s < d.num_states; ++s) {
            for (int32_t c = 0; c < d.num_classes; ++c) {
                if (d.next[static_cast<size_t>(s) * d.num_classes + c] >= 0) d.first[s] |= class_bytes[c];
            }
        }
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (auto& d : dfas) {
            for (int32_t s = d.num_states - 1; s >= 0; --s) {
                if (d.calls[s].empty()) continue;
                ByteSet f = d.first[s];
                for (const auto& call : d.calls[s]) {
                    const Dfa& callee = dfas[call.callee];
                    f |= rule_first(callee);
                    if (callee.nullable) f |= d.first[call.ret];
                }
                if (!(f == d.first[s])) {
                    d.first[s] = f;
                    changed = true;
                }
            }
        }
    }
    for (auto& d : dfas) {
        if (d.counted) continue;
        d.rule_first = d.first[d.start];
        // States from which some call edge is reachable.
        std::vector<std::vector<int32_t>> rev(d.num_states);
        d.reach_calls.assign(d.num_states, 0);
        std::vector<int32_t> todo;
        for (int32_t s = 0; s < d.num_states; ++s) {
            for (int32_t c = 0; c < d.num_classes; ++c) {
                int32_t t = d.next[s * d.num_classes + c];
                if (t >= 0) rev[t].push_back(s);
            }
            for (const auto& call : d.calls[s]) rev[call.ret].push_back(s);
            if (!d.calls[s].empty()) {
                d.reach_calls[s] = 1;
                todo.push_back(s);
            }
        }
        while (!todo.empty()) {
            int32_t s = todo.back();
            todo.pop_back();
            for (int32_t p : rev[s]) {
                if (!d.reach_calls[p]) {
                    d.reach_calls[p] = 1;
                    todo.push_back(p);
                }
            }
        }
    }
}

}  // namespace

Automata build_automata(const Grammar& g, const BuildLimits& limits) {
    int32_t n = g.num_rules();
    DI_CHECK(g.root() >= 0 && g.root() < n, "grammar has no root rule");
    for (int32_t r = 0; r < n; ++r) {
        DI_CHECK(g.rule(r).body >= 0, "rule '", g.rule(r).name, "' is used but never defined");
    }
    RuleRefs refs;
    refs.all.resize(n);
    refs.tail.resize(n);
    refs.non_tail.resize(n);
    refs.own.assign(n, 0);
    for (int32_t r = 0; r < n; ++r) collect_refs(g, g.rule(r).body, true, 1, r, refs);
    std::vector<char> recursive = find_recursive(refs, n);
    std::vector<char> inl = decide_inline(g, refs, recursive, limits);
    inl[g.root()] = 0;

    // Build a DFA per called rule, discovering callees from the root.
    Automata out;
    std::vector<int32_t> index_of(n, -1);
    std::vector<int32_t> rules;  // automaton index -> IR rule
    index_of[g.root()] = 0;
    rules.push_back(g.root());
    int64_t budget = limits.max_states;
    for (size_t i = 0; i < rules.size(); ++i) {
        check_deadline(limits);
        int32_t r = rules[i];
        if (g.rule(r).counted) {
            Dfa dfa;
            dfa.name = g.rule(r).name;
            dfa.separate = true;
            dfa.counted = g.rule(r).counted;
            out.dfas.push_back(std::move(dfa));
            continue;
        }
        Nfa nfa;
        nfa.start = nfa.add_state();
        nfa.final = nfa.add_state();
        NfaBuilder builder(g, inl, nfa, limits);
        builder.build(g.rule(r).body, nfa.start, nfa.final);
        out.nfa_states += nfa.size();
        Dfa dfa = determinize(nfa, budget, limits);
        dfa.name = g.rule(r).name;
        dfa.separate = g.rule(r).separate;
        for (auto& cs : dfa.calls) {
            for (auto& call : cs) {
                if (index_of[call.callee] < 0) {
                    index_of[call.callee] = static_cast<int32_t>(rules.size());
                    rules.push_back(call.callee);
                }
                call.callee = index_of[call.callee];
            }
        }
        out.dfas.push_back(std::move(dfa));
    }
    // Productive rules (least fixpoint), then prune dead states everywhere.
    int32_t m = static_cast<int32_t>(out.dfas.size());
    std::vector<char> productive(m, 0);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < m; ++i) {
            if (!productive[i] && (out.dfas[i].counted || reaches_accept(out.dfas[i], productive))) {
                productive[i] = 1;
                changed = true;
            }
        }
    }
    DI_CHECK(productive[0], "the grammar matches no string at all (rule '", out.dfas[0].name, "')");
    for (int32_t i = 0; i < m; ++i) {
        if (productive[i] && !out.dfas[i].counted) {
            bool ok = prune(out.dfas[i], productive);
            DI_ICHECK(ok, "productive rule lost its start state");
            out.dfas[i] = minimize(out.dfas[i]);
        }
    }
    // Drop automata no longer reachable from the root and renumber callees.
    std::vector<int32_t> keep_id(m, -1), keep{0};
    keep_id[0] = 0;
    for (size_t i = 0; i < keep.size(); ++i) {
        for (const auto& cs : out.dfas[keep[i]].calls) {
            for (const auto& call : cs) {
                if (keep_id[call.callee] < 0) {
                    keep_id[call.callee] = static_cast<int32_t>(keep.size());
                    keep.push_back(call.callee);
                }
            }
        }
    }
    std::vector<Dfa> kept;
    for (int32_t i : keep) kept.push_back(std::move(out.dfas[i]));
    for (auto& d : kept) {
        for (auto& cs : d.calls) {
            for (auto& call : cs) call.callee = keep_id[call.callee];
        }
    }
    out.dfas = std::move(kept);
    analyze(out);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Regular-language operations

namespace {

std::shared_ptr<ByteDfa> to_byte_dfa(const Dfa& d) {
    auto out = std::make_shared<ByteDfa>();
    out->num_states = d.num_states;
    out->start = d.start;
    out->accept = d.accept;
    out->next.assign(static_cast<size_t>(d.num_states) * 256, -1);
    for (int32_t s = 0; s < d.num_states; ++s) {
        for (int b = 0; b < 256; ++b) out->next[static_cast<size_t>(s) * 256 + b] = d.step(s, static_cast<uint8_t>(b));
    }
    return out;
}

Dfa from_byte_dfa(const ByteDfa& a) {
    Dfa d;
    // Byte classes: bytes with identical columns.
    std::map<std::vector<int32_t>, int32_t> columns;
    std::vector<int32_t> col(a.num_states);
    for (int b = 0; b < 256; ++b) {
        for (int32_t s = 0; s < a.num_states; ++s) col[s] = a.next[static_cast<size_t>(s) * 256 + b];
        auto it = columns.emplace(col, static_cast<int32_t>(columns.size())).first;
        d.byte_class[b] = static_cast<uint8_t>(it->second);
    }
    d.num_classes = static_cast<int32_t>(columns.size());
    d.num_states = a.num_states;
    d.start = a.start;
    d.accept = a.accept;
    d.calls.resize(a.num_states);
    d.next.assign(static_cast<size_t>(a.num_states) * d.num_classes, -1);
    for (int b = 0; b < 256; ++b) {
        for (int32_t s = 0; s < a.num_states; ++s) {
            d.next[s * d.num_classes + d.byte_class[b]] = a.next[static_cast<size_t>(s) * 256 + b];
        }
    }
    return d;
}

// Trims dead states and minimizes; an empty language gives a DFA with no states.
std::shared_ptr<const ByteDfa> finish(Dfa d) {
    std::vector<char> productive;  // no calls
    if (!prune(d, productive)) return std::make_shared<ByteDfa>();
    return to_byte_dfa(minimize(d));
}

// Numbers the state pairs of a product automaton in the order they are first reached.
struct StatePairs {
    explicit StatePairs(const BuildLimits& limits) : limits(limits) {}
    int32_t intern(int32_t x, int32_t y) {
        auto it = ids.find({x, y});
        if (it != ids.end()) return it->second;
        DI_CHECK(static_cast<int64_t>(pairs.size()) < limits.max_states, "grammar too large: more than ",
                 limits.max_states, " DFA states (limit max_states)");
        const auto id = static_cast<int32_t>(pairs.size());
        ids.emplace(std::make_pair(x, y), id);
        pairs.push_back({x, y});
        return id;
    }
    const BuildLimits& limits;
    std::map<std::pair<int32_t, int32_t>, int32_t> ids;
    std::vector<std::pair<int32_t, int32_t>> pairs;  // by id
};

std::shared_ptr<const ByteDfa> product(const ByteDfa& a, const ByteDfa& b, bool subtract, const BuildLimits& limits) {
    if (a.num_states == 0) return std::make_shared<ByteDfa>();
    StatePairs states(limits);
    auto& pairs = states.pairs;
    ByteDfa out;
    states.intern(a.start, b.num_states ? b.start : -1);
    for (size_t i = 0; i < pairs.size(); ++i) {
        if ((i & 255) == 0) check_deadline(limits);
        auto [x, y] = pairs[i];
        bool acc_a = a.accept[x], acc_b = y >= 0 && b.accept[y];
        out.accept.push_back(subtract ? (acc_a && !acc_b) : (acc_a && acc_b));
        out.next.resize(out.next.size() + 256, -1);
        for (int c = 0; c < 256; ++c) {
            int32_t tx = a.next[static_cast<size_t>(x) * 256 + c];
            if (tx < 0) continue;
            int32_t ty = y >= 0 ? b.next[static_cast<size_t>(y) * 256 + c] : -1;
            if (ty < 0 && !subtract) continue;
            int32_t t = states.intern(tx, ty);
            out.next[i * 256 + c] = t;
        }
    }
    out.num_states = static_cast<int32_t>(pairs.size());
    out.start = 0;
    return finish(from_byte_dfa(out));
}

}  // namespace

std::shared_ptr<const ByteDfa> expr_to_dfa(const Grammar& g, int32_t expr, const BuildLimits& limits,
                                           RegularMode mode) {
    int32_t n = g.num_rules();
    RuleRefs refs;
    refs.all.resize(n);
    refs.tail.resize(n);
    refs.non_tail.resize(n);
    refs.own.assign(n, 0);
    for (int32_t r = 0; r < n; ++r) {
        if (g.rule(r).body >= 0) collect_refs(g, g.rule(r).body, true, 1, r, refs);
    }
    std::vector<char> recursive = find_recursive(refs, n);
    std::vector<char> inl(n, 1);
    Nfa nfa;
    nfa.start = nfa.add_state();
    nfa.final = nfa.add_state();
    NfaBuilder builder(g, inl, nfa, limits);
    builder.set_regular_mode(mode, &recursive);
    builder.build(expr, nfa.start, nfa.final);
    int64_t budget = limits.max_states;
    return finish(determinize(nfa, budget, limits));
}

bool dfa_empty(const ByteDfa& a) { return a.num_states == 0; }

std::shared_ptr<const ByteDfa> dfa_intersect(const ByteDfa& a, const ByteDfa& b, const BuildLimits& limits) {
    if (b.num_states == 0) return std::make_shared<ByteDfa>();
    return product(a, b, false, limits);
}

std::shared_ptr<const ByteDfa> dfa_subtract(const ByteDfa& a, const ByteDfa& b, const BuildLimits& limits) {
    return product(a, b, true, limits);
}

std::shared_ptr<const CountedString> make_counted_string(const ByteDfa& content, const ByteDfa& jchar_star,
                                                         int64_t min_length, int64_t max_length,
                                                         const BuildLimits& limits) {
    constexpr int32_t kInf = CountedString::kUnboundedChars;
    auto out = std::make_shared<CountedString>();
    out->min_length = min_length;
    out->max_length = max_length;
    if (content.num_states == 0 || jchar_star.num_states == 0) return nullptr;
    // Product with the all-contents DFA, whose accepting states are exactly the character boundaries.
    StatePairs states(limits);
    auto& pairs = states.pairs;
    ByteDfa prod;
    states.intern(content.start, jchar_star.start);
    for (size_t i = 0; i < pairs.size(); ++i) {
        auto [x, y] = pairs[i];
        prod.accept.push_back(content.accept[x] && jchar_star.accept[y]);
        prod.next.resize(prod.next.size() + 256, -1);
        for (int c = 0; c < 256; ++c) {
            int32_t tx = content.next[static_cast<size_t>(x) * 256 + c];
            int32_t ty = jchar_star.next[static_cast<size_t>(y) * 256 + c];
            if (tx >= 0 && ty >= 0) prod.next[i * 256 + c] = states.intern(tx, ty);
        }
    }
    int32_t n = static_cast<int32_t>(pairs.size());
    prod.num_states = n;
    // Trim states that cannot reach acceptance (renumbering).
    std::vector<std::vector<int32_t>> rev(n);
    for (int32_t s = 0; s < n; ++s) {
        for (int c = 0; c < 256; ++c) {
            int32_t t = prod.next[static_cast<size_t>(s) * 256 + c];
            if (t >= 0) rev[t].push_back(s);
        }
    }
    const std::vector<char> live = co_reachable(rev, prod.accept);
    if (!live[0]) return nullptr;
    std::vector<int32_t> id(n, -1);
    int32_t m = 0;
    for (int32_t s = 0; s < n; ++s) {
        if (live[s]) id[s] = m++;
    }
    ByteDfa& c = out->content;
    c.num_states = m;
    c.start = id[0];
    c.accept.assign(m, 0);
    c.next.assign(static_cast<size_t>(m) * 256, -1);
    out->boundary.assign(m, 0);
    for (int32_t s = 0; s < n; ++s) {
        if (!live[s]) continue;
        c.accept[id[s]] = prod.accept[s];
        out->boundary[id[s]] = jchar_star.accept[pairs[s].second];
        for (int b = 0; b < 256; ++b) {
            int32_t t = prod.next[static_cast<size_t>(s) * 256 + b];
            if (t >= 0 && live[t]) c.next[static_cast<size_t>(id[s]) * 256 + b] = id[t];
        }
    }
    // Fewest / most characters to acceptance; an edge into a boundary state completes a character.
    out->min_chars.assign(m, kInf);
    for (int32_t s = 0; s < m; ++s) {
        if (c.accept[s]) out->min_chars[s] = 0;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = 0; s < m; ++s) {
            for (int b = 0; b < 256; ++b) {
                int32_t t = c.next[static_cast<size_t>(s) * 256 + b];
                if (t < 0 || out->min_chars[t] >= kInf) continue;
                int32_t v = out->min_chars[t] + out->boundary[t];
                if (v < out->min_chars[s]) {
                    out->min_chars[s] = v;
                    changed = true;
                }
            }
        }
    }
    // Longest: unbounded when a cycle is reachable (every cycle completes a character).
    out->max_chars.assign(m, -1);
    std::vector<int8_t> color(m, 0);
    std::function<int32_t(int32_t)> longest = [&](int32_t s) -> int32_t {
        if (color[s] == 2) return out->max_chars[s];
        if (color[s] == 1) return kInf;  // cycle
        color[s] = 1;
        int32_t best = c.accept[s] ? 0 : -1;
        for (int b = 0; b < 256 && best < kInf; ++b) {
            int32_t t = c.next[static_cast<size_t>(s) * 256 + b];
            if (t < 0) continue;
            int32_t v = longest(t);
            if (v >= kInf) {
                best = kInf;
            } else if (v >= 0) {
                best = std::max(best, v + out->boundary[t]);
            }
        }
        color[s] = 2;
        out->max_chars[s] = best;
        return best;
    };
    for (int32_t s = 0; s < m; ++s) longest(s);
    // The virtual automaton decides liveness from [min_chars, max_chars]; check that every length in
    // between is achievable (up to a bound), else give up on the counted form.
    const int32_t bound = std::min(512, std::max(64, 2 * m + 8));
    std::vector<std::vector<uint64_t>> reach(m, std::vector<uint64_t>((bound + 64) / 64, 0));
    for (int32_t s = 0; s < m; ++s) {
        if (c.accept[s]) reach[s][0] |= 1;
    }
    // Distinct successors per state.
    std::vector<std::vector<int32_t>> succ(m);
    for (int32_t s = 0; s < m; ++s) {
        for (int b = 0; b < 256; ++b) {
            int32_t t = c.next[static_cast<size_t>(s) * 256 + b];
            if (t >= 0) succ[s].push_back(t);
        }
        std::sort(succ[s].begin(), succ[s].end());
        succ[s].erase(std::unique(succ[s].begin(), succ[s].end()), succ[s].end());
    }
    for (bool changed = true; changed;) {
        changed = false;
        check_deadline(limits);
        for (int32_t s = 0; s < m; ++s) {
            for (int32_t t : succ[s]) {
                int w = out->boundary[t];
                auto& dst = reach[s];
                const auto& src = reach[t];
                for (size_t k = 0; k < dst.size(); ++k) {
                    uint64_t v = w ? (src[k] << 1) | (k ? src[k - 1] >> 63 : 0) : src[k];
                    if ((dst[k] | v) != dst[k]) {
                        dst[k] |= v;
                        changed = true;
                    }
                }
            }
        }
    }
    // Exact completion lengths up to `bound`; beyond it every length must be achievable (checked on
    // [bound / 2, bound], which cycles through the DFA reach when the tail is complete).
    out->len_bound = bound;
    out->next_len.assign(static_cast<size_t>(m) * (bound + 1), CountedString::kUnboundedChars);
    for (int32_t s = 0; s < m; ++s) {
        if (out->max_chars[s] >= kInf) {
            for (int32_t l = bound / 2; l <= bound; ++l) {
                if (!((reach[s][l / 64] >> (l % 64)) & 1)) return nullptr;
            }
        } else if (out->max_chars[s] > bound) {
            return nullptr;
        }
        int32_t nxt = kInf;
        for (int32_t l = bound; l >= 0; --l) {
            if ((reach[s][l / 64] >> (l % 64)) & 1) nxt = l;
            out->next_len[static_cast<size_t>(s) * (bound + 1) + l] = nxt;
        }
    }
    // Signature of the content automaton (the bounds are not part of it).
    std::string& sig = out->signature;
    sig.append(reinterpret_cast<const char*>(&c.start), sizeof c.start);
    sig.append(reinterpret_cast<const char*>(c.accept.data()), c.accept.size());
    sig.append(reinterpret_cast<const char*>(out->boundary.data()), out->boundary.size());
    sig.append(reinterpret_cast<const char*>(c.next.data()), c.next.size() * sizeof(int32_t));
    return out;
}

}  // namespace deepinfer::grammar
