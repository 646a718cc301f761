#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "deepinfer/error.h"
#include "sample/philox.h"

namespace deepinfer {

void check_sampling_options(const SamplingOptions& o) {
    DI_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "temperature must be >= 0, got ", o.temperature);
    DI_CHECK(o.top_k >= 0, "top_k must be >= 0 (0 disables it), got ", o.top_k);
    DI_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got ", o.top_p);
    DI_CHECK(o.min_p >= 0 && o.min_p <= 1, "min_p must be in [0, 1], got ", o.min_p);
}

int32_t argmax(std::span<const float> logits) {
    DI_CHECK(!logits.empty(), "argmax of an empty row");
    // Two passes (the maximum, then its first index) vectorise better than one branchy pass.
    float top = logits[0];
    for (float x : logits) top = x > top ? x : top;
    size_t best = 0;
    while (best < logits.size() && !(logits[best] == top)) ++best;
    if (best == logits.size()) best = 0;  // NaN at 0 compares false everywhere
    DI_CHECK(logits[best] > -std::numeric_limits<float>::infinity(),
             "no token can be generated: every token is masked (or the logits are NaN)");
    return static_cast<int32_t>(best);
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, uint64_t token_index) {
    if (o.temperature == 0.0f) return argmax(logits);
    const int32_t top = argmax(logits);
    const float mx = logits[top];
    const size_t v = logits.size();
    const float inv_t = 1.0f / o.temperature;
    struct Cand {
        float logit;
        int32_t id;
        double w;  // unnormalised probability exp((logit - max) / T), in (0, 1]
    };
    // Rank: larger logit first, the lower id on ties.
    auto by_rank = [](const Cand& a, const Cand& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    // Candidates in id order: not masked and, for min_p, exp((l - max) / T) >= min_p, i.e. l >= max + T ln(min_p).
    const float floor = o.min_p > 0 ? mx + o.temperature * std::log(o.min_p) : -std::numeric_limits<float>::infinity();
    std::vector<Cand> c;
    c.reserve(v);
    for (size_t i = 0; i < v; ++i)
        if (logits[i] > -std::numeric_limits<float>::infinity() && logits[i] >= floor)
            c.push_back({logits[i], static_cast<int32_t>(i), 0.0});
    if (c.empty()) c.push_back({mx, top, 0.0});  // min_p rounding never empties the set
    bool reordered = false;
    if (o.top_k > 0 && static_cast<size_t>(o.top_k) < c.size()) {
        std::nth_element(c.begin(), c.begin() + (o.top_k - 1), c.end(), by_rank);
        c.resize(static_cast<size_t>(o.top_k));
        reordered = true;
    }
    // float exp: about 3x faster than double over a 129k vocabulary; sums stay in double.
    for (Cand& x : c) x.w = std::exp((x.logit - mx) * inv_t);
    if (o.top_p < 1.0f) {
        // The smallest rank prefix whose mass reaches top_p of the total, by selection (expected linear time,
        // no full sort). Invariant: mass(c[0, lo)) = acc < need <= mass(c[0, hi)).
        double sum = 0;
        for (const Cand& x : c) sum += x.w;
        const double need = o.top_p * sum;
        size_t lo = 0, hi = c.size();
        double acc = 0;
        while (hi - lo > 1) {
            const size_t mid = lo + (hi - lo) / 2;
            std::nth_element(c.begin() + lo, c.begin() + mid, c.begin() + hi, by_rank);
            double left = 0;
            for (size_t i = lo; i < mid; ++i) left += c[i].w;
            if (acc + left >= need) {
                hi = mid;
            } else {
                acc += left;
                lo = mid;
            }
        }
        c.resize(hi);
        reordered = true;
    }
    // The draw walks the candidates in id order (a dense pass beats sorting a large set).
    if (reordered && c.size() > v / 16) {
        std::vector<double> dense(v, 0.0);
        for (const Cand& x : c) dense[x.id] = x.w;
        c.clear();
        for (size_t i = 0; i < v; ++i)
            if (dense[i] > 0) c.push_back({logits[i], static_cast<int32_t>(i), dense[i]});
    } else if (reordered) {
        std::sort(c.begin(), c.end(), [](const Cand& a, const Cand& b) { return a.id < b.id; });
    }
    double sum = 0;
    for (const Cand& x : c) sum += x.w;
    const double u = philox_uniform(o.seed, 0, token_index) * sum;
    double acc = 0;
    for (const Cand& x : c) {
        acc += x.w;
        if (u < acc) return x.id;
    }
    return c.back().id;
}

}  // namespace deepinfer
