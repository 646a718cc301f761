// Structured output: regex, JSON schema, free JSON, choice and EBNF grammars compiled against a token
// vocabulary into token masks.
//
//   auto vocab = grammar::Vocabulary::create(token_bytes, stop_ids, special_ids, model_vocab_size);
//   grammar::GrammarCompiler compiler(vocab);                  // one per vocabulary; caches grammars
//   auto g = compiler.compile({grammar::GrammarKind::kJsonSchema, schema_text});
//   grammar::GrammarMatcher m(g);                               // one per request
//   m.fill_mask(mask.data());   // uint32 words: bit (id % 32) of word (id / 32) = token id allowed
//   m.accept(token);            // false (state unchanged) when the token is not allowed
//   m.rollback(k);              // undo the last k accepted tokens (speculative decoding)
//
// Grammar semantics (the CLI contract in docs/grammar.md): a regex matches the whole text (ECMAScript
// syntax, `.` is any character but \n); an EBNF grammar starts at rule `root`; a JSON schema emits
// properties in the schema's order, `additionalProperties` absent means allowed unless `strict`; JSON
// whitespace between tokens is bounded (20 characters by default) or absent (compact).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::grammar {

struct TokenTrie;

// The token vocabulary a grammar is compiled against: the raw bytes of every token.
class Vocabulary {
public:
    // token_bytes[i]: raw bytes of token i. stop_ids: tokens that end generation (allowed once the
    // grammar is complete). special_ids: tokens that never match grammar text (control tokens).
    // mask_size: the model's vocabulary size when larger than token_bytes (padding ids never match).
    static std::shared_ptr<const Vocabulary> create(std::vector<std::string> token_bytes, std::vector<int32_t> stop_ids,
                                                    std::vector<int32_t> special_ids = {}, int32_t mask_size = 0);
    // The first num_tokens tokens of a tokenizer (all when num_tokens <= 0), its special tokens marked;
    // stop_ids default to the tokenizer's EOS.
    static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tok,
                                                            std::optional<std::vector<int32_t>> stop_ids = {},
                                                            int32_t mask_size = 0, int32_t num_tokens = 0);
    ~Vocabulary();

    int32_t size() const { return size_; }  // number of mask bits
    int32_t mask_words() const { return (size_ + 31) / 32; }
    const std::string& token(int32_t id) const { return tokens_[id]; }
    int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    bool is_stop(int32_t id) const;
    bool is_special(int32_t id) const;  // stop ids included
    const TokenTrie& trie() const { return *trie_; }
    uint64_t fingerprint() const { return fingerprint_; }

private:
    Vocabulary() = default;
    int32_t size_ = 0;
    std::vector<std::string> tokens_;
    std::vector<int32_t> stop_ids_;
    std::vector<uint8_t> special_;  // [num_tokens] 1 = special, 2 = stop
    std::unique_ptr<TokenTrie> trie_;
    uint64_t fingerprint_ = 0;
};

enum class GrammarKind { kRegex, kJsonSchema, kJsonObject, kEbnf, kChoice };

const char* grammar_kind_name(GrammarKind kind);

struct CompileOptions {
    // JSON (schemas and json_object): whitespace allowed between tokens, as runs of at most
    // `max_whitespace` characters from [ \t\n\r]; compact_json allows none.
    bool compact_json = false;
    int32_t max_whitespace = 20;
    // JSON schema: `additionalProperties` absent means false (OpenAI strict mode).
    bool strict = false;
    // Limits so that one request cannot stall the engine.
    int64_t max_states = 200000;    // DFA states over all rules
    int64_t max_compile_ms = 5000;  // wall-clock budget for one compile
};

struct GrammarSpec {
    GrammarKind kind = GrammarKind::kRegex;
    std::string value;                 // regex, schema JSON, EBNF text (unused for kJsonObject, kChoice)
    std::vector<std::string> choices;  // kChoice: the allowed texts
    CompileOptions options;

    std::string cache_key() const;
};

// Parses SamplingParams::so_args as JSON: {"type": "regex"|"json_schema"|"json_object"|"ebnf"|"choice",
// "value": ..., "strict": bool, "whitespace": "flexible"|"compact", "max_whitespace": N}. For json_schema,
// "value" may be the schema object or its text; for choice, a list of strings.
GrammarSpec parse_so_args(std::string_view json_text);

