// grammar_bench: JSON-schema and regex constrained decoding on a real vocabulary, single thread.
//
//   grammar_bench --tokenizer tests/data/tokenizer/deepseek_v4/tokenizer.json.gz
//                 --schemas /work/shared/fixtures/maskbench/schemas.jsonl.gz [--limit N] [--json OUT.json]
//
// For every schema: compile; feed every test instance (json.dumps(data, ensure_ascii=False), separators
// ", " and ": ", tokenized without special tokens) token by token: fill_mask, check the token is allowed,
// accept. A valid instance must be accepted whole and end complete; an invalid one must be rejected.
// A schema passes when it compiles and classifies all its instances right (MaskBench's metric).
// Reports compile time, time to first mask (cold caches), and per-token mask time (avg/p50/p99), all
// including cold cache fills, plus the warm (second pass) mask time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/file.h"
#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }


struct Stats {
    std::vector<double> v;
    void add(double x) { v.push_back(x); }
    double avg() const {
        double s = 0;
        for (double x : v) s += x;
        return v.empty() ? 0 : s / v.size();
    }
    double pct(double p) {
        if (v.empty()) return 0;
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()))];
    }
    double max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

std::shared_ptr<const grammar::Vocabulary> load_vocab(const std::string& path, int32_t mask_size) {
    Tokenizer tok = Tokenizer::from_file(path);
    return grammar::Vocabulary::from_tokenizer(tok, std::nullopt, std::max(mask_size, tok.vocab_size()));
}

