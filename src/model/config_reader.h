// Typed, validated access to config.json fields: every missing or mistyped key is an Error naming the file
// and the key. Include only from .cpp files (it pulls in nlohmann/json.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer {

// config.json text as a JSON object: corrupt JSON, or a value that is not an object, is an Error naming
// `source`.
inline nlohmann::json parse_config_object(const std::string& text, const std::string& source) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        DI_THROW(source, ": corrupt JSON: ", e.what());
    }
    DI_CHECK(j.is_object(), source, ": not a JSON object");
    return j;
}

class ConfigReader {
public:
    using Json = nlohmann::json;
    ConfigReader(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

    bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
    int64_t integer(const char* key) const {
        DI_CHECK(has(key), source_, ": missing required key \"", key, "\"");
        return integer_of(j_[key], key);
    }
    int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer_of(j_[key], key) : fallback; }
    double number(const char* key, double fallback) const {
        if (!has(key)) return fallback;
        DI_CHECK(j_[key].is_number(), source_, ": \"", key, "\" must be a number");
        return j_[key].get<double>();
    }
    bool boolean(const char* key, bool fallback) const {
        if (!has(key)) return fallback;
        DI_CHECK(j_[key].is_boolean(), source_, ": \"", key, "\" must be true or false");
        return j_[key].get<bool>();
    }
    std::string string(const char* key, const std::string& fallback) const {
        if (!has(key)) return fallback;
        DI_CHECK(j_[key].is_string(), source_, ": \"", key, "\" must be a string");
        return j_[key].get<std::string>();
    }
    std::vector<int64_t> integers(const char* key) const {
        std::vector<int64_t> out;
        if (!has(key)) return out;
        DI_CHECK(j_[key].is_array(), source_, ": \"", key, "\" must be a list of integers");
        for (const Json& v : j_[key]) out.push_back(integer_of(v, key));
        return out;
    }
    // eos_token_id as an integer or a list; appends nothing when absent.
    void token_ids(const char* key, std::vector<int>* out) const {
        if (!has(key)) return;
        out->clear();
        if (j_[key].is_array()) {
            for (const Json& e : j_[key]) out->push_back(static_cast<int>(integer_of(e, key)));
        } else {
            out->push_back(static_cast<int>(integer_of(j_[key], key)));
        }
    }
    const Json& at(const char* key) const { return j_[key]; }
    const std::string& source() const { return source_; }
    int64_t integer_of(const Json& v, const char* key) const {
        DI_CHECK(v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
                 source_, ": \"", key, "\" must be an integer");
        return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    }

private:
    const Json& j_;
    std::string source_;
};

}  // namespace deepinfer
