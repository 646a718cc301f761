#include "model/deepseek_v41/engram.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "deepinfer/error.h"
#include "model/deepseek_v41/numpy_random.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::dsv41 {

namespace {

bool is_prime(int64_t n) {
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (int64_t i = 3; i * i <= n; i += 2)
        if (n % i == 0) return false;
    return true;
}

// The normalizer DeepSeek's map builder uses (a lone space survives the Strip through a sentinel).
const char* const kNormalizerJson = R"({"type": "Sequence", "normalizers": [
    {"type": "NFKC"}, {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
    {"type": "Replace", "pattern": {"Regex": "[ \t\r\n]+"}, "content": " "},
    {"type": "Replace", "pattern": {"Regex": "^ $"}, "content": "\uE000"},
    {"type": "Strip", "strip_left": true, "strip_right": true},
    {"type": "Replace", "pattern": {"String": "\uE000"}, "content": " "}]})";

}  // namespace

std::vector<int32_t> build_engram_token_map(const Tokenizer& tokenizer, int32_t* num_compressed) {
    const auto normalizer = tok::make_normalizer(nlohmann::json::parse(kNormalizerJson));
    std::unordered_map<std::string, int32_t> ids;
    std::vector<int32_t> map(tokenizer.vocab_size());
    for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
        const std::string text = tokenizer.decode(std::span<const int32_t>(&id, 1), false);
        std::string key;
        if (text.find("\xEF\xBF\xBD") != std::string::npos) {  // U+FFFD: part of a multi-byte character
            key = tokenizer.id_to_token(id).value_or(text);
        } else {
            key = text;
            normalizer->normalize(key);
            if (key.empty()) key = text;
        }
        auto it = ids.try_emplace(key, static_cast<int32_t>(ids.size())).first;
        map[id] = it->second;
    }
    *num_compressed = static_cast<int32_t>(ids.size());
    return map;
}

EngramLayout make_engram_layout(const EngramConfig& c, int64_t compressed_vocab_size) {
    EngramLayout layout;
    layout.columns = (c.max_ngram - 1) * c.n_heads;
    std::set<int64_t> seen;
    const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab_size) / 2);
    for (size_t li = 0; li < c.layer_ids.size(); ++li) {
        std::vector<int64_t> primes, offsets;
        for (int g = 0; g < c.max_ngram - 1; ++g) {
            int64_t current = c.vocab_size - 1;  // each n-gram size restarts the search; `seen` keeps primes unique
            for (int h = 0; h < c.n_heads; ++h) {
                do ++current;
                while (!is_prime(current) || seen.count(current));
                seen.insert(current);
                primes.push_back(current);
            }
        }
        int64_t sum = 0;
        for (int64_t p : primes) {
            offsets.push_back(sum);
            sum += p;
        }
        DI_CHECK(sum == c.num_embeddings[li], "Engram layer ", c.layer_ids[li], ": its buckets sum to ", sum,
                 " rows but engram_num_embeddings says ", c.num_embeddings[li]);
        std::vector<int64_t> mult = numpy_default_rng_integers(static_cast<uint32_t>(10007 * c.layer_ids[li]), 0,
                                                               bound, c.max_ngram);
        for (int64_t& m : mult) m = m * 2 + 1;
        layout.primes.push_back(primes);
        layout.offsets.push_back(offsets);
        layout.multipliers.push_back(mult);
    }
    return layout;
}

void engram_rows(const EngramLayout& layout, int engram_layer, const int64_t* history, int available, int64_t pad_id,
                 int64_t* rows_out) {
    const std::vector<int64_t>& mult = layout.multipliers[engram_layer];
    const std::vector<int64_t>& primes = layout.primes[engram_layer];
    const std::vector<int64_t>& offsets = layout.offsets[engram_layer];
    const int max_ngram = static_cast<int>(mult.size());
    const int heads = layout.columns / (max_ngram - 1);
    int64_t hash = 0;
    for (int s = 0; s < max_ngram; ++s) {
        // Lookback blocking is sticky: once a position before the sequence start is reached, the pad id
        // fills every longer n-gram.
        const int64_t token = s < available ? history[s] : pad_id;
        hash ^= token * mult[s];  // token < compressed vocab, so the product fits int64 by construction
        if (s == 0) continue;
        for (int h = 0; h < heads; ++h) {
            const int col = (s - 1) * heads + h;
            rows_out[col] = hash % primes[col] + offsets[col];
        }
    }
}

}  // namespace deepinfer::dsv41
