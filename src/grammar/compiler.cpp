#include <chrono>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "deepinfer/error.h"
#include "grammar/compiled.h"
#include "grammar/frontend.h"
#include "grammar/grammar.h"

namespace deepinfer::grammar {

const char* grammar_kind_name(GrammarKind kind) {
    switch (kind) {
        case GrammarKind::kRegex:
            return "regex";
        case GrammarKind::kJsonSchema:
            return "json_schema";
        case GrammarKind::kJsonObject:
            return "json_object";
        case GrammarKind::kEbnf:
            return "ebnf";
        case GrammarKind::kChoice:
            return "choice";
    }
    return "?";
}

std::string GrammarSpec::cache_key() const {
    std::string key = grammar_kind_name(kind);
    key += '\0';
    key += std::to_string(options.compact_json) + "," + std::to_string(options.max_whitespace) + "," +
           std::to_string(options.strict) + "," + std::to_string(options.max_states) + "," +
           std::to_string(options.max_compile_ms);
    key += '\0';
    if (kind == GrammarKind::kChoice) {
        for (const auto& c : choices) {
            key += std::to_string(c.size()) + ":" + c;
        }
    } else {
        key += value;
    }
    return key;
}

GrammarSpec parse_so_args(std::string_view json_text) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::parse_error& e) {
        DI_THROW("so_args is not valid JSON: ", e.what());
    }
    DI_CHECK(j.is_object(), "so_args must be a JSON object");
    DI_CHECK(j.contains("type") && j["type"].is_string(), "so_args needs a string \"type\"");
    GrammarSpec spec;
    std::string type = j["type"];
    auto value_text = [&]() -> std::string {
        DI_CHECK(j.contains("value"), "so_args of type ", type, " needs a \"value\"");
        const auto& v = j["value"];
        if (v.is_string()) return v.get<std::string>();
        return v.dump();
    };
    if (type == "regex") {
        spec.kind = GrammarKind::kRegex;
        DI_CHECK(j.contains("value") && j["value"].is_string(), "so_args regex \"value\" must be a string");
        spec.value = j["value"];
    } else if (type == "json_schema" || type == "json") {
        spec.kind = GrammarKind::kJsonSchema;
        spec.value = value_text();
    } else if (type == "json_object") {
        spec.kind = GrammarKind::kJsonObject;
    } else if (type == "ebnf" || type == "grammar") {
        spec.kind = GrammarKind::kEbnf;
        DI_CHECK(j.contains("value") && j["value"].is_string(), "so_args ebnf \"value\" must be a string");
        spec.value = j["value"];
    } else if (type == "choice") {
        spec.kind = GrammarKind::kChoice;
        DI_CHECK(j.contains("value") && j["value"].is_array(), "so_args choice \"value\" must be a list of strings");
        for (const auto& c : j["value"]) {
            DI_CHECK(c.is_string(), "so_args choice \"value\" must be a list of strings");
            spec.choices.push_back(c.get<std::string>());
        }
    } else {
        DI_THROW("unknown so_args type '", type, "' (expected regex, json_schema, json_object, ebnf or choice)");
    }
    if (j.contains("strict")) {
        DI_CHECK(j["strict"].is_boolean(), "so_args \"strict\" must be a boolean");
        spec.options.strict = j["strict"];
    }
    if (j.contains("whitespace")) {
        std::string ws = j["whitespace"].is_string() ? j["whitespace"].get<std::string>() : "";
        DI_CHECK(ws == "flexible" || ws == "compact", "so_args \"whitespace\" must be \"flexible\" or \"compact\"");
        spec.options.compact_json = ws == "compact";
    }
    if (j.contains("max_whitespace")) {
        DI_CHECK(j["max_whitespace"].is_number_integer() && j["max_whitespace"] >= 0,
                 "so_args \"max_whitespace\" must be a non-negative integer");
        spec.options.max_whitespace = j["max_whitespace"];
    }
    return spec;
}

// ---------------------------------------------------------------------------------------------

CompiledGrammar::CompiledGrammar(std::unique_ptr<CompiledGrammarImpl> impl) : impl_(std::move(impl)) {}
CompiledGrammar::~CompiledGrammar() = default;
const Vocabulary& CompiledGrammar::vocab() const { return *impl_->vocab; }
const GrammarStats& CompiledGrammar::stats() const { return impl_->stats; }
std::string CompiledGrammar::describe() const { return impl_->description; }

