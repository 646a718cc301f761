#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace deepinfer::tok {

using nlohmann::json;

void materialize_byte_level(PreToken& p) {
    if (!p.byte_level) return;
    std::string mapped;
    byte_level_encode(p.text, mapped);
    p.text.swap(mapped);
    p.byte_level = false;
}

namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const json& j) {
    DI_CHECK(j.is_string(), "tokenizer.json: split 'behavior' must be a string");
    const std::string b = j.get<std::string>();
    if (b == "Removed") return Behavior::kRemoved;
    if (b == "Isolated") return Behavior::kIsolated;
    if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return Behavior::kMergedWithNext;
    if (b == "Contiguous") return Behavior::kContiguous;
    DI_THROW("tokenizer.json: unknown split behavior '", b, "'");
}

struct Part {
    size_t begin, end;
    bool is_match;
};

// Splits `in` at the given matches (sorted, non-overlapping) following the behavior, appending the pieces.
void apply_split(const PreToken& in, const std::vector<Span>& matches, Behavior behavior, bool invert,
                 std::vector<PreToken>& out) {
    thread_local std::vector<Part> parts, merged;
    parts.clear();
    size_t last = 0;
    for (const Span& m : matches) {
        if (m.begin > last) parts.push_back({last, m.begin, invert});
        parts.push_back({m.begin, m.end, !invert});
        last = m.end;
    }
    if (last < in.text.size()) parts.push_back({last, in.text.size(), invert});

    merged.clear();
    switch (behavior) {
        case Behavior::kIsolated:
            merged = parts;
            break;
        case Behavior::kRemoved:
            for (const Part& p : parts)
                if (!p.is_match) merged.push_back(p);
            break;
        case Behavior::kMergedWithPrevious: {
            bool prev_match = false;
            for (const Part& p : parts) {
                if (p.is_match && !prev_match && !merged.empty()) {
                    merged.back().end = p.end;
                } else {
                    merged.push_back(p);
                }
                prev_match = p.is_match;
            }
            break;
        }
        case Behavior::kMergedWithNext: {
            bool prev_match = false;
            for (size_t k = parts.size(); k-- > 0;) {
                const Part& p = parts[k];
                if (p.is_match && !prev_match && !merged.empty()) {
                    merged.back().begin = p.begin;
                } else {
                    merged.push_back(p);
                }
                prev_match = p.is_match;
            }
            std::reverse(merged.begin(), merged.end());
            break;
        }
        case Behavior::kContiguous: {
            bool prev_match = false;
            for (const Part& p : parts) {
                if (p.is_match == prev_match && !merged.empty()) {
                    merged.back().end = p.end;
                } else {
                    merged.push_back(p);
                }
                prev_match = p.is_match;
            }
            break;
        }
    }
    for (const Part& p : merged) {
        if (p.end <= p.begin) continue;
        PreToken t;
        t.text.assign(in.text, p.begin, p.end - p.begin);
        t.at_start = in.at_start && p.begin == 0;
        t.byte_level = in.byte_level;
        out.push_back(std::move(t));
    }
}

// Matches of a per-character predicate: every matching character is its own match.
void char_matches(const std::string& s, const std::function<bool(char32_t)>& pred, std::vector<Span>& out) {
    size_t i = 0;
    while (i < s.size()) {
        size_t start = i;
        char32_t c = next_code_point(s, i);
        if (pred(c)) out.push_back({start, i});
    }
}

// Base for pre-tokenizers that split each piece independently.
class PieceSplitter : public PreTokenizer {
public:
    void pre_tokenize(std::vector<PreToken>& pieces) const override {
        thread_local std::vector<PreToken> out_tl;
        std::vector<PreToken> out;
        out.swap(out_tl);
        out.clear();
        for (PreToken& p : pieces) split_one(p, out);
        pieces.swap(out);
        out.clear();
        out.swap(out_tl);
    }
    virtual void split_one(PreToken& p, std::vector<PreToken>& out) const = 0;
};