struct GrammarStats {
    double compile_ms = 0;
    int32_t num_rules = 0;     // IR rules from the front end
    int32_t num_automata = 0;  // rules left as separate DFAs (recursion, shared lexical rules)
    int64_t num_states = 0;    // DFA states in total
    int64_t nfa_states = 0;
    std::vector<std::string> warnings;  // e.g. JSON schema annotations that were not enforced
};

class CompiledGrammarImpl;

// A grammar bound to a vocabulary. Immutable apart from lazily filled, thread-safe mask caches;
// share it between requests.
class CompiledGrammar {
public:
    ~CompiledGrammar();
    const Vocabulary& vocab() const;
    const GrammarStats& stats() const;
    std::string describe() const;  // the grammar's rules as EBNF-like text
    const CompiledGrammarImpl& impl() const { return *impl_; }

private:
    friend class GrammarCompiler;
    explicit CompiledGrammar(std::unique_ptr<CompiledGrammarImpl> impl);
    std::unique_ptr<CompiledGrammarImpl> impl_;
};

// Compiles grammars for one vocabulary, caching them by (spec) and sharing per-state masks of common
// lexical rules (JSON strings, formats) across grammars. Thread-safe.
class GrammarCompiler {
public:
    explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t cache_capacity = 512);
    ~GrammarCompiler();

    // Throws deepinfer::Error with the position and reason for bad input, unsupported features and
    // exceeded limits.
    std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
    std::shared_ptr<const CompiledGrammar> compile_regex(std::string_view regex, const CompileOptions& o = {});
    std::shared_ptr<const CompiledGrammar> compile_json_schema(std::string_view schema, const CompileOptions& o = {});
    std::shared_ptr<const CompiledGrammar> compile_json_object(const CompileOptions& o = {});
    std::shared_ptr<const CompiledGrammar> compile_ebnf(std::string_view ebnf, const CompileOptions& o = {});
    std::shared_ptr<const CompiledGrammar> compile_choice(std::vector<std::string> choices,
                                                          const CompileOptions& o = {});

    const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }
    size_t cache_hits() const;
    size_t cache_misses() const;
    void clear_cache();

private:
    struct State;
    std::shared_ptr<const Vocabulary> vocab_;
    std::unique_ptr<State> state_;
};

// Per-request matcher. Not thread-safe (one request is driven by one thread at a time).
class GrammarMatcher {
public:
    explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
    ~GrammarMatcher();
    GrammarMatcher(GrammarMatcher&&) noexcept;
    GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

    // Writes the allowed next tokens into mask[0 .. vocab.mask_words()). After termination only the
    // stop tokens are allowed. Returns the number of allowed tokens.
    int32_t fill_mask(uint32_t* mask);
    // Advances by one token; returns false (and changes nothing) when the grammar rejects it.
    bool accept(int32_t token);
    // Advances by raw bytes (for checking texts and jump-forward decoding).
    bool accept_bytes(std::string_view bytes);
    // Undoes the last n accept() / accept_bytes() calls.
    void rollback(int32_t n);
    int32_t num_steps() const;  // accept calls that can be rolled back
    void reset();

    bool is_terminated() const;  // a stop token was accepted
    bool can_terminate() const;  // the text so far is a complete match (stop tokens allowed)
    // The bytes every continuation must start with (empty when several bytes may come next or the
    // text may end here), up to max_bytes.
    std::string forced_bytes(size_t max_bytes = 256) const;
    // The single allowed token, if only one token can follow (the sampler may skip sampling).
    std::optional<int32_t> forced_token();
    // Fewest bytes needed to complete a match from here (0 when can_terminate()).
    int64_t min_completion_bytes() const;

    const CompiledGrammar& grammar() const { return *grammar_; }

private:
    struct State;
    std::shared_ptr<const CompiledGrammar> grammar_;
    std::unique_ptr<State> state_;
};

// Sets logits of disallowed tokens to -inf. logits has vocab.size() entries (or fewer).
void apply_token_mask(float* logits, int32_t num_logits, const uint32_t* mask);

}  // namespace deepinfer::grammar
