#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace deepinfer::tok {

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
        char c = t[k];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

using nlohmann::json;

namespace {

class SequenceDecoder : public Decoder {
public:
    explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (const auto& p : parts_) p->decode_chain(tokens);
    }
    void token_bytes(std::string& token) const override {
        for (const auto& p : parts_) p->token_bytes(token);
    }
    bool groups_byte_tokens() const override {
        for (const auto& p : parts_)
            if (p->groups_byte_tokens()) return true;
        return false;
    }

private:
    std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string bytes;
        for (const std::string& t : tokens) {
            size_t mark = bytes.size();
            if (!byte_level_decode(t, bytes)) {
                bytes.resize(mark);
                bytes += t;  // a token outside the alphabet (an added token) contributes its own UTF-8
            }
        }
        tokens.assign(1, utf8_lossy(bytes));
    }
    void token_bytes(std::string& token) const override {
        std::string bytes;
        if (byte_level_decode(token, bytes)) token.swap(bytes);
    }
};

class ReplaceDecoder : public Decoder {
public:
    ReplaceDecoder(std::string literal, std::unique_ptr<Regex> regex, std::string content)
        : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (std::string& t : tokens) token_bytes(t);
    }
    void token_bytes(std::string& t) const override {
        std::vector<Span> spans;
        if (regex_) {
            regex_->find_all(t, spans);
        } else if (!literal_.empty()) {
            for (size_t p = t.find(literal_); p != std::string::npos; p = t.find(literal_, p + literal_.size()))
                spans.push_back({p, p + literal_.size()});
        }
        if (spans.empty()) return;
        std::string out;
        size_t last = 0;
        for (const Span& sp : spans) {
            out.append(t, last, sp.begin - last);
            out += content_;
            last = sp.end;
        }
        out.append(t, last, std::string::npos);
        t.swap(out);
    }

private:
    std::string literal_;
    std::unique_ptr<Regex> regex_;
    std::string content_;
};

class StripDecoder : public Decoder {
public:
    StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (std::string& t : tokens) {
            std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
            size_t i = 0;
            while (i < t.size()) {
                size_t at = i;
                chars.push_back({at, next_code_point(t, i)});
            }
            size_t start_cut = 0;
            for (size_t k = 0; k < chars.size() && k < start_; ++k) {
                if (chars[k].second != content_) break;
                start_cut = k + 1;
            }
            size_t stop_cut = chars.size();
            for (size_t k = 0; k < chars.size() && k < stop_; ++k) {
                size_t idx = chars.size() - 1 - k;
                if (chars[idx].second != content_) break;
                stop_cut = idx;
            }
            if (stop_cut < start_cut) stop_cut = start_cut;
            size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
            size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
            t = t.substr(b, e - b);
        }
    }
    void token_bytes(std::string&) const override {}

private:
    char32_t content_;
    size_t start_, stop_;
};

class FuseDecoder : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
    }
    void token_bytes(std::string&) const override {}
};


class ByteFallbackDecoder : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::vector<std::string> out;
        std::string pending;
        size_t pending_count = 0;
        auto flush = [&]() {
            if (pending_count == 0) return;
            if (find_invalid_utf8(pending) == std::string::npos) {
                out.push_back(pending);
            } else {
                for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
            }
            pending.clear();
            pending_count = 0;
        };
        for (std::string& t : tokens) {
            int b = parse_byte_token(t);
            if (b >= 0) {
                pending.push_back(static_cast<char>(b));
                ++pending_count;
            } else {
                flush();
                out.push_back(std::move(t));
            }
        }
        flush();
        tokens.swap(out);
    }
    void token_bytes(std::string& t) const override {
        int b = parse_byte_token(t);
        if (b >= 0) t.assign(1, static_cast<char>(b));
    }
    bool groups_byte_tokens() const override { return true; }
};

class MetaspaceDecoder : public Decoder {
public:
    MetaspaceDecoder(std::string replacement, bool strip_first)
        : replacement_(std::move(replacement)), strip_first_(strip_first) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t i = 0; i < tokens.size(); ++i) replace(tokens[i], i == 0 && strip_first_);
    }
    void token_bytes(std::string& t) const override { replace(t, false); }

private:
    void replace(std::string& t, bool drop) const {
        std::string out;
        size_t p = 0;
        for (size_t q = t.find(replacement_); q != std::string::npos; q = t.find(replacement_, p)) {
            out.append(t, p, q - p);
            if (!drop) out.push_back(' ');
            p = q + replacement_.size();
        }
        if (p == 0) return;
        out.append(t, p, std::string::npos);
        t.swap(out);
    }
    std::string replacement_;
    bool strip_first_;
};

std::string get_string(const json& j, const char* key, const char* what) {
    auto it = j.find(key);
    DI_CHECK(it != j.end() && it->is_string(), "tokenizer.json: ", what, " needs a string '", key, "'");
    return it->get<std::string>();
}

size_t get_count(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return 0;
    DI_CHECK(it->is_number_unsigned(), "tokenizer.json: decoder field '", key, "' must be a non-negative integer");
    return it->get<size_t>();
}

}  // namespace