std::string classify_error(const std::string& what) {
    std::string s = what;
    size_t p = s.find(": ", s.find("json schema error at ") == 0 ? 21 : 0);
    if (s.rfind("json schema error at ", 0) == 0 && p != std::string::npos) s = s.substr(p + 2);
    if (s.size() > 70) s = s.substr(0, 70);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::string tokenizer_path, schemas_path = "/work/shared/fixtures/maskbench/schemas.jsonl.gz", json_out, fail_out;
    int64_t limit = -1, start = 0;
    bool warm_pass = true, verbose = false, compile_only = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "missing value for %s\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--tokenizer") {
            tokenizer_path = next();
        } else if (a == "--schemas") {
            schemas_path = next();
        } else if (a == "--limit") {
            limit = std::stoll(next());
        } else if (a == "--start") {
            start = std::stoll(next());
        } else if (a == "--json") {
            json_out = next();
        } else if (a == "--failures") {
            fail_out = next();
        } else if (a == "--compile-only") {
            compile_only = true;
        } else if (a == "--verbose") {
            verbose = true;
        } else if (a == "--no-warm") {
            warm_pass = false;
        } else {
            std::fprintf(stderr,
                         "usage: grammar_bench --tokenizer FILE [--schemas FILE] [--limit N] [--start N] [--json OUT] "
                         "[--failures OUT.jsonl] [--no-warm]\n");
            return 2;
        }
    }
    if (tokenizer_path.empty()) {
        tokenizer_path = std::string(DI_SOURCE_DIR) + "/tests/data/tokenizer/deepseek_v4/tokenizer.json.gz";
    }
    auto t_load = Clock::now();
    Tokenizer tok = Tokenizer::from_file(tokenizer_path);
    auto vocab = load_vocab(tokenizer_path, 129280);
    double vocab_ms = us_since(t_load) / 1000;
    grammar::GrammarCompiler compiler(vocab, 0);  // no grammar cache: every schema compiles cold
    std::vector<uint32_t> mask(vocab->mask_words());

    std::istringstream lines(read_file(schemas_path));
    std::string line;
    int64_t index = -1, n_schemas = 0, n_with_tests = 0, n_compiled = 0, n_passed = 0, n_passed_with_tests = 0;
    int64_t n_valid = 0, n_invalid = 0, valid_ok = 0, invalid_ok = 0, n_tokens = 0;
    Stats compile_ms, first_mask_us, mask_us, warm_mask_us;
    std::map<std::string, int64_t> errors;
    std::map<std::string, std::pair<int64_t, int64_t>> by_source;  // passed, total
    std::ofstream fails;
    if (!fail_out.empty()) fails.open(fail_out);
    auto t_all = Clock::now();
    while (std::getline(lines, line)) {
        ++index;
        if (index < start) continue;
        if (limit >= 0 && n_schemas >= limit) break;
        Json row = Json::parse(line);
        ++n_schemas;
        std::string id = row["id"];
        std::string source = id.substr(0, id.find("---"));
        if (source.rfind("BFCL", 0) == 0) source = "BFCL";
        auto& src = by_source[source];
        src.second++;
        const Json& tests = row["tests"];
        if (!tests.empty()) ++n_with_tests;
        std::string schema_text = row["schema"].dump();
        std::shared_ptr<const grammar::CompiledGrammar> g;
        auto t0 = Clock::now();
        try {
            g = compiler.compile_json_schema(schema_text);
        } catch (const Error& e) {
            errors[classify_error(e.what())]++;
            if (fails.is_open()) fails << Json{{"index", index}, {"id", id}, {"error", e.what()}}.dump() << "\n";
            continue;
        }
        compile_ms.add(us_since(t0) / 1000);
        ++n_compiled;
        if (verbose) {
            const auto& st = g->stats();
            std::fprintf(stderr, "schema %lld %s: compile %.1f ms, %d rules, %d automata, %lld states, %lld nfa\n",
                         static_cast<long long>(index), id.c_str(), st.compile_ms, st.num_rules, st.num_automata,
                         static_cast<long long>(st.num_states), static_cast<long long>(st.nfa_states));
        }
        double schema_mask_us = 0;
        if (compile_only) continue;
        bool all_ok = true;
        bool first = true;
        for (const auto& t : tests) {
            bool valid = t["valid"];
            const std::string text = python_json_dumps(t["data"]);  // the instance as Python's json.dumps writes it
            std::vector<int32_t> ids = tok.encode(text, false);
            grammar::GrammarMatcher m(g);
            bool accepted = true;
            size_t k = 0;
            for (; k < ids.size(); ++k) {
                auto tm = Clock::now();
                m.fill_mask(mask.data());
                double dt = us_since(tm);
                mask_us.add(dt);
                schema_mask_us += dt;
                if (first) {
                    first_mask_us.add(dt);
                    first = false;
                }
                ++n_tokens;
                int32_t id_k = ids[k];
                bool allowed = (mask[id_k >> 5] >> (id_k & 31)) & 1;
                bool ok = m.accept(id_k);
                if (allowed != ok) {
                    std::fprintf(stderr, "MASK/ACCEPT MISMATCH schema %lld token %zu\n", static_cast<long long>(index),
                                 k);
                    return 3;
                }
                if (!ok) {
                    accepted = false;
                    break;
                }
            }
            if (accepted) {
                auto tm = Clock::now();
                m.fill_mask(mask.data());
                mask_us.add(us_since(tm));
                accepted = m.can_terminate();
            }
            bool right = accepted == valid;
            if (valid) {
                ++n_valid;
                valid_ok += right;
            } else {
                ++n_invalid;
                invalid_ok += right;
            }
            if (!right) {
                all_ok = false;
                if (fails.is_open()) {
                    fails << Json{{"index", index},
                                  {"id", id},
                                  {"valid", valid},
                                  {"stopped_at_token", k},
                                  {"prefix", valid ? tok.decode(std::vector<int32_t>(
                                                         ids.begin(), ids.begin() + std::min(k + 1, ids.size())))
                                                   : text}}
                                 .dump()
                          << "\n";
                }
            }
            if (warm_pass && valid && right) {
                // Second pass over the same tokens: caches are warm.
                grammar::GrammarMatcher w(g);
                for (int32_t id_k : ids) {
                    auto tm = Clock::now();
                    w.fill_mask(mask.data());
                    warm_mask_us.add(us_since(tm));
                    w.accept(id_k);
                }
            }
        }
        if (verbose)
            std::fprintf(stderr, "schema %lld: masks %.1f ms\n", static_cast<long long>(index), schema_mask_us / 1000);
        if (all_ok) {
            ++n_passed;
            ++src.first;
            if (!tests.empty()) ++n_passed_with_tests;
        }
    }
    double total_s = us_since(t_all) / 1e6;

    // Regex suite: each pattern with texts it must accept, token by token through the masks.
    struct RegexCase {
        const char* pattern;
        std::vector<std::string> texts;
    };
    const std::vector<RegexCase> regexes = {
        {"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}", {"john.doe+news@example.co.uk", "a@b.io"}},
        {"\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}", {"(555) 123-4567", "555-123-4567"}},
        {"\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])", {"2024-02-29", "1999-12-31"}},
        {"https?://[a-z0-9.-]+(/[a-zA-Z0-9._~%-]*)*(\\?[a-z0-9=&]*)?", {"https://example.com/path/to/page?x=1&y=2"}},
        {"((25[0-5]|2[0-4]\\d|1?\\d?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1?\\d?\\d)", {"192.168.100.254"}},
        {"#[0-9a-fA-F]{6}", {"#1a2B3c"}},
        {"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", {"123e4567-e89b-12d3-a456-426655440000"}},
        {"(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)(-[0-9A-Za-z.-]+)?", {"1.12.3-rc.1"}},
        {"[A-Z][^.!?\\n]*[.!?]( [A-Z][^.!?\\n]*[.!?]){0,4}",
         {"The quick brown fox jumps over the lazy dog. It was not amused! Why would it be?"}},
        {"(yes|no|maybe)", {"maybe"}},
        {"\\w+( \\w+){0,30}", {"constrained decoding keeps every token inside the grammar"}},
        {"\\p{L}+(, \\p{L}+)*", {"Zürich, Genève, 東京, Москва"}},
        {".{0,500}", {"Any single line of text up to five hundred characters, with punctuation: (ok) [fine] {sure}."}},
        {"\\{\"name\": \"[^\"]{1,40}\", \"age\": \\d{1,3}\\}", {"{\"name\": \"Ada Lovelace\", \"age\": 36}"}},
        {"(\\d+(\\.\\d+)?[+*/-])+\\d+(\\.\\d+)?", {"12.5*3+4/2-1"}},
    };
    Stats regex_compile_ms, regex_mask_us, regex_warm_us;
    int64_t regex_ok = 0, regex_texts = 0;
    for (const auto& rc : regexes) {
        auto t0 = Clock::now();
        auto g = compiler.compile_regex(rc.pattern);
        regex_compile_ms.add(us_since(t0) / 1000);
        for (const auto& text : rc.texts) {
            ++regex_texts;
            grammar::GrammarMatcher m(g);
            bool ok = true;
            for (int32_t id : tok.encode(text, false)) {
                auto tm = Clock::now();
                m.fill_mask(mask.data());
                regex_mask_us.add(us_since(tm));
                ok = ok && ((mask[id >> 5] >> (id & 31)) & 1) && m.accept(id);
                if (!ok) break;
            }
            regex_ok += ok && m.can_terminate();
            grammar::GrammarMatcher w(g);  // again, warm
            for (int32_t id : tok.encode(text, false)) {
                auto tm = Clock::now();
                w.fill_mask(mask.data());
                regex_warm_us.add(us_since(tm));
                if (!w.accept(id)) break;
            }
        }
    }

    auto pct = [](int64_t a, int64_t b) { return b ? 100.0 * a / b : 0.0; };
    std::printf("vocabulary: %d tokens (mask %d bits), loaded in %.0f ms\n", vocab->num_tokens(), vocab->size(),
                vocab_ms);
    std::printf("schemas: %lld (%lld with tests), wall %.1f s\n", static_cast<long long>(n_schemas),
                static_cast<long long>(n_with_tests), total_s);
    std::printf("| metric | value |\n|---|---|\n");
    std::printf("| schemas compiled | %lld / %lld (%.1f%%) |\n", static_cast<long long>(n_compiled),
                static_cast<long long>(n_schemas), pct(n_compiled, n_schemas));
    std::printf("| schemas passing all instances (of all) | %lld / %lld (%.1f%%) |\n", static_cast<long long>(n_passed),
                static_cast<long long>(n_schemas), pct(n_passed, n_schemas));
    std::printf("| schemas passing all instances (of those with tests) | %lld / %lld (%.1f%%) |\n",
                static_cast<long long>(n_passed_with_tests), static_cast<long long>(n_with_tests),
                pct(n_passed_with_tests, n_with_tests));
    std::printf("| valid instances accepted | %lld / %lld (%.1f%%) |\n", static_cast<long long>(valid_ok),
                static_cast<long long>(n_valid), pct(valid_ok, n_valid));
    std::printf("| invalid instances rejected | %lld / %lld (%.1f%%) |\n", static_cast<long long>(invalid_ok),
                static_cast<long long>(n_invalid), pct(invalid_ok, n_invalid));
    std::printf("| compile ms: avg / p50 / p99 / max | %.2f / %.2f / %.2f / %.1f |\n", compile_ms.avg(),
                compile_ms.pct(50), compile_ms.pct(99), compile_ms.max());
    std::printf("| first mask us (cold): avg / p50 / p99 | %.0f / %.0f / %.0f |\n", first_mask_us.avg(),
                first_mask_us.pct(50), first_mask_us.pct(99));
    std::printf("| mask us per token (incl. cold fills): avg / p50 / p99 / max | %.1f / %.1f / %.1f / %.0f |\n",
                mask_us.avg(), mask_us.pct(50), mask_us.pct(99), mask_us.max());
    std::printf("| mask us per token (warm): avg / p50 / p99 | %.1f / %.1f / %.1f |\n", warm_mask_us.avg(),
                warm_mask_us.pct(50), warm_mask_us.pct(99));
    std::printf("| tokens masked | %lld |\n", static_cast<long long>(n_tokens));
    std::printf("| regex suite: texts accepted | %lld / %lld (%zu patterns) |\n", static_cast<long long>(regex_ok),
                static_cast<long long>(regex_texts), regexes.size());
    std::printf("| regex suite: compile ms avg / max | %.2f / %.2f |\n", regex_compile_ms.avg(),
                regex_compile_ms.max());
    std::printf("| regex suite: mask us per token avg / p50 / p99 (incl. cold fills) | %.1f / %.1f / %.1f |\n",
                regex_mask_us.avg(), regex_mask_us.pct(50), regex_mask_us.pct(99));
    std::printf("| regex suite: mask us per token avg / p50 / p99 (warm) | %.1f / %.1f / %.1f |\n", regex_warm_us.avg(),
                regex_warm_us.pct(50), regex_warm_us.pct(99));
    std::printf("\nby source (passing / schemas):\n");
    for (const auto& [s, pt] : by_source)
        std::printf("  %-18s %5lld / %5lld\n", s.c_str(), static_cast<long long>(pt.first),
                    static_cast<long long>(pt.second));
    std::vector<std::pair<int64_t, std::string>> errs;
    for (const auto& [e, c] : errors) errs.push_back({c, e});
    std::sort(errs.rbegin(), errs.rend());
    std::printf("\ncompile errors (top 25 of %zu kinds):\n", errs.size());
    for (size_t i = 0; i < errs.size() && i < 25; ++i)
        std::printf("  %5lld  %s\n", static_cast<long long>(errs[i].first), errs[i].second.c_str());

    if (!json_out.empty()) {
        Json j{{"schemas", n_schemas},
               {"schemas_with_tests", n_with_tests},
               {"compiled", n_compiled},
               {"passed", n_passed},
               {"passed_with_tests", n_passed_with_tests},
               {"valid", n_valid},
               {"valid_accepted", valid_ok},
               {"invalid", n_invalid},
               {"invalid_rejected", invalid_ok},
               {"compile_ms",
                {{"avg", compile_ms.avg()},
                 {"p50", compile_ms.pct(50)},
                 {"p99", compile_ms.pct(99)},
                 {"max", compile_ms.max()}}},
               {"first_mask_us",
                {{"avg", first_mask_us.avg()}, {"p50", first_mask_us.pct(50)}, {"p99", first_mask_us.pct(99)}}},
               {"mask_us",
                {{"avg", mask_us.avg()}, {"p50", mask_us.pct(50)}, {"p99", mask_us.pct(99)}, {"max", mask_us.max()}}},
               {"warm_mask_us",
                {{"avg", warm_mask_us.avg()}, {"p50", warm_mask_us.pct(50)}, {"p99", warm_mask_us.pct(99)}}},
               {"tokens", n_tokens},
               {"regex",
                {{"patterns", regexes.size()},
                 {"texts", regex_texts},
                 {"accepted", regex_ok},
                 {"compile_ms_avg", regex_compile_ms.avg()},
                 {"mask_us_avg", regex_mask_us.avg()},
                 {"mask_us_p50", regex_mask_us.pct(50)},
                 {"mask_us_p99", regex_mask_us.pct(99)},
                 {"warm_mask_us_avg", regex_warm_us.avg()},
                 {"warm_mask_us_p99", regex_warm_us.pct(99)}}},
               {"wall_s", total_s}};
        std::ofstream(json_out) << j.dump(2) << "\n";
    }
    return 0;
}