class SequencePreTokenizer : public PreTokenizer {
public:
    explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
    void pre_tokenize(std::vector<PreToken>& pieces) const override {
        for (const auto& p : parts_) p->pre_tokenize(pieces);
    }

private:
    std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PieceSplitter {
public:
    SplitPreTokenizer(std::string literal, std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
        : literal_(std::move(literal)), regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        thread_local std::vector<Span> spans;
        spans.clear();
        if (regex_) {
            regex_->find_all(p.text, spans);
        } else if (!literal_.empty()) {
            for (size_t q = p.text.find(literal_); q != std::string::npos;
                 q = p.text.find(literal_, q + literal_.size()))
                spans.push_back({q, q + literal_.size()});
        }
        apply_split(p, spans, behavior_, invert_, out);
    }

private:
    std::string literal_;
    std::unique_ptr<Regex> regex_;
    Behavior behavior_;
    bool invert_;
};

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer : public PieceSplitter {
public:
    ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
        if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern);
    }
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
            std::string spaced(1, ' ');
            spaced += p.text;
            p.text.swap(spaced);
        }
        if (regex_) {
            thread_local std::vector<Span> spans;
            spans.clear();
            regex_->find_all(p.text, spans);
            size_t first = out.size();
            apply_split(p, spans, Behavior::kIsolated, false, out);
            for (size_t k = first; k < out.size(); ++k) out[k].byte_level = true;
        } else if (!p.text.empty()) {
            p.byte_level = true;
            out.push_back(std::move(p));
        }
    }

private:
    bool add_prefix_space_;
    std::unique_ptr<Regex> regex_;
};

class DigitsPreTokenizer : public PieceSplitter {
public:
    explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::vector<Span> spans;
        char_matches(p.text, is_numeric, spans);
        apply_split(p, spans, individual_ ? Behavior::kIsolated : Behavior::kContiguous, false, out);
    }

private:
    bool individual_;
};

class PunctuationPreTokenizer : public PieceSplitter {
public:
    explicit PunctuationPreTokenizer(Behavior behavior) : behavior_(behavior) {}
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::vector<Span> spans;
        char_matches(
            p.text, [](char32_t c) { return (c < 0x80 && std::ispunct(static_cast<int>(c))) || is_punctuation(c); },
            spans);
        apply_split(p, spans, behavior_, false, out);
    }

private:
    Behavior behavior_;
};

class WhitespaceSplitPreTokenizer : public PieceSplitter {
public:
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::vector<Span> spans;
        char_matches(p.text, is_whitespace, spans);
        apply_split(p, spans, Behavior::kRemoved, false, out);
    }
};

// `\w+|[^\w\s]+`, keeping the matches.
class WhitespacePreTokenizer : public PieceSplitter {
public:
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::vector<Span> spans;
        const std::string& s = p.text;
        size_t i = 0;
        int run_kind = -1;  // 0 word, 1 other
        size_t run_start = 0;
        while (i < s.size()) {
            size_t start = i;
            char32_t c = next_code_point(s, i);
            int kind = is_word_char(c) ? 0 : is_whitespace(c) ? 2 : 1;
            if (kind != run_kind) {
                if (run_kind == 0 || run_kind == 1) spans.push_back({run_start, start});
                run_kind = kind;
                run_start = start;
            }
        }
        if (run_kind == 0 || run_kind == 1) spans.push_back({run_start, s.size()});
        apply_split(p, spans, Behavior::kRemoved, true, out);
    }
};

class BertPreTokenizer : public PieceSplitter {
public:
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::vector<PreToken> words;
        std::vector<Span> spans;
        char_matches(p.text, is_whitespace, spans);
        apply_split(p, spans, Behavior::kRemoved, false, words);
        for (PreToken& w : words) {
            spans.clear();
            char_matches(
                w.text, [](char32_t c) { return (c < 0x80 && std::ispunct(static_cast<int>(c))) || is_punctuation(c); },
                spans);
            apply_split(w, spans, Behavior::kIsolated, false, out);
        }
    }
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PieceSplitter {
public:
    MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
        : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
    void split_one(PreToken& p, std::vector<PreToken>& out) const override {
        materialize_byte_level(p);
        std::string replaced;
        replaced.reserve(p.text.size() + replacement_.size());
        for (char c : p.text) {
            if (c == ' ') {
                replaced += replacement_;
            } else {
                replaced.push_back(c);
            }
        }
        bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
        if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start)))
            replaced.insert(0, replacement_);
        p.text.swap(replaced);
        if (!split_) {
            if (!p.text.empty()) out.push_back(std::move(p));
            return;
        }
        std::vector<Span> spans;
        for (size_t q = p.text.find(replacement_); q != std::string::npos;
             q = p.text.find(replacement_, q + replacement_.size()))
            spans.push_back({q, q + replacement_.size()});
        apply_split(p, spans, Behavior::kMergedWithNext, false, out);
    }

