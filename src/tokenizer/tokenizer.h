// Hugging Face tokenizer.json tokenizers (BPE family): encode, decode, vocabulary queries, and a
// streaming detokenizer for generation.
//
// Encoding matches Hugging Face tokenizers' `encode(text, add_special_tokens)` id for id: added tokens
// written in the text are recognised (special or not), then normalizer -> pre-tokenizer -> BPE.
// A Tokenizer is immutable after loading; every const method may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

class ThreadPool;

class Tokenizer {
public:
    // Loads tokenizer.json (or tokenizer.json.gz, or a directory holding either). A tokenizer_config.json
    // (or .json.gz) beside it, when present, supplies bos/eos tokens and add_bos_token / add_eos_token.
    // Throws deepinfer::Error on a missing, malformed or unsupported file, naming what is wrong.
    static Tokenizer from_file(const std::string& path);
    // The same from in-memory JSON text; config_json may be empty.
    static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Throws deepinfer::Error when text is not valid UTF-8. add_special_tokens adds what transformers
    // would: BOS/EOS per tokenizer_config.json's add_bos_token/add_eos_token when it sets them, else the
    // tokenizer.json post-processor's template.
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
    // Encodes many texts, spread over the pool's threads when one is given.
    std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts, bool add_special_tokens = false,
                                                   ThreadPool* pool = nullptr) const;
    // Matches Hugging Face's decode. Throws deepinfer::Error for an id outside [0, vocab_size()).
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

    // Size of the id space: the largest id of the vocabulary or of an added token, plus one.
    int32_t vocab_size() const;
    // The bytes token `id` stands for inside a text (byte-level alphabet and byte fallback undone; added
    // tokens give their content). Empty for ids that name no token. O(1): precomputed at load.
    std::string token_bytes(int32_t id) const { return std::string(token_bytes_view(id)); }
    std::string_view token_bytes_view(int32_t id) const;
    bool is_special(int32_t id) const;
    // A byte-fallback token ("<0xAB>") of a tokenizer whose decoder joins runs of them (ByteFallback).
    bool is_byte_fallback(int32_t id) const;
    bool is_added(int32_t id) const;
    std::optional<int32_t> token_to_id(std::string_view token) const;
    // The token's string as written in tokenizer.json (byte-level alphabet for byte-level models).
    std::optional<std::string> id_to_token(int32_t id) const;
    std::optional<int32_t> bos_id() const;
    std::optional<int32_t> eos_id() const;

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Turns generated ids into text incrementally. Each push() returns the text that became final with that
// token: nothing is emitted while the text ends in an incomplete UTF-8 sequence, so characters are never
// split. The concatenation of all push() results and finish() equals tokenizer.decode(all ids).
// The tokenizer must outlive the detokenizer. One detokenizer per sequence; not thread-safe itself.
class StreamingDetokenizer {
public:
    explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
    std::string push(int32_t id);
    // Text still held back (an incomplete trailing sequence decodes to U+FFFD here).
    std::string finish();
    const std::vector<int32_t>& ids() const { return ids_; }

private:
    const Tokenizer* tokenizer_;
    bool skip_special_;
    std::vector<int32_t> ids_;
    size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) is context already emitted
    size_t read_offset_ = 0;
    std::string prefix_text_;  // decode(ids_[prefix_offset_, read_offset_))
};

}  // namespace deepinfer
