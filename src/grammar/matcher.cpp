#include <cmath>
#include <cstring>
#include <limits>

#include "deepinfer/error.h"
#include "grammar/compiled.h"
#include "grammar/grammar.h"

namespace deepinfer::grammar {

namespace {

constexpr size_t kMaxPositions = 4096;  // parse stacks alive at once (ambiguity bound)

#if defined(__x86_64__)
__attribute__((target("popcnt"))) int32_t popcount_words_hw(const uint32_t* w, int32_t n) {
    int32_t c = 0;
    for (int32_t i = 0; i < n; ++i) c += __builtin_popcount(w[i]);
    return c;
}
#endif

int32_t popcount_words(const uint32_t* w, int32_t n) {
#if defined(__x86_64__)
    static const bool hw = __builtin_cpu_supports("popcnt");
    if (hw) return popcount_words_hw(w, n);
#endif
    int32_t c = 0;
    for (int32_t i = 0; i < n; ++i) c += __builtin_popcount(w[i]);
    return c;
}

inline void set_bit(uint32_t* mask, int32_t id) { mask[id >> 5] |= uint32_t{1} << (id & 31); }

}  // namespace

struct GrammarMatcher::State {
    explicit State(const CompiledGrammarImpl& g) : g(g), stepper(g, pool) { reset(); }

    struct Entry {
        std::vector<Pos> positions;
        bool terminated = false;
    };

    void reset() {
        pool.clear();
        history.clear();
        history.push_back(Entry{{Pos{g.root_start(), kRootParent}}, false});
        cached_mask_step = -1;
    }

    bool can_finish(const std::vector<Pos>& ps) {
        for (const Pos& p : ps) {
            if (stepper.can_finish(p)) return true;
        }
        return false;
    }

    // Positions after reading `bytes` from `from`; empty when rejected.
    bool advance(const std::vector<Pos>& from, std::string_view bytes, std::vector<Pos>& out) {
        a = from;
        for (unsigned char b : bytes) {
            out.clear();
            for (const Pos& p : a) stepper.step(p, b, out);
            if (out.empty()) return false;
            sort_unique(out);
            DI_CHECK(out.size() <= kMaxPositions, "grammar too ambiguous: more than ", kMaxPositions,
                     " parse stacks at once");
            a.swap(out);
        }
        out.swap(a);
        return true;
    }

    int32_t fill_mask(uint32_t* mask) {
        const Vocabulary& vocab = *g.vocab;
        int32_t words = vocab.mask_words();
        std::memset(mask, 0, sizeof(uint32_t) * words);
        const Entry& cur = history.back();
        if (cur.terminated) {
            for (int32_t id : vocab.stop_ids()) set_bit(mask, id);
            return static_cast<int32_t>(vocab.stop_ids().size());
        }
        // Every frame a token may start in: the top frames, and the frames below finished ones.
        elements.clear();
        bool complete = false;
        for (Pos q : cur.positions) {
            elements.push_back(q);
            while (g.eps_accepting(q.state)) {
                if (q.parent < 0) {
                    complete = complete || q.parent == kRootParent;
                    break;
                }
                StackPool::Node n = pool.node(q.parent);
                q = Pos{n.state, n.parent};
                elements.push_back(q);
            }
        }
        sort_unique(elements);
        int32_t last_state = -1;
        for (const Pos& e : elements) {
            const StateMask& m = g.state_mask(e.state);
            if (e.state != last_state) {
                last_state = e.state;
                if (m.dense) {
                    const uint32_t* src = m.bits.data();
                    for (int32_t w = 0; w < words; ++w) mask[w] |= src[w];
                } else {
                    for (int32_t id : m.ids) set_bit(mask, id);
                }
            }
            if (m.has_exits() && e.parent >= 0) {
                StackPool::Node n = pool.node(e.parent);
                start.assign(1, Pos{n.state, n.parent});
                walk_suffixes(m.exits, start, stepper, mask);
            }
        }
        if (complete) {
            for (int32_t id : vocab.stop_ids()) set_bit(mask, id);
        }
        return popcount_words(mask, words);
    }

