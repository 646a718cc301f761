// Helpers shared by the tokenizer tests: loading test data and building the variant tokenizers of
// tests/data/tokenizer/variants.json exactly as tools/golden/make_tokenizer_golden.py does.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/file.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::test {

inline std::string tok_data(const std::string& rel) {
    std::string path(DI_TEST_DATA_DIR);
    path += "/tokenizer/";
    path += rel;
    return path;
}

// Loads each tokenizer once per test binary.
inline const Tokenizer& cached_tokenizer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return *it->second;
    std::unique_ptr<Tokenizer> tok;
    if (file_exists(tok_data(name + "/tokenizer.json.gz"))) {
        tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tok_data(name)));
    } else {
        auto variants = nlohmann::json::parse(read_file(tok_data("variants.json")))["variants"];
        for (const auto& spec : variants) {
            if (spec["name"] != name) continue;
            auto base =
                nlohmann::json::parse(read_file(tok_data(spec["base"].get<std::string>() + "/tokenizer.json.gz")));
            for (auto& [key, value] : spec["replace"].items()) base[key] = value;
            int32_t next_id = 0;
            for (auto& [k, v] : base["model"]["vocab"].items()) next_id = std::max(next_id, v.get<int32_t>() + 1);
            for (const auto& t : base["added_tokens"]) next_id = std::max(next_id, t["id"].get<int32_t>() + 1);
            if (spec.contains("add_tokens")) {
                for (auto t : spec["add_tokens"]) {
                    t["id"] = next_id++;
                    base["added_tokens"].push_back(t);
                }
            }
            tok = std::make_unique<Tokenizer>(Tokenizer::from_json(base.dump()));
        }
    }
    if (!tok) throw std::runtime_error("no tokenizer named " + name);
    return *cache.emplace(name, std::move(tok)).first->second;
}

}  // namespace deepinfer::test