struct GrammarCompiler::State {
    std::mutex mu;
    size_t capacity = 0;
    std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru;  // front = most recent
    std::unordered_map<std::string, decltype(lru)::iterator> index;
    size_t hits = 0, misses = 0;
    std::mutex shared_mu;
    std::unordered_map<std::string, std::shared_ptr<MaskTable>> shared_tables;      // leaf rule masks
    std::unordered_map<std::string, std::shared_ptr<ClassMaskCache>> class_caches;  // counted strings
};

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t cache_capacity)
    : vocab_(std::move(vocab)), state_(std::make_unique<State>()) {
    DI_CHECK(vocab_ != nullptr, "GrammarCompiler needs a vocabulary");
    state_->capacity = cache_capacity;
}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
    std::string key = spec.cache_key();
    State& st = *state_;
    {
        std::lock_guard<std::mutex> lock(st.mu);
        auto it = st.index.find(key);
        if (it != st.index.end()) {
            st.lru.splice(st.lru.begin(), st.lru, it->second);
            ++st.hits;
            return it->second->second;
        }
        ++st.misses;
    }
    auto t0 = std::chrono::steady_clock::now();
    const CompileOptions& o = spec.options;
    DI_CHECK(o.max_states > 0 && o.max_compile_ms > 0, "grammar compile limits must be positive");
    DI_CHECK(o.max_whitespace >= 0, "max_whitespace must be >= 0");
    Lowered lowered;
    switch (spec.kind) {
        case GrammarKind::kRegex:
            lowered = lower_regex(spec.value);
            break;
        case GrammarKind::kJsonSchema:
            lowered = lower_json_schema(spec.value, o);
            break;
        case GrammarKind::kJsonObject:
            lowered = lower_json_object(o);
            break;
        case GrammarKind::kEbnf:
            lowered = lower_ebnf(spec.value);
            break;
        case GrammarKind::kChoice:
            lowered = lower_choice(spec.choices);
            break;
    }
    BuildLimits limits;
    limits.max_states = o.max_states;
    limits.deadline = t0 + std::chrono::milliseconds(o.max_compile_ms);
    Automata automata = build_automata(lowered.grammar, limits);
    auto shared = [&st](const std::string& sig, int32_t n) {
        std::lock_guard<std::mutex> lock(st.shared_mu);
        auto it = st.shared_tables.find(sig);
        if (it != st.shared_tables.end()) return it->second;
        if (st.shared_tables.size() >= 4096) {
            // Drop tables no grammar uses any more.
            for (auto i = st.shared_tables.begin(); i != st.shared_tables.end();) {
                i = i->second.use_count() == 1 ? st.shared_tables.erase(i) : std::next(i);
            }
        }
        auto table = std::make_shared<MaskTable>(n);
        st.shared_tables.emplace(sig, table);
        return table;
    };
    auto shared_classes = [&st](const std::string& sig) {
        std::lock_guard<std::mutex> lock(st.shared_mu);
        auto it = st.class_caches.find(sig);
        if (it != st.class_caches.end()) return it->second;
        if (st.class_caches.size() >= 1024) {
            for (auto i = st.class_caches.begin(); i != st.class_caches.end();) {
                i = i->second.use_count() == 1 ? st.class_caches.erase(i) : std::next(i);
            }
        }
        auto cache = std::make_shared<ClassMaskCache>();
        st.class_caches.emplace(sig, cache);
        return cache;
    };
    auto impl = std::make_unique<CompiledGrammarImpl>(vocab_, automata, shared, shared_classes);
    impl->description = lowered.grammar.to_string();
    GrammarStats& s = impl->stats;
    s.num_rules = lowered.grammar.num_rules();
    s.num_automata = static_cast<int32_t>(automata.dfas.size());
    s.num_states = impl->num_states();  // tabulated and virtual
    s.nfa_states = automata.nfa_states;
    s.warnings = std::move(lowered.warnings);
    s.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::shared_ptr<const CompiledGrammar> compiled(new CompiledGrammar(std::move(impl)));
    {
        std::lock_guard<std::mutex> lock(st.mu);
        auto it = st.index.find(key);
        if (it != st.index.end()) return it->second->second;  // compiled concurrently
        if (st.capacity == 0) return compiled;
        st.lru.emplace_front(key, compiled);
        st.index[key] = st.lru.begin();
        while (st.lru.size() > st.capacity) {
            st.index.erase(st.lru.back().first);
            st.lru.pop_back();
        }
    }
    return compiled;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_regex(std::string_view regex, const CompileOptions& o) {
    return compile(GrammarSpec{GrammarKind::kRegex, std::string(regex), {}, o});
}
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_json_schema(std::string_view schema,
                                                                            const CompileOptions& o) {
    return compile(GrammarSpec{GrammarKind::kJsonSchema, std::string(schema), {}, o});
}
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_json_object(const CompileOptions& o) {
    return compile(GrammarSpec{GrammarKind::kJsonObject, "", {}, o});
}
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_ebnf(std::string_view ebnf, const CompileOptions& o) {
    return compile(GrammarSpec{GrammarKind::kEbnf, std::string(ebnf), {}, o});
}
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_choice(std::vector<std::string> choices,
                                                                       const CompileOptions& o) {
    return compile(GrammarSpec{GrammarKind::kChoice, "", std::move(choices), o});
}

size_t GrammarCompiler::cache_hits() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->hits;
}
size_t GrammarCompiler::cache_misses() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->misses;
}
void GrammarCompiler::clear_cache() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->lru.clear();
    state_->index.clear();
}

// ---------------------------------------------------------------------------------------------

Lowered lower_choice(const std::vector<std::string>& choices) {
    DI_CHECK(!choices.empty(), "choice grammar needs at least one choice");
    Lowered out;
    Grammar& g = out.grammar;
    int32_t root = g.add_rule("root");
    std::vector<int32_t> alts;
    for (const auto& c : choices) alts.push_back(g.bytes(c));
    g.set_body(root, g.alt(alts));
    g.set_root(root);
    return out;
}

}  // namespace deepinfer::grammar
