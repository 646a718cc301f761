#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/json_text.h"
#include "deepinfer/error.h"
#include "tokenizer/unicode.h"

namespace deepinfer {

using Json = nlohmann::ordered_json;
using tok::find_invalid_utf8;
using tok::is_whitespace;
using tok::next_code_point;

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";

const std::map<std::string, std::string>& task_tokens() {
    static const std::map<std::string, std::string> kTasks = {
        {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
        {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
    };
    return kTasks;
}

constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

constexpr std::string_view kResponseFormatIntro =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// The tools section of a system / developer message; DSML stands for the DSML marker.
std::string render_tools(const std::vector<Json>& functions) {
    const std::string d(kDsml);
    std::string schemas;
    for (size_t i = 0; i < functions.size(); ++i) {
        if (i) schemas += "\n";
        schemas += python_json_dumps(functions[i]);
    }
    std::string s;
    s += "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools "
         "by writing a \"<" +
         d + "tool_calls>\" block like the following:\n\n";
    s += "<" + d + "tool_calls>\n<" + d + "invoke name=\"$TOOL_NAME\">\n<" + d +
         "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + "parameter>\n...\n</" + d +
         "invoke>\n<" + d + "invoke name=\"$TOOL_NAME2\">\n...\n</" + d + "invoke>\n</" + d + "tool_calls>\n\n";
    s += "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n";
    s += "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n";
    s += "Otherwise, output directly after </think> with tool calls or final response.\n\n";
    s += "### Available Tool Schemas\n\n" + schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
    return s;
}

// ---- Python-compatible JSON text ----

void dump_string(std::string& out, const std::string& s) { append_json_string(out, s); }

// repr(float): shortest round-trip digits, fixed notation for exponents in [-4, 16), else d.ddde+XX.
void dump_float(std::string& out, double v) {
    if (std::isnan(v)) {
        out += "NaN";
        return;
    }
    if (std::isinf(v)) {
        out += v > 0 ? "Infinity" : "-Infinity";
        return;
    }
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    size_t epos = sci.find('e');
    std::string mant = sci.substr(0, epos);
    int exp = std::stoi(sci.substr(epos + 1));
    std::string digits;
    for (char c : mant)
        if (c != '.') digits.push_back(c);
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    if (neg) out.push_back('-');
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
            while (static_cast<int>(ip.size()) < exp + 1) ip.push_back('0');
            std::string fp = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
            out += ip + "." + fp;
        } else {
            out += "0." + std::string(-exp - 1, '0') + digits;
        }
    } else {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    }
}

void dump_value(std::string& out, const Json& v) {
    switch (v.type()) {
        case Json::value_t::null:
            out += "null";
            break;
        case Json::value_t::boolean:
            out += v.get<bool>() ? "true" : "false";
            break;
        case Json::value_t::number_integer:
            out += std::to_string(v.get<int64_t>());
            break;
        case Json::value_t::number_unsigned:
            out += std::to_string(v.get<uint64_t>());
            break;
        case Json::value_t::number_float:
            dump_float(out, v.get<double>());
            break;
        case Json::value_t::string:
            dump_string(out, v.get_ref<const std::string&>());
            break;
        case Json::value_t::array: {
            out.push_back('[');
            bool first = true;
            for (const Json& e : v) {
                if (!first) out += ", ";
                first = false;
                dump_value(out, e);
            }
            out.push_back(']');
            break;
        }
        case Json::value_t::object: {
            out.push_back('{');
            bool first = true;
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (!first) out += ", ";
                first = false;
                dump_string(out, it.key());
                out += ": ";
                dump_value(out, it.value());
            }
            out.push_back('}');
            break;
        }
        default:
            DI_THROW("cannot serialize a JSON value of this type");
    }
}

// ---- message helpers ----

// Python truthiness of an optional field.
bool truthy(const Json& m, const char* key) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_string()) return !it->get_ref<const std::string&>().empty();
    if (it->is_array() || it->is_object()) return !it->empty();
    if (it->is_number()) return it->get<double>() != 0.0;
    return true;
}

