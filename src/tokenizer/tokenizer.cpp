#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/thread_pool.h"
#include "deepinfer/error.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace deepinfer {

using nlohmann::json;
using namespace tok;

struct Tokenizer::Impl {
    std::unique_ptr<BpeModel> model;
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    std::unique_ptr<PostProcessor> post_processor;
    std::unique_ptr<Decoder> decoder;

    std::vector<AddedToken> added;  // in file order
    std::unordered_map<int32_t, size_t> added_by_id;
    std::unordered_map<std::string, int32_t> added_by_content;
    AddedTokenMatcher raw_matcher;         // tokens with normalized=false, on the input text
    AddedTokenMatcher normalized_matcher;  // tokens with normalized=true, on normalized text

    int32_t vocab_size = 0;
    std::vector<std::string> token_bytes;
    std::vector<uint8_t> special;
    std::vector<uint8_t> byte_fallback;  // "<0xAB>" tokens that the decoder joins a run at a time

    std::optional<int32_t> bos_id, eos_id;
    std::optional<bool> add_bos, add_eos;  // from tokenizer_config.json

    void encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
    void encode_normalized(std::string& text, bool at_start, std::vector<int32_t>& out) const;
};

namespace {

bool json_bool(const json& j, const char* key, bool dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    DI_CHECK(it->is_boolean(), "tokenizer.json: added token field '", key, "' must be a boolean");
    return it->get<bool>();
}

// tokenizer_config.json names tokens as a string or as {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
    DI_THROW("tokenizer_config.json: '", key, "' must be a string or an object with 'content'");
}

