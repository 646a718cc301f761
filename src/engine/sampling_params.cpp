#include "deepinfer/sampling_params.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "grammar/grammar.h"

namespace deepinfer {

namespace {

constexpr int32_t kMaxLogprobs = 20;

using Json = nlohmann::json;

std::string type_name(const Json& v) {
    if (v.is_number_integer()) return "an integer";
    if (v.is_number()) return "a number";
    if (v.is_boolean()) return "a boolean";
    if (v.is_string()) return "a string";
    if (v.is_array()) return "a list";
    if (v.is_object()) return "an object";
    return "null";
}

double get_number(const std::string& key, const Json& v) {
    DI_CHECK(v.is_number(), key, " must be a number, got ", type_name(v));
    return v.get<double>();
}

int64_t get_int(const std::string& key, const Json& v) {
    DI_CHECK(v.is_number_integer(), key, " must be an integer, got ", type_name(v));
    return v.get<int64_t>();
}

bool get_bool(const std::string& key, const Json& v) {
    DI_CHECK(v.is_boolean(), key, " must be true or false, got ", type_name(v));
    return v.get<bool>();
}

}  // namespace

void SamplingParams::validate() const {
    DI_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be >= 0, got ", temperature);
    DI_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got ", top_p);
    DI_CHECK(top_k >= -1, "top_k must be -1 or 0 (all tokens) or positive, got ", top_k);
    DI_CHECK(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got ", min_p);
    DI_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0, "repetition_penalty must be > 0, got ",
             repetition_penalty);
    DI_CHECK(presence_penalty >= -2 && presence_penalty <= 2, "presence_penalty must be in [-2, 2], got ",
             presence_penalty);
    DI_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2, "frequency_penalty must be in [-2, 2], got ",
             frequency_penalty);
    DI_CHECK(!max_tokens || *max_tokens >= 1, "max_tokens must be >= 1, got ", max_tokens.value_or(0));
    DI_CHECK(min_tokens >= 0, "min_tokens must be >= 0, got ", min_tokens);
    DI_CHECK(!max_tokens || min_tokens <= *max_tokens, "min_tokens (", min_tokens, ") must not exceed max_tokens (",
             max_tokens.value_or(0), ")");
    for (const std::string& s : stop) DI_CHECK(!s.empty(), "stop strings must not be empty");
    for (int32_t t : stop_token_ids) DI_CHECK(t >= 0, "stop_token_ids must be >= 0, got ", t);
    DI_CHECK(!logprobs || (*logprobs >= 0 && *logprobs <= kMaxLogprobs), "logprobs must be in [0, ", kMaxLogprobs,
             "], got ", logprobs.value_or(0));
    if (!so_args.empty()) grammar::parse_so_args(so_args);  // syntax; compiling needs the tokenizer
}

SamplingParams SamplingParams::from_json(std::string_view text) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const Json::exception& e) {
        DI_THROW("sampling parameters are not valid JSON: ", e.what());
    }
    DI_CHECK(j.is_object(), "sampling parameters must be a JSON object, got ", type_name(j));
    SamplingParams p;
    for (const auto& [key, v] : j.items()) {
        if (key == "temperature") {
            p.temperature = static_cast<float>(get_number(key, v));
        } else if (key == "top_p") {
            p.top_p = static_cast<float>(get_number(key, v));
        } else if (key == "top_k") {
            p.top_k = static_cast<int32_t>(get_int(key, v));
        } else if (key == "min_p") {
            p.min_p = static_cast<float>(get_number(key, v));
        } else if (key == "repetition_penalty") {
            p.repetition_penalty = static_cast<float>(get_number(key, v));
        } else if (key == "presence_penalty") {
            p.presence_penalty = static_cast<float>(get_number(key, v));
        } else if (key == "frequency_penalty") {
            p.frequency_penalty = static_cast<float>(get_number(key, v));
        } else if (key == "max_tokens") {
            p.max_tokens = v.is_null() ? std::nullopt : std::optional<int64_t>(get_int(key, v));
        } else if (key == "min_tokens") {
            p.min_tokens = get_int(key, v);
        } else if (key == "stop") {
            p.stop.clear();
            if (v.is_string()) {
                p.stop.push_back(v.get<std::string>());
            } else if (v.is_array()) {
                for (const Json& s : v) {
                    DI_CHECK(s.is_string(), "stop must be a string or a list of strings; the list holds ",
                             type_name(s));
                    p.stop.push_back(s.get<std::string>());
                }
            } else {
                DI_CHECK(v.is_null(), "stop must be a string or a list of strings, got ", type_name(v));
            }
        } else if (key == "stop_token_ids") {
            DI_CHECK(v.is_array() || v.is_null(), "stop_token_ids must be a list of integers, got ", type_name(v));
            p.stop_token_ids.clear();
            if (v.is_array())
                for (const Json& t : v) p.stop_token_ids.push_back(static_cast<int32_t>(get_int("stop_token_ids", t)));
        } else if (key == "ignore_eos") {
            p.ignore_eos = get_bool(key, v);
        } else if (key == "include_stop_str_in_output") {
            p.include_stop_str_in_output = get_bool(key, v);
        } else if (key == "skip_special_tokens") {
            p.skip_special_tokens = get_bool(key, v);
        } else if (key == "logprobs") {
            p.logprobs = v.is_null() ? std::nullopt : std::optional<int32_t>(static_cast<int32_t>(get_int(key, v)));
        } else if (key == "seq_seed" || key == "seed") {
            if (v.is_null()) {
                p.seq_seed.reset();
            } else {
                DI_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), key,
                         " must be a non-negative integer, got ", v.dump());
                p.seq_seed = v.get<uint64_t>();
            }
        } else if (key == "so_args") {
            DI_CHECK(v.is_object() || v.is_string() || v.is_null(), "so_args must be an object or its JSON text, got ",
                     type_name(v));
            p.so_args = v.is_object() ? v.dump() : v.is_string() ? v.get<std::string>() : std::string();
        } else {
            DI_THROW("unknown sampling parameter \"", key, "\"");
        }
    }
    p.validate();
    return p;
}

}  // namespace deepinfer
