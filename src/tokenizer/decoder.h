// tokenizer.json decoders (ByteLevel, Sequence, Replace, Strip, Fuse, ByteFallback, Metaspace) and
// post-processors (TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace deepinfer::tok {

class Decoder {
public:
    virtual ~Decoder() = default;
    // Transforms the list of token strings (Hugging Face's decode_chain); the caller concatenates the result.
    virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
    // Rewrites one token string into the bytes it contributes in the middle of a text: like decode_chain on
    // a single non-leading token, but keeping raw bytes (no U+FFFD) and ignoring leading/trailing strips.
    virtual void token_bytes(std::string& token) const = 0;
    // True when byte tokens ("<0xAB>") are decoded a run at a time (ByteFallback): a run that is not valid
    // UTF-8 becomes one U+FFFD per byte, so earlier bytes of a run can change with later ones.
    virtual bool groups_byte_tokens() const { return false; }
};

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& t);

// nullptr for a JSON null. Throws deepinfer::Error naming an unsupported or malformed decoder.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

class PostProcessor {
public:
    virtual ~PostProcessor() = default;
    // Adds the special tokens of a single sequence around ids.
    virtual void process(std::vector<int32_t>& ids) const = 0;
};

// nullptr for a JSON null. Throws deepinfer::Error naming an unsupported or malformed post-processor.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j);

}  // namespace deepinfer::tok
