// The public LLM API over EngineCore.
#include "deepinfer/llm.h"

#include <cctype>
#include <cstdlib>
#include <unordered_map>

#include "core/file.h"
#include "engine/engine_core.h"

namespace deepinfer {

using engine::EngineCore;

std::string default_model_dir() {
#ifdef DI_DEFAULT_MODEL_DIR
    return DI_DEFAULT_MODEL_DIR;
#else
    return {};
#endif
}

std::string find_model_dir(const std::string& model) {
    if (!model.empty()) return model;
    if (const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR"); env && *env) return env;
    const std::string def = default_model_dir();
    DI_CHECK(!def.empty() && file_exists(path_join(def, "config.json")),
             "no model: pass a checkpoint directory (--model DIR) or set DEEPINFER_HF_MODEL_DIR");
    return def;
}

size_t parse_byte_size(const std::string& text) {
    size_t i = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    DI_CHECK(i > 0 && i <= 18, "bad byte size \"", text, "\" (examples: 1073741824, 512MiB, 4GiB)");
    const size_t n = std::stoull(text.substr(0, i));
    std::string unit = text.substr(i);
    for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const std::unordered_map<std::string, int> kShift = {
        {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
        {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40}};
    auto it = kShift.find(unit);
    DI_CHECK(it != kShift.end(), "bad byte size unit in \"", text, "\" (use KiB, MiB, GiB or TiB)");
    DI_CHECK(n <= (~size_t{0} >> it->second), "byte size \"", text, "\" is too large");
    return n << it->second;
}

LLM::LLM(EngineOptions options) : core_(std::make_unique<EngineCore>(std::move(options))) {}
LLM::LLM(const std::string& model) {
    EngineOptions options;
    options.model = model;
    core_ = std::make_unique<EngineCore>(std::move(options));
}
LLM::~LLM() = default;
LLM::LLM(LLM&&) noexcept = default;
LLM& LLM::operator=(LLM&&) noexcept = default;

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts, const SamplingParams& params,
                                         const OutputCallback& on_output) {
    return generate(prompts, std::vector<SamplingParams>{params}, on_output);
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts, const std::vector<SamplingParams>& params,
                                         const OutputCallback& on_output) {
    DI_CHECK(params.size() == 1 || params.size() == prompts.size(), "generate: ", params.size(),
             " sampling parameter sets for ", prompts.size(), " prompts (give one, or one per prompt)");
    std::unordered_map<uint64_t, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i)
        index[core_->add_request(prompts[i], params[params.size() == 1 ? 0 : i])] = i;
    std::vector<RequestOutput> results(prompts.size());
    size_t remaining = prompts.size();
    while (remaining > 0) {
        for (RequestOutput& o : core_->step()) {
            auto it = index.find(o.request_id);
            if (it == index.end()) continue;
            if (on_output) on_output(o);
            if (o.finished) {
                results[it->second] = std::move(o);
                --remaining;
            }
        }
    }
    return results;
}

std::vector<RequestOutput> LLM::chat(const std::vector<std::string>& conversations, const SamplingParams& params,
                                     const ChatOptions& options, const OutputCallback& on_output) {
    std::vector<Prompt> prompts;
    for (const std::string& c : conversations) prompts.push_back(Prompt::from_messages(c, options));
    return generate(prompts, params, on_output);
}

uint64_t LLM::add_request(Prompt prompt, SamplingParams params) {
    return core_->add_request(std::move(prompt), std::move(params));
}
bool LLM::abort_request(uint64_t request_id) { return core_->abort_request(request_id); }
std::vector<RequestOutput> LLM::step() { return core_->step(); }
bool LLM::has_unfinished_requests() const { return core_->has_unfinished(); }
const ModelSummary& LLM::model_info() const { return core_->summary(); }
MemoryReport LLM::memory_report() const { return core_->memory_report(); }
EngineStats LLM::stats() const { return core_->stats(); }
void LLM::reset_stats() { core_->reset_stats(); }
bool LLM::async_scheduling() const { return core_->async_scheduling(); }

std::vector<int32_t> LLM::encode(const std::string& text, bool add_special_tokens) const {
    return core_->tokenizer().encode(text, add_special_tokens);
}

std::string LLM::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    return core_->tokenizer().decode(ids, skip_special_tokens);
}

std::string LLM::apply_chat_template(const std::string& messages_json, const ChatOptions& options) const {
    return core_->apply_chat_template(messages_json, options);
}

}  // namespace deepinfer