std::string role_of(const Json& m) {
    DI_CHECK(m.is_object(), "each message must be a JSON object, got ", m.dump());
    auto it = m.find("role");
    DI_CHECK(it != m.end() && it->is_string(), "each message needs a string 'role': ", m.dump());
    return it->get<std::string>();
}

// content or "" (a string field that may be missing or null).
std::string text_field(const Json& m, const char* key) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return "";
    DI_CHECK(it->is_string(), "message field '", key, "' must be a string: ", m.dump());
    return it->get<std::string>();
}

bool has_task(const Json& m) {
    auto it = m.find("task");
    return it != m.end() && !it->is_null();
}

int find_last_user_index(const std::vector<Json>& msgs) {
    for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
        std::string r = role_of(msgs[i]);
        if (r == "user" || r == "developer") return i;
    }
    return -1;
}

std::vector<Json> merge_tool_messages(const std::vector<Json>& messages) {
    std::vector<Json> merged;
    for (const Json& msg : messages) {
        const std::string role = role_of(msg);
        auto last_is_user_with_blocks = [&]() {
            return !merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks");
        };
        if (role == "tool") {
            Json block = {{"type", "tool_result"},
                          {"tool_use_id", msg.contains("tool_call_id") ? msg["tool_call_id"] : Json("")},
                          {"content", msg.contains("content") ? msg["content"] : Json("")}};
            if (last_is_user_with_blocks()) {
                merged.back()["content_blocks"].push_back(block);
            } else {
                merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({block})}});
            }
        } else if (role == "user") {
            Json content = msg.contains("content") ? msg["content"] : Json("");
            Json block = {{"type", "text"}, {"text", content}};
            if (last_is_user_with_blocks() && !has_task(merged.back())) {
                merged.back()["content_blocks"].push_back(block);
            } else {
                Json m = {{"role", "user"}, {"content", content}, {"content_blocks", Json::array({block})}};
                for (const char* key : {"task", "wo_eos", "mask"})
                    if (msg.contains(key)) m[key] = msg[key];
                merged.push_back(std::move(m));
            }
        } else {
            merged.push_back(msg);
        }
    }
    return merged;
}

void sort_tool_results_by_call_order(std::vector<Json>& messages) {
    std::map<std::string, int> order;
    bool have_order = false;
    for (Json& msg : messages) {
        const std::string role = role_of(msg);
        if (role == "assistant" && truthy(msg, "tool_calls")) {
            order.clear();
            have_order = false;
            DI_CHECK(msg["tool_calls"].is_array(), "assistant 'tool_calls' must be an array");
            int idx = 0;
            for (const Json& tc : msg["tool_calls"]) {
                std::string id;
                if (tc.is_object() && tc.contains("id") && tc["id"].is_string() &&
                    !tc["id"].get<std::string>().empty()) {
                    id = tc["id"].get<std::string>();
                } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
                           tc["function"].contains("id") && tc["function"]["id"].is_string()) {
                    id = tc["function"]["id"].get<std::string>();
                }
                if (!id.empty()) {
                    order[id] = idx;
                    have_order = true;
                }
                ++idx;
            }
        } else if (role == "user" && truthy(msg, "content_blocks")) {
            Json& blocks = msg["content_blocks"];
            std::vector<Json> results;
            for (const Json& b : blocks)
                if (b.is_object() && b.value("type", "") == "tool_result") results.push_back(b);
            if (results.size() > 1 && have_order) {
                auto key = [&](const Json& b) {
                    std::string id = b.contains("tool_use_id") && b["tool_use_id"].is_string()
                                         ? b["tool_use_id"].get<std::string>()
                                         : "";
                    auto it = order.find(id);
                    return it == order.end() ? 0 : it->second;
                };
                std::stable_sort(results.begin(), results.end(),
                                 [&](const Json& a, const Json& b) { return key(a) < key(b); });
                size_t k = 0;
                for (Json& b : blocks)
                    if (b.is_object() && b.value("type", "") == "tool_result") b = results[k++];
            }
        }
    }
}

