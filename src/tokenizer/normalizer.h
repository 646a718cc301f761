// tokenizer.json normalizers: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace deepinfer::tok {

class Normalizer {
public:
    virtual ~Normalizer() = default;
    // Rewrites s (valid UTF-8) in place.
    virtual void normalize(std::string& s) const = 0;
};

// nullptr for a JSON null. Throws deepinfer::Error naming an unsupported or malformed normalizer.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

}  // namespace deepinfer::tok
