// deepinfer chat-template: print the DeepSeek-V4 prompt for a JSON array of OpenAI-style messages, exactly
// as the official encoder writes it, with no trailing newline.
#include <cstdio>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "core/file.h"
#include "deepinfer/error.h"
#include "tokenizer/chat_encoding.h"

namespace deepinfer::cli {

int cmd_chat_template(int argc, char** argv) {
    cxxopts::Options opts("deepinfer chat-template", "Print the DeepSeek-V4 prompt text for chat messages.");
    opts.add_options()("messages", "JSON file: an array of messages (or an object with \"messages\")",
                       cxxopts::value<std::string>())("thinking-mode", "chat or thinking",
                                                      cxxopts::value<std::string>()->default_value("chat"))(
        "keep-thinking", "keep the reasoning of earlier turns (drop_thinking = false)")(
        "reasoning-effort", "max or high", cxxopts::value<std::string>())("h,help", "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    DI_CHECK(args.count("messages"), "--messages is required (see --help)");
    const std::string path = args["messages"].as<std::string>();
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        DI_THROW(path, ": not valid JSON (", e.what(), ")");
    }
    if (j.is_object() && j.contains("messages")) j = nlohmann::ordered_json(j["messages"]);
    ChatEncodeOptions options;
    options.thinking_mode = parse_thinking_mode(args["thinking-mode"].as<std::string>());
    options.drop_thinking = args.count("keep-thinking") == 0;
    if (args.count("reasoning-effort")) options.reasoning_effort = args["reasoning-effort"].as<std::string>();
    const std::string prompt = encode_messages(j, options);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    return 0;
}

}  // namespace deepinfer::cli