std::vector<Json> drop_thinking_messages(const std::vector<Json>& messages) {
    int last_user = find_last_user_index(messages);
    std::vector<Json> out;
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string role = role_of(messages[i]);
        if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
            role == "direct_search_results" || static_cast<int>(i) >= last_user) {
            out.push_back(messages[i]);
        } else if (role == "assistant") {
            Json m = messages[i];
            m.erase("reasoning_content");
            out.push_back(std::move(m));
        }
        // Other roles (developer) before the last user message are dropped.
    }
    return out;
}

// A tool call's arguments as DSML parameters, one per line.
std::string encode_arguments_to_dsml(const Json& arguments) {
    Json args;
    bool parsed = false;
    if (arguments.is_string()) {
        try {
            args = Json::parse(arguments.get<std::string>());
            parsed = true;
        } catch (const Json::exception&) {
        }
    }
    if (!parsed) args = Json{{"arguments", arguments}};
    DI_CHECK(args.is_object(), "tool call arguments must be a JSON object, got ", arguments.dump());
    const std::string d(kDsml);
    std::string out;
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
        if (!first) out += "\n";
        first = false;
        bool is_str = it.value().is_string();
        out += "<" + d + "parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") + "\">";
        out += is_str ? it.value().get<std::string>() : python_json_dumps(it.value());
        out += "</" + d + "parameter>";
    }
    return out;
}