private:
    std::string replacement_;
    PrependScheme scheme_;
    bool split_;
};

bool get_bool(const json& j, const char* key, bool dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    DI_CHECK(it->is_boolean(), "tokenizer.json: pre-tokenizer field '", key, "' must be a boolean");
    return it->get<bool>();
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
    if (j.is_null()) return nullptr;
    DI_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             "tokenizer.json: a pre-tokenizer must be an object with a 'type'");
    const std::string type = j["type"].get<std::string>();
    if (type == "Sequence") {
        auto it = j.find("pretokenizers");
        DI_CHECK(it != j.end() && it->is_array(), "tokenizer.json: Sequence pre-tokenizer needs 'pretokenizers'");
        std::vector<std::unique_ptr<PreTokenizer>> parts;
        for (const json& p : *it) {
            auto pt = make_pre_tokenizer(p);
            if (pt) parts.push_back(std::move(pt));
        }
        return std::make_unique<SequencePreTokenizer>(std::move(parts));
    }
    if (type == "Split") {
        auto pit = j.find("pattern");
        DI_CHECK(pit != j.end() && pit->is_object(), "tokenizer.json: Split pre-tokenizer needs a 'pattern'");
        DI_CHECK(j.contains("behavior"), "tokenizer.json: Split pre-tokenizer needs a 'behavior'");
        Behavior behavior = parse_behavior(j["behavior"]);
        bool invert = get_bool(j, "invert", false);
        if (pit->contains("String")) {
            DI_CHECK((*pit)["String"].is_string(), "tokenizer.json: Split pattern String must be a string");
            return std::make_unique<SplitPreTokenizer>((*pit)["String"].get<std::string>(), nullptr, behavior, invert);
        }
        DI_CHECK(pit->contains("Regex") && (*pit)["Regex"].is_string(),
                 "tokenizer.json: Split pattern must be {\"String\": ..} or {\"Regex\": ..}");
        return std::make_unique<SplitPreTokenizer>("", std::make_unique<Regex>((*pit)["Regex"].get<std::string>()),
                                                   behavior, invert);
    }
    if (type == "ByteLevel")
        return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true),
                                                       get_bool(j, "use_regex", true));
    if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(get_bool(j, "individual_digits", false));
    if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
    if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
    if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
    if (type == "Punctuation")
        return std::make_unique<PunctuationPreTokenizer>(j.contains("behavior") ? parse_behavior(j["behavior"])
                                                                                : Behavior::kIsolated);
    if (type == "Metaspace") {
        std::string replacement = j.contains("replacement") && j["replacement"].is_string()
                                      ? j["replacement"].get<std::string>()
                                      : "\xE2\x96\x81";
        DI_CHECK(!replacement.empty(), "tokenizer.json: Metaspace replacement must not be empty");
        PrependScheme scheme = PrependScheme::kAlways;
        if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
            const std::string s = j["prepend_scheme"].get<std::string>();
            if (s == "first") {
                scheme = PrependScheme::kFirst;
            } else if (s == "never") {
                scheme = PrependScheme::kNever;
            } else {
                DI_CHECK(s == "always", "tokenizer.json: unknown Metaspace prepend_scheme '", s, "'");
            }
        } else if (!get_bool(j, "add_prefix_space", true)) {
            scheme = PrependScheme::kNever;
        }
        return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, get_bool(j, "split", true));
    }
    DI_THROW("tokenizer.json: unsupported pre-tokenizer type '", type,
             "' (supported: Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, "
             "Punctuation, BertPreTokenizer)");
}

}  // namespace deepinfer::tok
