#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "deepinfer/error.h"
#include "sample/philox.h"

namespace deepinfer {

void check_sampling_options(const SamplingOptions& o) {
    DI_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "temperature must be >= 0, got ", o.temperature);
    DI_CHECK(o.top_k >= 0, "top_k must be >= 0 (0 disables it), got ", o.top_k);
    DI_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got ", o.top_p);
}

int32_t argmax(std::span<const float> logits) {
    DI_CHECK(!logits.empty(), "argmax of an empty row");
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[best]) best = i;  // strict: the lowest id wins ties
    return static_cast<int32_t>(best);
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, uint64_t token_index) {
    if (o.temperature == 0.0f) return argmax(logits);
    const size_t v = logits.size();
    std::vector<int32_t> ids(v);
    std::iota(ids.begin(), ids.end(), 0);
    // Candidates by descending logit, ties to the lower id, so the draw is reproducible.
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    size_t keep = o.top_k > 0 ? std::min<size_t>(static_cast<size_t>(o.top_k), v) : v;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
    ids.resize(keep);
    std::vector<double> p(keep);
    const double mx = logits[ids[0]];
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += (p[i] = std::exp((logits[ids[i]] - mx) / o.temperature));
    if (o.top_p < 1.0f) {
        double mass = 0;
        size_t n = 0;
        while (n < keep && mass < o.top_p * sum) mass += p[n++];
        keep = std::max<size_t>(n, 1);
        sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
    }
    const double u = philox_uniform(o.seed, 0, token_index) * sum;
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
        acc += p[i];
        if (u < acc) return ids[i];
    }
    return ids[keep - 1];
}

}  // namespace deepinfer