std::string render_message(size_t index, const std::vector<Json>& messages, ThinkingMode mode, bool drop_thinking,
                           const std::optional<std::string>& effort) {
    const bool thinking = mode == ThinkingMode::kThinking;
    const Json& msg = messages[index];
    const int last_user = find_last_user_index(messages);
    const std::string role = role_of(msg);
    const std::string d(kDsml);

    std::vector<Json> tools;
    if (truthy(msg, "tools")) {
        DI_CHECK(msg["tools"].is_array(), "'tools' must be an array");
        for (const Json& t : msg["tools"]) {
            DI_CHECK(t.is_object() && t.contains("function"),
                     "each tool must be {\"type\": \"function\", \"function\": {...}}");
            tools.push_back(t["function"]);
        }
    }
    std::string prompt;
    DI_CHECK(!effort || *effort == "max" || *effort == "high", "invalid reasoning effort '", *effort,
             "' (expected max or high)");
    if (index == 0 && thinking && effort && *effort == "max") prompt += kReasoningEffortMax;

    auto append_extras = [&](std::string& s) {
        if (!tools.empty()) s += "\n\n" + render_tools(tools);
        if (truthy(msg, "response_format"))
            s += "\n\n" + std::string(kResponseFormatIntro) + python_json_dumps(msg["response_format"]);
    };

    if (role == "system") {
        prompt += text_field(msg, "content");
        append_extras(prompt);
    } else if (role == "developer") {
        DI_CHECK(truthy(msg, "content"), "a developer message needs non-empty content");
        std::string s(kUser);
        s += text_field(msg, "content");
        append_extras(s);
        prompt += s;
    } else if (role == "user") {
        prompt += kUser;
        if (truthy(msg, "content_blocks")) {
            bool first = true;
            for (const Json& block : msg["content_blocks"]) {
                if (!first) prompt += "\n\n";
                first = false;
                const std::string type = block.is_object() && block.contains("type") && block["type"].is_string()
                                             ? block["type"].get<std::string>()
                                             : "";
                if (type == "text") {
                    prompt += text_field(block, "text");
                } else if (type == "tool_result") {
                    std::string content;
                    const Json& c = block.contains("content") ? block["content"] : Json("");
                    if (c.is_array()) {
                        bool f2 = true;
                        for (const Json& b : c) {
                            if (!f2) content += "\n\n";
                            f2 = false;
                            std::string t = b.is_object() && b.contains("type") && b["type"].is_string()
                                                ? b["type"].get<std::string>()
                                                : "None";
                            content += t == "text" ? text_field(b, "text") : "[Unsupported " + t + "]";
                        }
                    } else {
                        DI_CHECK(c.is_string() || c.is_null(), "tool message content must be a string or a list");
                        content = c.is_string() ? c.get<std::string>() : "None";
                    }
                    prompt += "<tool_result>" + content + "</tool_result>";
                } else {
                    prompt += "[Unsupported " + (type.empty() ? std::string("None") : type) + "]";
                }
            }
        } else {
            prompt += text_field(msg, "content");
        }
    } else if (role == "latest_reminder") {
        prompt += kLatestReminder;
        auto it = msg.find("content");
        prompt += (it == msg.end() || it->is_null()) ? std::string("None") : text_field(msg, "content");
    } else if (role == "assistant") {
        std::string tc_content;
        if (truthy(msg, "tool_calls")) {
            std::string calls;
            bool first = true;
            for (const Json& tc : msg["tool_calls"]) {
                DI_CHECK(tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
                             tc["function"].contains("name") && tc["function"].contains("arguments"),
                         "each tool call needs function.name and function.arguments: ", tc.dump());
                const Json& fn = tc["function"];
                std::string name =
                    fn["name"].is_string() ? fn["name"].get<std::string>() : python_json_dumps(fn["name"]);
                if (!first) calls += "\n";
                first = false;
                calls += "<" + d + "invoke name=\"" + name + "\">\n" + encode_arguments_to_dsml(fn["arguments"]) +
                         "\n</" + d + "invoke>";
            }
            tc_content = "\n\n<" + d + "tool_calls>\n" + calls + "\n</" + d + "tool_calls>";
        }
        bool prev_has_task = index >= 1 && has_task(messages[index - 1]);
        std::string thinking_part;
        if (thinking && !prev_has_task && (!drop_thinking || static_cast<int>(index) > last_user))
            thinking_part = text_field(msg, "reasoning_content") + std::string(kThinkEnd);
        prompt += thinking_part + text_field(msg, "content") + tc_content;
        if (!truthy(msg, "wo_eos")) prompt += kEos;
    } else if (role == "tool") {
        DI_THROW("internal: tool messages must have been merged into user messages");
    } else {
        DI_THROW("unknown message role '", role,
                 "' (expected system, developer, user, assistant, tool or latest_reminder)");
    }

    if (index + 1 < messages.size()) {
        const std::string next = role_of(messages[index + 1]);
        if (next != "assistant" && next != "latest_reminder") return prompt;
    }
    if (has_task(msg)) {
        DI_CHECK(msg["task"].is_string() && task_tokens().count(msg["task"].get<std::string>()), "invalid task ",
                 msg["task"].dump(), " (expected action, query, authority, domain, title or read_url)");
        const std::string task = msg["task"].get<std::string>();
        if (task != "action") {
            prompt += task_tokens().at(task);
        } else {
            prompt += kAssistant;
            prompt += thinking ? kThinkStart : kThinkEnd;
            prompt += task_tokens().at(task);
        }
    } else if (role == "user" || role == "developer") {
        prompt += kAssistant;
        if (thinking && (!drop_thinking || static_cast<int>(index) >= last_user)) {
            prompt += kThinkStart;
        } else {
            prompt += kThinkEnd;
        }
    }
    return prompt;
}

std::vector<Json> as_list(const Json& j, const char* what) {
    DI_CHECK(j.is_array(), what, " must be a JSON array of messages");
    std::vector<Json> out;
    for (const Json& m : j) {
        role_of(m);  // validates the shape
        out.push_back(m);
    }
    return out;
}

// ---- completion parsing ----

struct ReadResult {
    size_t next;
    std::string_view content;
    std::string_view stop;  // empty when none matched
};

