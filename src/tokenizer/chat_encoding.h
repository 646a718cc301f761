// DeepSeek-V4 chat encoding: OpenAI-style messages -> the prompt text the model was trained on, and the
// inverse parse of a completion. A C++ port of the behaviour of DeepSeek's official encoder
// (encoding_dsv4.py): thinking modes, reasoning effort, tools rendered in DSML, tool calls, tool results
// merged into user turns and sorted by call order, response_format, developer and latest_reminder roles,
// and task tokens. Messages use nlohmann::ordered_json so that key order (which the prompt shows, as
// Python's json.dumps does) is kept.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer {

enum class ThinkingMode { kChat, kThinking };

// "chat" or "thinking"; throws deepinfer::Error otherwise.
ThinkingMode parse_thinking_mode(std::string_view name);

struct ChatEncodeOptions {
    ThinkingMode thinking_mode = ThinkingMode::kChat;
    bool drop_thinking = true;                    // drop reasoning of turns before the last user message
    bool add_bos = true;                          // BOS when there is no context
    std::optional<std::string> reasoning_effort;  // "max", "high" or none
};

// Encodes `messages` (a JSON array of message objects). `context`, when given, holds earlier messages whose
// text the caller already has: their effect on the new messages is kept but their text is not repeated.
// Throws deepinfer::Error on malformed messages (unknown role, bad tool call, invalid task, ...).
std::string encode_messages(const nlohmann::ordered_json& messages, const ChatEncodeOptions& options,
                            const nlohmann::ordered_json* context = nullptr);

// Parses a completion (the generated text, ending in the EOS token) into
// {"role": "assistant", "content", "reasoning_content", "tool_calls": [OpenAI format]}.
// Throws deepinfer::Error when the text is not well formed.
nlohmann::ordered_json parse_completion(std::string_view text, ThinkingMode mode);

// Python's json.dumps(value, ensure_ascii=False) (separators ", " and ": ", repr floats).
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace deepinfer