json parse_json(std::string_view text, const char* what) {
    try {
        return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
        DI_THROW(what, " is not valid JSON: ", e.what());
    }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
    std::string file = path;
    std::string dir;
    if (!file_exists(file)) DI_THROW("tokenizer file not found: ", path);
    // A directory: look for the tokenizer inside it.
    if (file_exists(path_join(path, "tokenizer.json"))) {
        file = path_join(path, "tokenizer.json");
    } else if (file_exists(path_join(path, "tokenizer.json.gz"))) {
        file = path_join(path, "tokenizer.json.gz");
    } else if (std::filesystem::is_directory(path)) {
        DI_THROW("no tokenizer in ", path, " (it holds neither tokenizer.json nor tokenizer.json.gz)");
    }
    size_t slash = file.find_last_of('/');
    dir = slash == std::string::npos ? "." : file.substr(0, slash);
    std::string text;
    try {
        text = read_file(file);
    } catch (const Error& e) {
        DI_THROW("cannot read tokenizer ", file, ": ", e.what());
    }
    std::string config;
    for (const char* name : {"tokenizer_config.json", "tokenizer_config.json.gz"}) {
        std::string cfg = path_join(dir, name);
        if (file_exists(cfg)) {
            config = read_file(cfg);
            break;
        }
    }
    try {
        return from_json(text, config);
    } catch (const Error& e) {
        DI_THROW(file, ": ", e.what());
    }
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
    json j = parse_json(tokenizer_json, "tokenizer.json");
    DI_CHECK(j.is_object(), "tokenizer.json must hold a JSON object");
    DI_CHECK(j.contains("model"), "tokenizer.json has no 'model'");
    auto impl = std::make_unique<Impl>();
    impl->model = BpeModel::from_json(j["model"]);
    impl->normalizer = make_normalizer(j.value("normalizer", json()));
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()));
    impl->post_processor = make_post_processor(j.value("post_processor", json()));
    impl->decoder = make_decoder(j.value("decoder", json()));
    if (j.contains("truncation") && !j["truncation"].is_null())
        DI_THROW("tokenizer.json: truncation is not supported; set it to null");
    if (j.contains("padding") && !j["padding"].is_null())
        DI_THROW("tokenizer.json: padding is not supported; set it to null");

    int32_t limit = impl->model->id_limit();
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
        DI_CHECK(j["added_tokens"].is_array(), "tokenizer.json: 'added_tokens' must be an array");
        for (const json& a : j["added_tokens"]) {
            DI_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                         a["content"].is_string(),
                     "tokenizer.json: each added token needs an integer 'id' and a string 'content'");
            AddedToken t;
            t.id = a["id"].get<int32_t>();
            DI_CHECK(t.id >= 0 && t.id < (1 << 30), "tokenizer.json: added token id ", t.id, " is out of range");
            t.content = a["content"].get<std::string>();
            DI_CHECK(!t.content.empty(), "tokenizer.json: added token ", t.id, " has empty content");
            DI_CHECK(find_invalid_utf8(t.content) == std::string::npos, "tokenizer.json: added token ", t.id,
                     " is not valid UTF-8");
            t.single_word = json_bool(a, "single_word", false);
            t.lstrip = json_bool(a, "lstrip", false);
            t.rstrip = json_bool(a, "rstrip", false);
            t.normalized = json_bool(a, "normalized", !json_bool(a, "special", false));
            t.special = json_bool(a, "special", false);
            limit = std::max(limit, t.id + 1);
            impl->added_by_content[t.content] = t.id;
            impl->added.push_back(std::move(t));
        }
    }
    for (size_t i = 0; i < impl->added.size(); ++i) impl->added_by_id[impl->added[i].id] = i;
    impl->vocab_size = limit;

    // Matchers: special tokens first, then the others, as Hugging Face orders them.
    std::vector<std::string> raw_patterns, norm_patterns;
    std::vector<const AddedToken*> raw_tokens, norm_tokens;
    for (int pass = 0; pass < 2; ++pass) {
        for (AddedToken& t : impl->added) {
            if (t.special != (pass == 0)) continue;
            if (t.normalized) {
                std::string p = t.content;
                if (impl->normalizer) impl->normalizer->normalize(p);
                norm_patterns.push_back(p);
                t.decoded = std::move(p);
                norm_tokens.push_back(&t);
            } else {
                t.decoded = t.content;
                raw_patterns.push_back(t.content);
                raw_tokens.push_back(&t);
            }
        }
    }
    impl->raw_matcher.build(raw_patterns, raw_tokens);
    impl->normalized_matcher.build(norm_patterns, norm_tokens);

    impl->token_bytes.resize(limit);
    impl->special.assign(limit, 0);
    impl->byte_fallback.assign(limit, 0);
    const bool byte_runs = impl->decoder && impl->decoder->groups_byte_tokens();
    for (int32_t id = 0; id < limit; ++id) {
        std::string s;
        auto it = impl->added_by_id.find(id);
        if (it != impl->added_by_id.end()) {
            s = impl->added[it->second].decoded;
            impl->special[id] = impl->added[it->second].special;
        } else if (const std::string* t = impl->model->id_to_token(id)) {
            s = *t;
            impl->byte_fallback[id] = byte_runs && tok::parse_byte_token(s) >= 0;
        } else {
            continue;
        }
        if (impl->decoder) impl->decoder->token_bytes(s);
        impl->token_bytes[id] = std::move(s);
    }

    if (!config_json.empty()) {
        json cfg = parse_json(config_json, "tokenizer_config.json");
        DI_CHECK(cfg.is_object(), "tokenizer_config.json must hold a JSON object");
        auto lookup = [&](const std::optional<std::string>& name, const char* key) -> std::optional<int32_t> {
            if (!name) return std::nullopt;
            auto it = impl->added_by_content.find(*name);
            if (it != impl->added_by_content.end()) return it->second;
            int32_t id = impl->model->token_to_id(*name);
            DI_CHECK(id >= 0, "tokenizer_config.json: ", key, " '", *name, "' is not a token of tokenizer.json");
            return id;
        };
        impl->bos_id = lookup(config_token(cfg, "bos_token"), "bos_token");
        impl->eos_id = lookup(config_token(cfg, "eos_token"), "eos_token");
        if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
            impl->add_bos = cfg["add_bos_token"].get<bool>();
        if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean())
            impl->add_eos = cfg["add_eos_token"].get<bool>();
        DI_CHECK(!(impl->add_bos.value_or(false) && !impl->bos_id),
                 "tokenizer_config.json: add_bos_token is true but there is no bos_token");
        DI_CHECK(!(impl->add_eos.value_or(false) && !impl->eos_id),
                 "tokenizer_config.json: add_eos_token is true but there is no eos_token");
    }
    return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_normalized(std::string& text, bool at_start, std::vector<int32_t>& out) const {
    thread_local std::vector<PreToken> pieces;
    pieces.clear();
    pieces.push_back(PreToken{std::move(text), at_start, false});
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
    for (const PreToken& p : pieces) model->tokenize(p.text, p.byte_level, out);
}

