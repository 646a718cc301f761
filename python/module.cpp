// _deepinfer: the pybind11 layer of the Python module over the public C++ API (include/deepinfer only).
// Prompts and sampling parameters arrive as Python objects and are converted per request, so that a bad one
// (wrong type, bad value) becomes that request's error output while the rest of the batch runs.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/llm.h"

namespace py = pybind11;
using namespace deepinfer;

namespace {

std::string type_name(py::handle v) { return py::str(py::type::of(v).attr("__name__")); }

std::string json_dumps(py::handle v) { return py::module_::import("json").attr("dumps")(v).cast<std::string>(); }

bool is_int(py::handle v) { return py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v); }

int64_t get_int(const std::string& key, py::handle v) {
    DI_CHECK(is_int(v), key, " must be an integer, got ", type_name(v));
    return v.cast<int64_t>();
}

bool get_bool(const std::string& key, py::handle v) {
    DI_CHECK(py::isinstance<py::bool_>(v), key, " must be True or False, got ", type_name(v));
    return v.cast<bool>();
}

std::vector<int32_t> get_ids(const std::string& key, py::handle v) {
    DI_CHECK(py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v), key, " must be a list of integers, got ",
             type_name(v));
    std::vector<int32_t> ids;
    for (py::handle t : v) {
        DI_CHECK(is_int(t), key, " must hold integers, got ", type_name(t));
        const auto x = t.cast<int64_t>();
        DI_CHECK(x >= INT32_MIN && x <= INT32_MAX, key, " holds ", x, ", outside the token id range");
        ids.push_back(static_cast<int32_t>(x));
    }
    return ids;
}

SamplingParams to_params(py::handle obj) {
    if (obj.is_none()) return {};
    py::dict d;
    if (py::isinstance<py::dict>(obj)) {
        d = py::reinterpret_borrow<py::dict>(obj);
    } else {
        DI_CHECK(py::hasattr(obj, "to_dict"), "sampling parameters must be a SamplingParams or a dict, got ",
                 type_name(obj));
        d = obj.attr("to_dict")();
    }
    // One parser for every front end: the dict goes through JSON to SamplingParams::from_json.
    std::string text;
    try {
        text = json_dumps(d);
    } catch (const py::error_already_set& e) {
        DI_THROW("sampling parameters must be JSON-serializable values: ", std::string(py::str(e.value())));
    }
    return SamplingParams::from_json(text);
}

Prompt to_prompt(py::handle obj, const ChatOptions& chat) {
    if (py::isinstance<py::str>(obj)) return Prompt::from_text(obj.cast<std::string>());
    if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj))
        return Prompt::from_ids(get_ids("prompt", obj));
    DI_CHECK(py::isinstance<py::dict>(obj), "a prompt must be a string, a list of token ids or a dict, got ",
             type_name(obj));
    const auto d = py::reinterpret_borrow<py::dict>(obj);
    if (d.contains("prompt_token_ids")) return Prompt::from_ids(get_ids("prompt_token_ids", d["prompt_token_ids"]));
    if (d.contains("prompt")) {
        DI_CHECK(py::isinstance<py::str>(d["prompt"]), "prompt must be a string, got ", type_name(d["prompt"]));
        return Prompt::from_text(d["prompt"].cast<std::string>());
    }
    if (d.contains("messages")) return Prompt::from_messages(json_dumps(d["messages"]), chat);
    DI_THROW("a prompt dict needs \"prompt_token_ids\", \"prompt\" or \"messages\"");
}

RequestOutput error_output(const std::string& prompt, const std::string& message) {
    RequestOutput o;
    o.prompt = prompt;
    o.finished = true;
    o.error = message;
    CompletionOutput c;
    c.finish_reason = "error";
    o.outputs.push_back(c);
    return o;
}

size_t get_size(const std::string& key, py::handle v) {
    if (py::isinstance<py::str>(v)) return parse_byte_size(v.cast<std::string>());
    const int64_t n = get_int(key, v);
    DI_CHECK(n >= 0, key, " must be >= 0");
    return static_cast<size_t>(n);
}