ReadResult read_until(std::string_view text, size_t index, std::initializer_list<std::string_view> stops) {
    size_t best = std::string_view::npos;
    std::string_view matched;
    for (std::string_view s : stops) {
        size_t p = text.find(s, index);
        if (p != std::string_view::npos && p < best) {
            best = p;
            matched = s;
        }
    }
    if (best == std::string_view::npos) return {text.size(), text.substr(std::min(index, text.size())), {}};
    return {best + matched.size(), text.substr(index, best - index), matched};
}

bool py_space(char32_t c) { return is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

// Python's `$` after a pattern: at the end, or before a final "\n".
bool at_py_end(std::string_view s, size_t p) { return p == s.size() || (p + 1 == s.size() && s[p] == '\n'); }

}  // namespace

std::string python_json_dumps(const Json& value) {
    std::string out;
    dump_value(out, value);
    return out;
}

ThinkingMode parse_thinking_mode(std::string_view name) {
    if (name == "chat") return ThinkingMode::kChat;
    if (name == "thinking") return ThinkingMode::kThinking;
    DI_THROW("invalid thinking mode '", name, "' (expected chat or thinking)");
}

std::string encode_messages(const Json& messages_json, const ChatEncodeOptions& options, const Json* context_json) {
    std::vector<Json> messages = merge_tool_messages(as_list(messages_json, "messages"));
    std::vector<Json> context = context_json ? as_list(*context_json, "context") : std::vector<Json>{};
    {
        std::vector<Json> all = context;
        all.insert(all.end(), messages.begin(), messages.end());
        sort_tool_results_by_call_order(all);
        messages.assign(all.begin() + static_cast<std::ptrdiff_t>(context.size()), all.end());
    }
    if (!context.empty()) {
        context = merge_tool_messages(context);
        sort_tool_results_by_call_order(context);
    }
    std::vector<Json> full = context;
    full.insert(full.end(), messages.begin(), messages.end());

    std::string prompt = options.add_bos && context.empty() ? std::string(kBos) : std::string();
    bool drop = options.drop_thinking;
    for (const Json& m : full)
        if (truthy(m, "tools")) drop = false;

    size_t num_to_render, context_len;
    if (options.thinking_mode == ThinkingMode::kThinking && drop) {
        full = drop_thinking_messages(full);
        num_to_render = full.size() - drop_thinking_messages(context).size();
        context_len = full.size() - num_to_render;
    } else {
        num_to_render = messages.size();
        context_len = context.size();
    }
    for (size_t i = 0; i < num_to_render; ++i)
        prompt += render_message(i + context_len, full, options.thinking_mode, drop, options.reasoning_effort);
    return prompt;
}