void Tokenizer::Impl::encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
    std::string s(text);
    if (normalizer) normalizer->normalize(s);
    if (normalized_matcher.empty()) {
        if (!s.empty()) encode_normalized(s, at_start, out);
        return;
    }
    std::vector<Segment> segs;
    normalized_matcher.split(s, segs);
    for (const Segment& seg : segs) {
        if (seg.id >= 0) {
            out.push_back(seg.id);
        } else {
            std::string piece = s.substr(seg.begin, seg.end - seg.begin);
            encode_normalized(piece, at_start && seg.begin == 0, out);
        }
    }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    size_t bad = find_invalid_utf8(text);
    DI_CHECK(bad == std::string_view::npos, "cannot tokenize: the text is not valid UTF-8 (byte offset ", bad, ")");
    const Impl& im = *impl_;
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    if (im.raw_matcher.empty()) {
        im.encode_plain(text, true, ids);
    } else {
        std::vector<Segment> segs;
        im.raw_matcher.split(text, segs);
        for (const Segment& seg : segs) {
            if (seg.id >= 0) {
                ids.push_back(seg.id);
            } else {
                im.encode_plain(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, ids);
            }
        }
    }
    if (add_special_tokens) {
        if (im.add_bos || im.add_eos) {
            if (im.add_bos.value_or(false)) ids.insert(ids.begin(), *im.bos_id);
            if (im.add_eos.value_or(false)) ids.push_back(*im.eos_id);
        } else if (im.post_processor) {
            im.post_processor->process(ids);
        }
    }
    return ids;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts, bool add_special_tokens,
                                                          ThreadPool* pool) const {
    std::vector<std::vector<int32_t>> out(texts.size());
    auto work = [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = encode(texts[i], add_special_tokens);
    };
    if (pool && texts.size() > 1) {
        pool->parallel_for(static_cast<int64_t>(texts.size()), 1, work);
    } else {
        work(0, static_cast<int64_t>(texts.size()));
    }
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    const Impl& im = *impl_;
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
        DI_CHECK(id >= 0 && id < im.vocab_size, "cannot decode: token id ", id, " is outside [0, ", im.vocab_size, ")");
        auto it = im.added_by_id.find(id);
        if (it != im.added_by_id.end()) {
            const AddedToken& t = im.added[it->second];
            if (skip_special_tokens && t.special) continue;
            tokens.push_back(t.decoded);
        } else if (const std::string* t = im.model->id_to_token(id)) {
            tokens.push_back(*t);
        }
    }
    if (!im.decoder) {
        std::string out;
        for (size_t i = 0; i < tokens.size(); ++i) {
            if (i) out.push_back(' ');
            out += tokens[i];
        }
        return out;
    }
    im.decoder->decode_chain(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::string_view Tokenizer::token_bytes_view(int32_t id) const {
    if (id < 0 || id >= impl_->vocab_size) return {};
    return impl_->token_bytes[id];
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < impl_->vocab_size && impl_->special[id]; }

bool Tokenizer::is_added(int32_t id) const { return impl_->added_by_id.count(id) > 0; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    auto it = impl_->added_by_content.find(std::string(token));
    if (it != impl_->added_by_content.end()) return it->second;
    int32_t id = impl_->model->token_to_id(token);
    if (id >= 0) return id;
    return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
    auto it = impl_->added_by_id.find(id);
    if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
    if (const std::string* t = impl_->model->id_to_token(id)) return *t;
    return std::nullopt;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }

// ---- StreamingDetokenizer ----

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

bool Tokenizer::is_byte_fallback(int32_t id) const {
    return id >= 0 && id < impl_->vocab_size && impl_->byte_fallback[id];
}

std::string StreamingDetokenizer::push(int32_t id) {
    DI_CHECK(id >= 0 && id < tokenizer_->vocab_size(), "cannot decode: token id ", id, " is outside [0, ",
             tokenizer_->vocab_size(), ")");
    ids_.push_back(id);
    // Hold back a run of byte-fallback tokens until a token of another kind closes it: the decoder turns a
    // run that is not valid UTF-8 into one U+FFFD per byte, so a later byte can change the earlier ones' text.
    if (tokenizer_->is_byte_fallback(id)) return {};
    // Hold back while the tokens not yet emitted end inside a UTF-8 sequence (byte-level pieces of a
    // character still to come).
    std::string tail;
    for (size_t i = read_offset_; i < ids_.size(); ++i) {
        if (skip_special_ && tokenizer_->is_special(ids_[i])) continue;
        tail += tokenizer_->token_bytes_view(ids_[i]);
    }
    if (complete_utf8_prefix(tail) < tail.size()) return {};
    std::span<const int32_t> all(ids_);
    std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_);
    if (text.size() <= prefix_text_.size()) return {};
    size_t common = 0;  // normally all of prefix_text_
    while (common < prefix_text_.size() && text[common] == prefix_text_[common]) ++common;
    while (common > 0 && common < text.size() && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
    std::string delta = text.substr(common);
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    prefix_text_ = tokenizer_->decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
    return delta;
}

std::string StreamingDetokenizer::finish() {
    std::span<const int32_t> all(ids_);
    std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_);
    std::string delta = text.size() > prefix_text_.size() ? text.substr(prefix_text_.size()) : std::string();
    prefix_offset_ = read_offset_ = ids_.size();
    prefix_text_.clear();
    return delta;
}

}  // namespace deepinfer