EngineOptions to_options(const py::dict& d) {
    EngineOptions o;
    for (auto [k, v] : d) {
        const std::string key = py::str(k);
        if (v.is_none()) continue;
        if (key == "model")
            o.model = v.cast<std::string>();
        else if (key == "tokenizer")
            o.tokenizer = v.cast<std::string>();
        else if (key == "device")
            o.device = v.cast<std::string>();
        else if (key == "num_threads")
            o.num_threads = static_cast<int>(get_int(key, v));
        else if (key == "max_batch_tokens")
            o.max_batch_tokens = get_int(key, v);
        else if (key == "max_seqs")
            o.max_seqs = get_int(key, v);
        else if (key == "max_prefill_chunk")
            o.max_prefill_chunk = get_int(key, v);
        else if (key == "memory_budget")
            o.memory_budget = get_size(key, v);
        else if (key == "block_tokens")
            o.block_tokens = get_int(key, v);
        else if (key == "max_model_len")
            o.max_model_len = get_int(key, v);
        else if (key == "async_scheduling")
            o.async_scheduling = get_bool(key, v);
        else if (key == "batch_invariant")
            o.batch_invariant = get_bool(key, v);
        else if (key == "seed")
            o.seed = static_cast<uint64_t>(get_int(key, v));
        else if (key == "load_format")
            o.load_format = v.cast<std::string>();
        else
            DI_THROW("unknown engine option \"", key, "\"");
    }
    return o;
}

ChatOptions to_chat(const std::string& thinking_mode, const std::optional<std::string>& reasoning_effort) {
    ChatOptions c;
    c.thinking_mode = thinking_mode;
    c.reasoning_effort = reasoning_effort;
    return c;
}

// Runs generate with per-request conversion; a Python exception in the callback stops further calls and is
// raised once generation is over (the engine is left clean).
class Engine {
public:
    explicit Engine(const py::dict& options) {
        EngineOptions o = to_options(options);
        py::gil_scoped_release release;
        llm_ = std::make_unique<LLM>(std::move(o));
    }

    std::vector<RequestOutput> generate(const py::list& prompts, const py::list& params, const py::object& callback,
                                        const ChatOptions& chat) {
        DI_CHECK(params.size() == prompts.size(), "generate: ", params.size(), " sampling parameter sets for ",
                 prompts.size(), " prompts");
        std::vector<RequestOutput> results(prompts.size());
        std::vector<Prompt> ok_prompts;
        std::vector<SamplingParams> ok_params;
        std::vector<size_t> where;
        for (size_t i = 0; i < prompts.size(); ++i) {
            try {
                Prompt p = to_prompt(prompts[i], chat);
                SamplingParams s = to_params(params[i]);
                ok_prompts.push_back(std::move(p));
                ok_params.push_back(std::move(s));
                where.push_back(i);
            } catch (const Error& e) {
                const bool text = py::isinstance<py::str>(prompts[i]);
                results[i] = error_output(text ? prompts[i].cast<std::string>() : "", e.what());
            }
        }
        std::optional<py::error_already_set> callback_error;
        OutputCallback on_output;
        if (!callback.is_none()) {
            on_output = [&](const RequestOutput& o) {
                py::gil_scoped_acquire acquire;
                if (callback_error) return;
                try {
                    callback(o);
                } catch (py::error_already_set& e) {
                    callback_error = std::move(e);
                }
            };
        }
        std::vector<RequestOutput> outs;
        if (!ok_prompts.empty()) {
            py::gil_scoped_release release;
            outs = llm_->generate(ok_prompts, ok_params, on_output);
        }
        for (size_t k = 0; k < outs.size(); ++k) results[where[k]] = std::move(outs[k]);
        if (callback_error) throw std::move(*callback_error);
        return results;
    }

    // Step-driven use: input that cannot even be converted raises here; bad values fail the request.
    uint64_t add_request(const py::object& prompt, const py::object& params) {
        return llm_->add_request(to_prompt(prompt, {}), to_params(params));
    }

    LLM& llm() { return *llm_; }

private:
    std::unique_ptr<LLM> llm_;
};