Json parse_completion(std::string_view text, ThinkingMode mode) {
    DI_CHECK(find_invalid_utf8(text) == std::string_view::npos, "completion text is not valid UTF-8");
    const std::string d(kDsml);
    const std::string tc_start = "\n\n<" + d + "tool_calls";
    const std::string tc_end = "</" + d + "tool_calls>";
    const std::string invoke = "<" + d + "invoke";
    const std::string invoke_end = "</" + d + "invoke";
    const std::string param = "<" + d + "parameter";
    const std::string param_end = "/" + d + "parameter";

    std::string reasoning, content;
    Json tool_calls = Json::array();
    size_t index = 0;
    std::string_view stop;
    if (mode == ThinkingMode::kThinking) {
        auto r = read_until(text, index, {kThinkEnd, tc_start});
        DI_CHECK(r.stop == kThinkEnd, "malformed completion: the reasoning does not end with </think>");
        reasoning = r.content;
        index = r.next;
    }
    auto r = read_until(text, index, {kEos, tc_start});
    content = r.content;
    index = r.next;
    stop = r.stop;
    if (stop == tc_start) {
        while (index < text.size()) {
            auto a = read_until(text, index, {invoke, tc_end});
            DI_CHECK(a.content == ">\n", "malformed tool calls: expected '>\\n' but got '", a.content, "'");
            index = a.next;
            stop = a.stop;
            if (stop == tc_end) break;
            DI_CHECK(!stop.empty(), "malformed tool calls: missing closing tag");
            auto b = read_until(text, index, {param, invoke_end});
            index = b.next;
            stop = b.stop;
            // ^\s*name="(.*?)">\n$
            std::string_view nc = b.content;
            size_t p = 0;
            while (p < nc.size()) {
                size_t q = p;
                if (!py_space(next_code_point(nc, q))) break;
                p = q;
            }
            DI_CHECK(nc.substr(p, 6) == "name=\"", "malformed tool call name: '", nc, "'");
            size_t name_start = p + 6, name_end = std::string_view::npos;
            for (size_t k = name_start; k + 3 <= nc.size(); ++k) {
                if (nc.substr(k, 3) == "\">\n" && at_py_end(nc, k + 3)) {
                    name_end = k;
                    break;
                }
            }
            DI_CHECK(name_end != std::string_view::npos, "malformed tool call name: '", nc, "'");
            std::string name(nc.substr(name_start, name_end - name_start));
            std::vector<std::pair<std::string, std::pair<std::string, bool>>> args;
            while (stop == param) {
                auto c = read_until(text, index, {param_end});
                index = c.next;
                stop = c.stop;
                // ^ name="(.*?)" string="(true|false)">(.*?)<$
                std::string_view pc = c.content;
                DI_CHECK(pc.substr(0, 7) == " name=\"", "malformed tool call parameter: '", pc, "'");
                size_t lt = std::string_view::npos;  // the '<' that ends the value
                if (pc.size() >= 2 && pc[pc.size() - 2] == '<' && pc.back() == '\n') {
                    lt = pc.size() - 2;
                } else if (!pc.empty() && pc.back() == '<') {
                    lt = pc.size() - 1;
                }
                DI_CHECK(lt != std::string_view::npos, "malformed tool call parameter: '", pc, "'");
                bool found = false;
                for (size_t k = 7; k < pc.size() && !found; ++k) {
                    for (std::string_view flag :
                         {std::string_view("\" string=\"true\">"), std::string_view("\" string=\"false\">")}) {
                        if (pc.substr(k, flag.size()) == flag && k + flag.size() <= lt) {
                            std::string pname(pc.substr(7, k - 7));
                            for (const auto& a2 : args)
                                DI_CHECK(a2.first != pname, "duplicate tool call parameter '", pname, "'");
                            args.push_back(
                                {pname,
                                 {std::string(pc.substr(k + flag.size(), lt - k - flag.size())), flag.size() == 16}});
                            found = true;
                            break;
                        }
                    }
                }
                DI_CHECK(found, "malformed tool call parameter: '", pc, "'");
                auto e = read_until(text, index, {param, invoke_end});
                DI_CHECK(e.content == ">\n", "malformed tool call parameter: expected '>\\n' but got '", e.content,
                         "'");
                index = e.next;
                stop = e.stop;
            }
            std::string arguments = "{";
            for (size_t k = 0; k < args.size(); ++k) {
                if (k) arguments += ", ";
                arguments += python_json_dumps(Json(args[k].first)) + ": ";
                arguments +=
                    args[k].second.second ? python_json_dumps(Json(args[k].second.first)) : args[k].second.first;
            }
            arguments += "}";
            tool_calls.push_back(Json{{"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
        }
        auto t = read_until(text, index, {kEos});
        DI_CHECK(t.content.empty(), "malformed completion: unexpected text after the tool calls");
        index = t.next;
        stop = t.stop;
    } else {
        DI_CHECK(stop == kEos, "malformed completion: missing the end-of-sentence token");
    }
    DI_CHECK(index == text.size() && (stop == kEos || stop.empty()),
             "malformed completion: unexpected text at the end");
    for (std::string_view sp : {kBos, kEos, kThinkStart, kThinkEnd, kDsml}) {
        DI_CHECK(content.find(sp) == std::string::npos && reasoning.find(sp) == std::string::npos,
                 "malformed completion: unexpected special token '", sp, "' in the content");
    }
    return Json{
        {"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning}, {"tool_calls", tool_calls}};
}

}  // namespace deepinfer
