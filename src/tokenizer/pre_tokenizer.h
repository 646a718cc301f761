// tokenizer.json pre-tokenizers: Sequence, Split (every behavior, invert), ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace deepinfer::tok {

struct PreToken {
    std::string text;
    bool at_start = false;    // begins at offset 0 of the original input (Metaspace prepend_scheme "first")
    bool byte_level = false;  // text holds raw bytes standing for their byte-level characters
};

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;
    // Replaces `pieces` by their pre-tokenization (empty pieces are dropped).
    virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// nullptr for a JSON null. Throws deepinfer::Error naming an unsupported or malformed pre-tokenizer.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);

// Maps a deferred byte-level piece to its byte-level characters.
void materialize_byte_level(PreToken& p);

}  // namespace deepinfer::tok
