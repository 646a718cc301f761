#include "model/model.h"

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/model.h"

namespace deepinfer {

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