py::dict to_dict(const SamplingParams& p) {
    py::dict d;
    d["temperature"] = p.temperature;
    d["top_p"] = p.top_p;
    d["top_k"] = p.top_k;
    d["min_p"] = p.min_p;
    d["repetition_penalty"] = p.repetition_penalty;
    d["presence_penalty"] = p.presence_penalty;
    d["frequency_penalty"] = p.frequency_penalty;
    d["max_tokens"] = p.max_tokens ? py::cast(*p.max_tokens) : py::none();
    d["min_tokens"] = p.min_tokens;
    d["stop"] = p.stop;
    d["stop_token_ids"] = p.stop_token_ids;
    d["ignore_eos"] = p.ignore_eos;
    d["include_stop_str_in_output"] = p.include_stop_str_in_output;
    d["skip_special_tokens"] = p.skip_special_tokens;
    d["logprobs"] = p.logprobs ? py::cast(*p.logprobs) : py::none();
    d["seq_seed"] = p.seq_seed ? py::cast(*p.seq_seed) : py::none();
    d["so_args"] = p.so_args.empty() ? py::none() : py::cast(p.so_args);
    return d;
}

}  // namespace

PYBIND11_MODULE(_deepinfer, m) {
    m.doc() = "DeepInfer's C++ engine (use the `deepinfer` package: LLM, SamplingParams)";
    static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const Error& e) {
            error(e.what());
        }
    });

    py::class_<LogprobEntry>(m, "LogprobEntry")
        .def_readonly("token_id", &LogprobEntry::token_id)
        .def_readonly("logprob", &LogprobEntry::logprob)
        .def_readonly("rank", &LogprobEntry::rank)
        .def_readonly("top", &LogprobEntry::top)
        .def("__repr__", [](const LogprobEntry& e) {
            return "LogprobEntry(token_id=" + std::to_string(e.token_id) + ", logprob=" + std::to_string(e.logprob) +
                   ", rank=" + std::to_string(e.rank) + ")";
        });

    py::class_<CompletionOutput>(m, "CompletionOutput")
        .def_readonly("index", &CompletionOutput::index)
        .def_readonly("text", &CompletionOutput::text)
        .def_readonly("token_ids", &CompletionOutput::token_ids)
        .def_property_readonly("finish_reason",
                               [](const CompletionOutput& c) -> py::object {
                                   return c.finish_reason.empty() ? py::none() : py::cast(c.finish_reason);
                               })
        .def_property_readonly("stop_reason",
                               [](const CompletionOutput& c) -> py::object {
                                   if (!c.stop_str.empty()) return py::cast(c.stop_str);
                                   if (c.stop_token_id >= 0) return py::cast(c.stop_token_id);
                                   return py::none();
                               })
        .def_readonly("logprobs", &CompletionOutput::logprobs)
        .def_readonly("cumulative_logprob", &CompletionOutput::cumulative_logprob)
        .def_readonly("delta_text", &CompletionOutput::delta_text)
        .def_readonly("delta_token_ids", &CompletionOutput::delta_token_ids)
        .def("__repr__", [](const CompletionOutput& c) {
            return "CompletionOutput(text=" + py::repr(py::cast(c.text)).cast<std::string>() +
                   ", token_ids=" + py::repr(py::cast(c.token_ids)).cast<std::string>() +
                   ", finish_reason=" + (c.finish_reason.empty() ? std::string("None") : "'" + c.finish_reason + "'") +
                   ")";
        });

    py::class_<RequestMetrics>(m, "RequestMetrics")
        .def_readonly("arrival_time", &RequestMetrics::arrival_time)
        .def_readonly("first_scheduled_time", &RequestMetrics::first_scheduled_time)
        .def_readonly("first_token_time", &RequestMetrics::first_token_time)
        .def_readonly("last_token_time", &RequestMetrics::last_token_time)
        .def_readonly("finished_time", &RequestMetrics::finished_time)
        .def_readonly("num_prompt_tokens", &RequestMetrics::num_prompt_tokens)
        .def_readonly("num_generated_tokens", &RequestMetrics::num_generated_tokens)
        .def_readonly("num_preemptions", &RequestMetrics::num_preemptions)
        .def_property_readonly("time_to_first_token", &RequestMetrics::time_to_first_token)
        .def_property_readonly("time_per_output_token", &RequestMetrics::time_per_output_token);

    py::class_<RequestOutput>(m, "RequestOutput")
        .def_readonly("request_id", &RequestOutput::request_id)
        .def_property_readonly(
            "prompt",
            [](const RequestOutput& o) -> py::object { return o.prompt.empty() ? py::none() : py::cast(o.prompt); })
        .def_readonly("prompt_token_ids", &RequestOutput::prompt_token_ids)
        .def_readonly("outputs", &RequestOutput::outputs)
        .def_readonly("finished", &RequestOutput::finished)
        .def_property_readonly(
            "error",
            [](const RequestOutput& o) -> py::object { return o.error.empty() ? py::none() : py::cast(o.error); })
        .def_readonly("metrics", &RequestOutput::metrics)
        .def("__repr__", [](const RequestOutput& o) {
            const std::string prompt = o.prompt.empty() ? "None" : py::repr(py::cast(o.prompt)).cast<std::string>();
            std::string s = "RequestOutput(request_id=" + std::to_string(o.request_id) + ", prompt=" + prompt +
                            ", outputs=" + py::repr(py::cast(o.outputs)).cast<std::string>();
            if (!o.error.empty()) s += ", error=" + py::repr(py::cast(o.error)).cast<std::string>();
            return s + ")";
        });

    py::class_<ChatOptions>(m, "_ChatOptions");
    py::class_<Engine>(m, "_Engine")
        .def(py::init<const py::dict&>())
        .def("generate", &Engine::generate, py::arg("prompts"), py::arg("params"), py::arg("callback"),
             py::arg("chat") = ChatOptions{})
        .def("add_request", &Engine::add_request)
        .def("step",
             [](Engine& e) {
                 py::gil_scoped_release release;
                 return e.llm().step();
             })
        .def("abort_request", [](Engine& e, uint64_t id) { return e.llm().abort_request(id); })
        .def("has_unfinished_requests", [](Engine& e) { return e.llm().has_unfinished_requests(); })
        .def("encode", [](Engine& e, const std::string& t, bool special) { return e.llm().encode(t, special); })
        .def("decode", [](Engine& e, const std::vector<int32_t>& ids, bool skip) { return e.llm().decode(ids, skip); })
        .def("apply_chat_template", [](Engine& e, const std::string& messages_json,
                                       const ChatOptions& c) { return e.llm().apply_chat_template(messages_json, c); })
        .def("async_scheduling", [](Engine& e) { return e.llm().async_scheduling(); })
        .def("model_info",
             [](Engine& e) {
                 const ModelSummary& s = e.llm().model_info();
                 py::dict d;
                 d["model_type"] = s.model_type;
                 d["dir"] = s.dir;
                 d["vocab_size"] = s.vocab_size;
                 d["max_model_len"] = s.max_model_len;
                 d["eos_token_ids"] = s.eos_token_ids;
                 d["has_tokenizer"] = s.has_tokenizer;
                 d["weight_bytes"] = s.weight_bytes;
                 return d;
             })
        .def("memory_report",
             [](Engine& e) {
                 const MemoryReport r = e.llm().memory_report();
                 py::dict d;
                 d["budget_bytes"] = r.budget_bytes;
                 d["block_bytes"] = r.block_bytes;
                 d["num_blocks"] = r.num_blocks;
                 d["block_tokens"] = r.block_tokens;
                 d["fixed_blocks_per_seq"] = r.fixed_blocks_per_seq;
                 d["fixed_bytes_per_seq"] = r.fixed_bytes_per_seq;
                 d["bytes_per_token"] = r.bytes_per_token;
                 d["max_tokens_one_seq"] = r.max_tokens_one_seq;
                 d["max_concurrent_tokens"] = r.max_concurrent_tokens;
                 d["free_blocks"] = r.free_blocks;
                 return d;
             })
        .def("stats", [](Engine& e) {
            const EngineStats s = e.llm().stats();
            py::dict d;
            d["steps"] = s.steps;
            d["prompt_tokens"] = s.prompt_tokens;
            d["generated_tokens"] = s.generated_tokens;
            d["preemptions"] = s.preemptions;
            d["steps_prepared_ahead"] = s.steps_prepared_ahead;
            d["compute_seconds"] = s.compute_seconds;
            d["cpu_seconds"] = s.cpu_seconds;
            d["cpu_overlapped_seconds"] = s.cpu_overlapped_seconds;
            d["wait_seconds"] = s.wait_seconds;
            d["wall_seconds"] = s.wall_seconds;
            return d;
        });

    m.def("_chat_options", &to_chat, py::arg("thinking_mode") = "chat", py::arg("reasoning_effort") = py::none());
    m.def("_default_sampling_params", [] { return to_dict(SamplingParams{}); });
    m.def("_check_sampling_params", [](const py::object& p) { to_params(p); });
    m.def("default_model_dir", &default_model_dir);
}