    const CompiledGrammarImpl& g;
    StackPool pool;
    Stepper stepper;
    std::vector<Entry> history;  // history[0] is the start
    std::vector<Pos> elements, start, a, b;
    std::vector<uint32_t> cached_mask;
    int32_t cached_mask_step = -1;
    int32_t cached_count = 0;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>(grammar_->impl())) {}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int32_t GrammarMatcher::fill_mask(uint32_t* mask) { return state_->fill_mask(mask); }

bool GrammarMatcher::accept(int32_t token) {
    State& st = *state_;
    const Vocabulary& vocab = *st.g.vocab;
    if (st.history.back().terminated) return false;
    if (token < 0 || token >= vocab.num_tokens()) return false;
    if (vocab.is_stop(token)) {
        if (!st.can_finish(st.history.back().positions)) return false;
        st.history.push_back(State::Entry{st.history.back().positions, true});
        return true;
    }
    if (vocab.is_special(token)) return false;
    return accept_bytes(vocab.token(token));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    State& st = *state_;
    if (st.history.back().terminated) return false;
    std::vector<Pos> out;
    if (!st.advance(st.history.back().positions, bytes, out)) return false;
    st.history.push_back(State::Entry{std::move(out), false});
    return true;
}

void GrammarMatcher::rollback(int32_t n) {
    DI_CHECK(n >= 0 && n <= num_steps(), "cannot roll back ", n, " steps; only ", num_steps(), " were accepted");
    state_->history.resize(state_->history.size() - n);
}

int32_t GrammarMatcher::num_steps() const { return static_cast<int32_t>(state_->history.size()) - 1; }

void GrammarMatcher::reset() { state_->reset(); }

bool GrammarMatcher::is_terminated() const { return state_->history.back().terminated; }

bool GrammarMatcher::can_terminate() const {
    const State::Entry& e = state_->history.back();
    return e.terminated || state_->can_finish(e.positions);
}

std::string GrammarMatcher::forced_bytes(size_t max_bytes) const {
    State& st = *state_;
    std::string out;
    if (st.history.back().terminated) return out;
    std::vector<Pos> cur = st.history.back().positions, nxt;
    while (out.size() < max_bytes) {
        if (st.can_finish(cur)) break;
        ByteSet v;
        for (const Pos& p : cur) v |= st.stepper.viable(p);
        int count = 0, byte = -1;
        for (int i = 0; i < 4; ++i) count += __builtin_popcountll(v.bits[i]);
        if (count != 1) break;
        for (int bb = 0; bb < 256; ++bb) {
            if (v.test(static_cast<uint8_t>(bb))) byte = bb;
        }
        char c = static_cast<char>(byte);
        if (!st.advance(cur, std::string_view(&c, 1), nxt)) break;
        cur.swap(nxt);
        out += c;
    }
    return out;
}

std::optional<int32_t> GrammarMatcher::forced_token() {
    State& st = *state_;
    int32_t step = num_steps();
    if (st.cached_mask_step != step) {
        st.cached_mask.resize(st.g.vocab->mask_words());
        st.cached_count = st.fill_mask(st.cached_mask.data());
        st.cached_mask_step = step;
    }
    if (st.cached_count != 1) return std::nullopt;
    for (size_t w = 0; w < st.cached_mask.size(); ++w) {
        if (st.cached_mask[w]) return static_cast<int32_t>(w * 32 + __builtin_ctz(st.cached_mask[w]));
    }
    return std::nullopt;
}

int64_t GrammarMatcher::min_completion_bytes() const {
    State& st = *state_;
    if (st.history.back().terminated) return 0;
    int64_t best = std::numeric_limits<int64_t>::max();
    for (Pos p : st.history.back().positions) {
        int64_t total = st.g.min_finish(p.state);
        for (int32_t parent = p.parent; parent >= 0;) {
            StackPool::Node n = st.pool.node(parent);
            total += st.g.min_finish(n.state);
            parent = n.parent;
        }
        best = std::min(best, total);
    }
    return best;
}

void apply_token_mask(float* logits, int32_t num_logits, const uint32_t* mask) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < num_logits; ++i) {
        if (!((mask[i >> 5] >> (i & 31)) & 1)) logits[i] = ninf;
    }
}

}  // namespace deepinfer::grammar
