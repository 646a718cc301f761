#include "model/model.h"

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/model.h"

namespace deepinfer {

size_t StateSpec::ring_bytes() const {
    size_t n = 0;
    for (const StateBufferSpec& b : buffers)
        if (b.ring_rows > 0) n += static_cast<size_t>(b.ring_rows * b.row_elems) * 4;
    return n;
}

double StateSpec::paged_bytes_per_token() const {
    double n = 0;
    for (const StateBufferSpec& b : buffers)
        if (b.tokens_per_row > 0) n += 4.0 * static_cast<double>(b.row_elems) / static_cast<double>(b.tokens_per_row);
    return n;
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, Backend& backend) {
    const std::string config_path = path_join(dir, "config.json");
    DI_CHECK(file_exists(dir), "model directory ", dir, " does not exist");
    DI_CHECK(file_exists(config_path), dir, " has no config.json (expected a Hugging Face checkpoint directory)");
    const std::string text = read_file(config_path);
    std::string model_type;
    try {
        nlohmann::json j = nlohmann::json::parse(text);
        DI_CHECK(j.is_object(), config_path, ": not a JSON object");
        if (j.contains("model_type") && j["model_type"].is_string()) model_type = j["model_type"].get<std::string>();
    } catch (const nlohmann::json::exception& e) {
        DI_THROW(config_path, ": corrupt JSON: ", e.what());
    }
    if (model_type == "deepseek_v4") return std::make_unique<dsv4::DeepseekV4Model>(dir, text, backend);
    DI_THROW(config_path, ": unsupported model_type \"", model_type, "\" (supported: deepseek_v4)");
}

}  // namespace deepinfer
