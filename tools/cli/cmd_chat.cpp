// deepinfer chat: an interactive conversation in the model's chat format (DeepSeek-V4 encoding), streamed.
// Reads one user message per line from stdin; /reset starts over, /exit (or end of input) quits.
#include <unistd.h>

#include <cstdio>
#include <cxxopts.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "deepinfer/llm.h"
#include "tokenizer/chat_encoding.h"

namespace deepinfer::cli {

namespace {

// The assistant turn to keep in the history: parsed like the official encoder does (reasoning and content
// apart), or the raw text when it does not parse (e.g. cut off by max_tokens).
nlohmann::ordered_json assistant_message(const LLM& llm, const CompletionOutput& c, const std::string& mode) {
    if (c.finish_reason == "stop" && c.stop_str.empty() && c.stop_token_id < 0 &&
        !llm.model_info().eos_token_ids.empty()) {
        try {
            const std::string eos = llm.decode({llm.model_info().eos_token_ids[0]});
            return parse_completion(c.text + eos, parse_thinking_mode(mode));
        } catch (const Error&) {
        }
    }
    return {{"role", "assistant"}, {"content", c.text}};
}

}  // namespace

int cmd_chat(int argc, char** argv) {
    cxxopts::Options opts("deepinfer chat", "Chat with the model: one message per line, /reset, /exit.");
    opts.add_options()("thinking-mode", "chat or thinking", cxxopts::value<std::string>()->default_value("chat"))(
        "reasoning-effort", "max or high (thinking mode)", cxxopts::value<std::string>())(
        "system", "a system message to start with", cxxopts::value<std::string>())("h,help", "show help");
    add_sampling_options(opts, "1024", "0.6");
    add_engine_options(opts);
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help({"", "Sampling", "Engine"}).c_str());
        return 0;
    }
    ChatOptions chat;
    chat.thinking_mode = args["thinking-mode"].as<std::string>();
    parse_thinking_mode(chat.thinking_mode);  // validates
    if (args.count("reasoning-effort")) chat.reasoning_effort = args["reasoning-effort"].as<std::string>();
    const SamplingParams params = sampling_params(args);
    LLM llm(engine_options(args));
    DI_CHECK(llm.model_info().has_tokenizer, "chat needs a tokenizer and the model directory ", llm.model_info().dir,
             " has none (pass --tokenizer)");

    const bool interactive = isatty(STDIN_FILENO);
    nlohmann::ordered_json start = nlohmann::ordered_json::array();
    if (args.count("system")) start.push_back({{"role", "system"}, {"content", args["system"].as<std::string>()}});
    nlohmann::ordered_json messages = start;
    if (interactive)
        std::fprintf(stderr, "deepinfer chat: %s (%s mode). /reset starts over, /exit quits.\n",
                     llm.model_info().dir.c_str(), chat.thinking_mode.c_str());
    std::string line;
    for (;;) {
        if (interactive) std::fprintf(stderr, "\n> ");
        if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
        if (line == "/reset") {
            messages = start;
            continue;
        }
        if (line.empty()) continue;
        messages.push_back({{"role", "user"}, {"content", line}});
        const RequestOutput out =
            llm.generate({Prompt::from_messages(messages.dump(), chat)}, params, [](const RequestOutput& o) {
                std::fwrite(o.outputs[0].delta_text.data(), 1, o.outputs[0].delta_text.size(), stdout);
                std::fflush(stdout);
            })[0];
        std::printf("\n");
        std::fflush(stdout);
        if (!out.error.empty()) {
            std::fprintf(stderr, "deepinfer chat: error: %s\n", out.error.c_str());
            messages.erase(messages.size() - 1);
            continue;
        }
        const CompletionOutput& c = out.outputs[0];
        messages.push_back(assistant_message(llm, c, chat.thinking_mode));
        if (interactive) {
            const RequestMetrics& m = out.metrics;
            const double decode = m.last_token_time - m.first_token_time;
            std::fprintf(stderr, "[%zu tokens, %s; TTFT %.2f s, %.1f tokens/s]\n", c.token_ids.size(),
                         c.finish_reason.c_str(), m.time_to_first_token(),
                         c.token_ids.size() > 1 && decode > 0 ? (c.token_ids.size() - 1) / decode : 0.0);
        }
    }
    return 0;
}

}  // namespace deepinfer::cli
