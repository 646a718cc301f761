// Engram: per position, hashes of the n-grams (sizes 2..max) ending there index prime-sized ranges of an
// FP8 table; the fetched rows become a key per mHC stream and one value, gated into the streams.
//
// The hashing runs over a compressed vocabulary (tokens that normalize alike share an id). Multipliers
// come from numpy's default_rng(10007 * layer_id); primes are drawn upward from engram_vocab_size, never
// reused across columns or layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/deepseek_v41/config.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::dsv41 {

// Token id -> compressed id, built from a tokenizer as DeepSeek's code builds it: decode each id alone; a
// text with U+FFFD keys on the raw token string, otherwise on its NFKC/NFD/accent-stripped, lowercased,
// whitespace-collapsed, stripped form (a lone space stays a space). Ids are numbered by first appearance.
std::vector<int32_t> build_engram_token_map(const Tokenizer& tokenizer, int32_t* num_compressed);

struct EngramLayout {
    int columns = 0;                               // (max_ngram - 1) * n_heads
    std::vector<std::vector<int64_t>> primes;      // [engram layer][column]
    std::vector<std::vector<int64_t>> offsets;     // [engram layer][column]: start of the column's range
    std::vector<std::vector<int64_t>> multipliers; // [engram layer][lookback 0..max_ngram-1]
};

// Checks the prime sums against engram_num_embeddings.
EngramLayout make_engram_layout(const EngramConfig& config, int64_t compressed_vocab_size);

// Table rows for one position of one Engram layer (engram_layer is the index into config.layer_ids):
// history[i] is the compressed id at position p - i (i < max_ngram), valid for i < available.
void engram_rows(const EngramLayout& layout, int engram_layer, const int64_t* history, int available,
                 int64_t pad_id, int64_t* rows_out);

}  // namespace deepinfer::dsv41