std::unique_ptr<Decoder> make_decoder(const json& j) {
    if (j.is_null()) return nullptr;
    DI_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             "tokenizer.json: a decoder must be an object with a 'type'");
    const std::string type = j["type"].get<std::string>();
    if (type == "Sequence") {
        auto it = j.find("decoders");
        DI_CHECK(it != j.end() && it->is_array(), "tokenizer.json: Sequence decoder needs 'decoders'");
        std::vector<std::unique_ptr<Decoder>> parts;
        for (const json& p : *it) {
            auto d = make_decoder(p);
            if (d) parts.push_back(std::move(d));
        }
        return std::make_unique<SequenceDecoder>(std::move(parts));
    }
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Replace") {
        auto pit = j.find("pattern");
        DI_CHECK(pit != j.end() && pit->is_object(), "tokenizer.json: Replace decoder needs a 'pattern'");
        std::string content = get_string(j, "content", "Replace decoder");
        if (pit->contains("String"))
            return std::make_unique<ReplaceDecoder>(get_string(*pit, "String", "Replace pattern"), nullptr, content);
        return std::make_unique<ReplaceDecoder>(
            "", std::make_unique<Regex>(get_string(*pit, "Regex", "Replace pattern")), content);
    }
    if (type == "Strip") {
        std::string content = get_string(j, "content", "Strip decoder");
        size_t i = 0;
        DI_CHECK(!content.empty(), "tokenizer.json: Strip decoder content must be one character");
        char32_t c = next_code_point(content, i);
        DI_CHECK(i == content.size(), "tokenizer.json: Strip decoder content must be one character");
        return std::make_unique<StripDecoder>(c, get_count(j, "start"), get_count(j, "stop"));
    }
    if (type == "Metaspace") {
        std::string replacement = j.contains("replacement") && j["replacement"].is_string()
                                      ? j["replacement"].get<std::string>()
                                      : "\xE2\x96\x81";
        bool strip_first = true;
        if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
            strip_first = j["prepend_scheme"].get<std::string>() != "never";
        } else if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) {
            strip_first = j["add_prefix_space"].get<bool>();
        }
        return std::make_unique<MetaspaceDecoder>(replacement, strip_first);
    }
    DI_THROW("tokenizer.json: unsupported decoder type '", type,
             "' (supported: Sequence, ByteLevel, Replace, Strip, Fuse, ByteFallback, Metaspace)");
}

namespace {

class NoopPostProcessor : public PostProcessor {
public:
    void process(std::vector<int32_t>&) const override {}
};

class SequencePostProcessor : public PostProcessor {
public:
    explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
    void process(std::vector<int32_t>& ids) const override {
        for (const auto& p : parts_) p->process(ids);
    }

private:
    std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// A fixed prefix and suffix around the sequence (TemplateProcessing's "single", Roberta, Bert).
class WrapPostProcessor : public PostProcessor {
public:
    WrapPostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
        : before_(std::move(before)), after_(std::move(after)) {}
    void process(std::vector<int32_t>& ids) const override {
        ids.insert(ids.begin(), before_.begin(), before_.end());
        ids.insert(ids.end(), after_.begin(), after_.end());
    }

private:
    std::vector<int32_t> before_, after_;
};

int32_t pair_id(const json& j, const char* what) {
    DI_CHECK(j.is_array() && j.size() == 2 && j[1].is_number_integer(), "tokenizer.json: ", what,
             " must be [token, id]");
    return j[1].get<int32_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j) {
    if (j.is_null()) return nullptr;
    DI_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
             "tokenizer.json: a post-processor must be an object with a 'type'");
    const std::string type = j["type"].get<std::string>();
    if (type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
    if (type == "Sequence") {
        auto it = j.find("processors");
        DI_CHECK(it != j.end() && it->is_array(), "tokenizer.json: Sequence post-processor needs 'processors'");
        std::vector<std::unique_ptr<PostProcessor>> parts;
        for (const json& p : *it) {
            auto pp = make_post_processor(p);
            if (pp) parts.push_back(std::move(pp));
        }
        return std::make_unique<SequencePostProcessor>(std::move(parts));
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
        DI_CHECK(j.contains("cls") && j.contains("sep"), "tokenizer.json: ", type, " needs 'cls' and 'sep'");
        return std::make_unique<WrapPostProcessor>(std::vector<int32_t>{pair_id(j["cls"], "cls")},
                                                   std::vector<int32_t>{pair_id(j["sep"], "sep")});
    }
    if (type == "TemplateProcessing") {
        auto single = j.find("single");
        DI_CHECK(single != j.end() && single->is_array(), "tokenizer.json: TemplateProcessing needs 'single'");
        const json empty = json::object();
        const json& specials = j.contains("special_tokens") ? j["special_tokens"] : empty;
        std::vector<int32_t> before, after;
        bool seen_sequence = false;
        for (const json& item : *single) {
            if (item.contains("Sequence")) {
                DI_CHECK(!seen_sequence, "tokenizer.json: TemplateProcessing 'single' has two sequences");
                seen_sequence = true;
                continue;
            }
            DI_CHECK(item.contains("SpecialToken") && item["SpecialToken"].contains("id"),
                     "tokenizer.json: TemplateProcessing items must be Sequence or SpecialToken");
            const std::string name = item["SpecialToken"]["id"].get<std::string>();
            auto sit = specials.find(name);
            DI_CHECK(sit != specials.end() && sit->contains("ids") && (*sit)["ids"].is_array(),
                     "tokenizer.json: TemplateProcessing special token '", name, "' is not defined");
            for (const json& id : (*sit)["ids"]) (seen_sequence ? after : before).push_back(id.get<int32_t>());
        }
        DI_CHECK(seen_sequence, "tokenizer.json: TemplateProcessing 'single' has no $A sequence");
        return std::make_unique<WrapPostProcessor>(std::move(before), std::move(after));
    }
    DI_THROW("tokenizer.json: unsupported post-processor type '", type,
             "' (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)");
}

}  // namespace deepinfer::tok
