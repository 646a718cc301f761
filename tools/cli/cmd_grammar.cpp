// deepinfer grammar: compile a structured-output grammar and check texts against it.
//
//   deepinfer grammar (--regex R | --json-schema FILE | --json-object | --ebnf FILE | --choice S [--choice S ..])
//                     [--strict] [--tokenizer FILE] [--check TEXT | --check-jsonl FILE] [--stats] [--dump]
//                     [--whitespace flexible|compact] [--max-whitespace N] [--max-states N] [--max-compile-ms N]
//
// Exit 0 on success (whatever the checks print); 2 with a message when the grammar itself is invalid.
// --check prints "accept" when the whole text is a complete match, else "reject"; --check-jsonl does so
// for one JSON string per line. With --tokenizer the text is tokenized and fed token by token through
// the masks (as generation would); without it, byte by byte.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/file.h"
#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

constexpr const char* kUsage =
    "usage: deepinfer grammar (--regex R | --json-schema FILE | --json-object | --ebnf FILE | --choice S ...)\n"
    "                         [--strict] [--tokenizer FILE] [--check TEXT | --check-jsonl FILE] [--stats] [--dump]\n"
    "                         [--whitespace flexible|compact] [--max-whitespace N] [--max-states N]\n"
    "                         [--max-compile-ms N]\n"
    "Compiles a structured-output grammar. --check prints accept/reject for TEXT (a complete match);\n"
    "--check-jsonl reads one JSON string per line and prints accept/reject per line. --stats prints\n"
    "compile time and automaton size; --dump prints the grammar's rules. Exit 2 when the grammar is invalid.\n";

// Bytes 0..255 as single tokens, plus a stop token: byte-level checking without a tokenizer.
std::shared_ptr<const grammar::Vocabulary> byte_vocab() {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    toks.push_back("");
    return grammar::Vocabulary::create(std::move(toks), {256});
}

bool check_text(const std::shared_ptr<const grammar::CompiledGrammar>& g, const Tokenizer* tok,
                const std::string& text) {
    grammar::GrammarMatcher m(g);
    if (!tok) return m.accept_bytes(text) && m.can_terminate();
    std::vector<uint32_t> mask(g->vocab().mask_words());
    for (int32_t id : tok->encode(text, false)) {
        m.fill_mask(mask.data());
        if (!((mask[id >> 5] >> (id & 31)) & 1)) return false;
        if (!m.accept(id)) return false;
    }
    m.fill_mask(mask.data());
    return m.can_terminate();
}

}  // namespace

int cmd_grammar(int argc, char** argv) {
    grammar::GrammarSpec spec;
    int kinds = 0;
    std::string tokenizer_path, check_text_arg, check_jsonl;
    bool has_check = false, stats = false, dump = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            DI_CHECK(i + 1 < argc, "missing value for ", a, "\n", kUsage);
            return argv[++i];
        };
        auto number = [&]() -> int64_t {
            std::string v = value();
            try {
                size_t used = 0;
                int64_t n = std::stoll(v, &used);
                DI_CHECK(used == v.size() && n >= 0, "");
                return n;
            } catch (const std::exception&) {
                DI_THROW("bad value '", v, "' for ", a, " (expected a non-negative integer)");
            }
        };
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--regex") {
            spec.kind = grammar::GrammarKind::kRegex;
            spec.value = value();
            ++kinds;
        } else if (a == "--json-schema") {
            spec.kind = grammar::GrammarKind::kJsonSchema;
            spec.value = read_file(value());
            ++kinds;
        } else if (a == "--json-object") {
            spec.kind = grammar::GrammarKind::kJsonObject;
            ++kinds;
        } else if (a == "--ebnf") {
            spec.kind = grammar::GrammarKind::kEbnf;
            spec.value = read_file(value());
            ++kinds;
        } else if (a == "--choice") {
            if (spec.kind != grammar::GrammarKind::kChoice || spec.choices.empty()) ++kinds;
            spec.kind = grammar::GrammarKind::kChoice;
            spec.choices.push_back(value());
        } else if (a == "--strict") {
            spec.options.strict = true;
        } else if (a == "--tokenizer") {
            tokenizer_path = value();
        } else if (a == "--check") {
            DI_CHECK(!has_check, "give one of --check / --check-jsonl");
            check_text_arg = value();
            has_check = true;
        } else if (a == "--check-jsonl") {
            DI_CHECK(!has_check, "give one of --check / --check-jsonl");
            check_jsonl = value();
            has_check = true;
        } else if (a == "--stats") {
            stats = true;
        } else if (a == "--dump") {
            dump = true;
        } else if (a == "--whitespace") {
            std::string w = value();
            DI_CHECK(w == "flexible" || w == "compact", "--whitespace must be flexible or compact");
            spec.options.compact_json = w == "compact";
        } else if (a == "--max-whitespace") {
            spec.options.max_whitespace = static_cast<int32_t>(number());
        } else if (a == "--max-states") {
            spec.options.max_states = number();
        } else if (a == "--max-compile-ms") {
            spec.options.max_compile_ms = number();
        } else {
            DI_THROW("unknown option '", a, "'\n", kUsage);
        }
    }
    DI_CHECK(kinds == 1, "give exactly one of --regex, --json-schema, --json-object, --ebnf, --choice\n", kUsage);

    std::unique_ptr<Tokenizer> tok;
    std::shared_ptr<const grammar::Vocabulary> vocab;
    if (!tokenizer_path.empty()) {
        tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path));
        vocab = grammar::Vocabulary::from_tokenizer(*tok);
    } else {
        vocab = byte_vocab();
    }
    grammar::GrammarCompiler compiler(vocab);
    std::shared_ptr<const grammar::CompiledGrammar> g;
    try {
        g = compiler.compile(spec);
    } catch (const Error& e) {
        std::fprintf(stderr, "deepinfer grammar: invalid %s: %s\n", grammar::grammar_kind_name(spec.kind), e.what());
        return 2;
    }
    if (stats) {
        const grammar::GrammarStats& s = g->stats();
        std::printf("compile_ms %.3f\nrules %d\nautomata %d\nstates %lld\nnfa_states %lld\n", s.compile_ms, s.num_rules,
                    s.num_automata, static_cast<long long>(s.num_states), static_cast<long long>(s.nfa_states));
        if (tok) {
            grammar::GrammarMatcher m(g);
            std::vector<uint32_t> mask(vocab->mask_words());
            auto t0 = std::chrono::steady_clock::now();
            int32_t n = m.fill_mask(mask.data());
            double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            std::printf("first_mask_us %.1f\nfirst_mask_tokens %d\n", us, n);
        }
        for (const auto& w : s.warnings) std::printf("warning %s\n", w.c_str());
    }
    if (dump) std::fputs(g->describe().c_str(), stdout);
    if (!check_jsonl.empty()) {
        std::istringstream in(read_file(check_jsonl));
        std::string line;
        int64_t lineno = 0;
        while (std::getline(in, line)) {
            ++lineno;
            if (line.empty()) continue;
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::parse_error& e) {
                DI_THROW(check_jsonl, ":", lineno, ": not a JSON string: ", e.what());
            }
            DI_CHECK(j.is_string(), check_jsonl, ":", lineno, ": expected a JSON string");
            std::puts(check_text(g, tok.get(), j.get<std::string>()) ? "accept" : "reject");
        }
    } else if (has_check) {
        std::puts(check_text(g, tok.get(), check_text_arg) ? "accept" : "reject");
    }
    return 0;
}

}  // namespace deepinfer::cli
