// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/hash_table.h"

namespace deepinfer::tok {

class BpeModel {
public:
    // Throws deepinfer::Error for a malformed or unsupported model section.
    static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model);

    // Tokenizes one pre-token, appending ids. When byte_level_input is true, `word` holds raw bytes that
    // stand for their byte-level characters (the ByteLevel pre-tokenizer's output, not yet mapped).
    void tokenize(std::string_view word, bool byte_level_input, std::vector<int32_t>& out) const;

    int32_t token_to_id(std::string_view token) const { return vocab_.find(token); }
    // The vocabulary string of id, or nullptr when id is not in the model's vocabulary.
    const std::string* id_to_token(int32_t id) const {
        return id >= 0 && id < static_cast<int32_t>(tokens_.size()) && has_token_[id] ? &tokens_[id] : nullptr;
    }
    int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1
    bool byte_fallback() const { return byte_fallback_; }

private:
    BpeModel() = default;
    void tokenize_chars(std::string_view word, std::vector<int32_t>& out) const;
    void merge(std::vector<int32_t>& ids, std::vector<uint32_t>& lens, std::vector<int32_t>& out) const;

    uint64_t instance_id_ = 0;  // distinguishes models in the per-thread word cache
    StringIdMap vocab_;
    std::vector<std::string> tokens_;
    std::vector<uint8_t> has_token_;
    PairMap merges_;
    std::optional<std::string> unk_token_;
    int32_t unk_id_ = -1;
    std::string prefix_;  // continuing_subword_prefix
    std::string suffix_;  // end_of_word_suffix
    bool fuse_unk_ = false;
    bool byte_fallback_ = false;
    bool ignore_merges_ = false;
    std::array<int32_t, 256> byte_ids_{};  // id of each byte's byte-level character, -1 when absent
    bool all_bytes_present_ = false;
    std::array<int32_t, 256> fallback_ids_{};  // id of "<0xXX>", -1 when absent
};

}  // namespace deepinfer::tok
