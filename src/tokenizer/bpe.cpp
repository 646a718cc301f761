#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace deepinfer::tok {

using nlohmann::json;

namespace {

std::optional<std::string> optional_string(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    DI_CHECK(it->is_string(), "tokenizer.json: model.", key, " must be a string");
    return it->get<std::string>();
}

bool optional_bool(const json& j, const char* key, bool dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    DI_CHECK(it->is_boolean(), "tokenizer.json: model.", key, " must be a boolean");
    return it->get<bool>();
}

// A small direct-mapped cache of recent words per thread (no locks); entries are tagged with the model's
// instance id so that models never see each other's entries.
constexpr size_t kCacheSlots = 8192;
constexpr size_t kMaxCachedWordBytes = 48;
struct CacheEntry {
    uint64_t owner = 0;
    std::string word;
    std::vector<int32_t> ids;
};
std::atomic<uint64_t> next_instance_id{1};

struct HeapEntry {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const HeapEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

std::unique_ptr<BpeModel> BpeModel::from_json(const json& m) {
    DI_CHECK(m.is_object(), "tokenizer.json: 'model' must be an object");
    std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
    if (type.empty() && m.contains("merges")) type = "BPE";
    DI_CHECK(type == "BPE", "tokenizer.json: unsupported model type '", type, "' (supported: BPE)");
    auto model = std::unique_ptr<BpeModel>(new BpeModel());
    model->instance_id_ = next_instance_id.fetch_add(1);
    auto vit = m.find("vocab");
    DI_CHECK(vit != m.end() && vit->is_object(), "tokenizer.json: model.vocab must be an object of token -> id");
    int32_t max_id = -1;
    for (auto it = vit->begin(); it != vit->end(); ++it) {
        DI_CHECK(it.value().is_number_integer(), "tokenizer.json: vocab id of '", it.key(), "' is not an integer");
        int64_t id = it.value().get<int64_t>();
        DI_CHECK(id >= 0 && id < (1 << 30), "tokenizer.json: vocab id ", id, " of '", it.key(), "' is out of range");
        max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
    }
    model->tokens_.resize(max_id + 1);
    model->has_token_.assign(max_id + 1, 0);
    for (auto it = vit->begin(); it != vit->end(); ++it) {
        auto id = it.value().get<int32_t>();
        model->vocab_.insert(it.key(), id);
        model->tokens_[id] = it.key();
        model->has_token_[id] = 1;
    }

    auto dropout = m.find("dropout");
    if (dropout != m.end() && !dropout->is_null()) {
        DI_CHECK(dropout->is_number() && dropout->get<double>() == 0.0,
                 "tokenizer.json: BPE dropout is not supported (it makes tokenization random)");
    }
    model->unk_token_ = optional_string(m, "unk_token");
    if (model->unk_token_) {
        model->unk_id_ = model->vocab_.find(*model->unk_token_);
        DI_CHECK(model->unk_id_ >= 0, "tokenizer.json: unk_token '", *model->unk_token_, "' is not in the vocabulary");
    }
    model->prefix_ = optional_string(m, "continuing_subword_prefix").value_or("");
    model->suffix_ = optional_string(m, "end_of_word_suffix").value_or("");
    model->fuse_unk_ = optional_bool(m, "fuse_unk", false);
    model->byte_fallback_ = optional_bool(m, "byte_fallback", false);
    model->ignore_merges_ = optional_bool(m, "ignore_merges", false);

    auto mit = m.find("merges");
    DI_CHECK(mit != m.end() && mit->is_array(), "tokenizer.json: model.merges must be an array");
    int32_t rank = 0;
    std::string a, b;
    for (const json& merge : *mit) {
        if (merge.is_string()) {
            const std::string& line = merge.get_ref<const std::string&>();
            size_t sp = line.find(' ');
            DI_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, "tokenizer.json: merge #",
                     rank, " '", line, "' is not of the form 'a b'");
            a = line.substr(0, sp);
            b = line.substr(sp + 1);
        } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
            a = merge[0].get<std::string>();
            b = merge[1].get<std::string>();
        } else {
            DI_THROW("tokenizer.json: merge #", rank, " must be \"a b\" or [\"a\", \"b\"]");
        }
        int32_t ia = model->vocab_.find(a), ib = model->vocab_.find(b);
        DI_CHECK(ia >= 0, "tokenizer.json: merge #", rank, " uses '", a, "', which is not in the vocabulary");
        DI_CHECK(ib >= 0, "tokenizer.json: merge #", rank, " uses '", b, "', which is not in the vocabulary");
        size_t cut = model->prefix_.size() <= b.size() ? model->prefix_.size() : 0;
        std::string joined = a + b.substr(cut);
        int32_t inew = model->vocab_.find(joined);
        DI_CHECK(inew >= 0, "tokenizer.json: merge #", rank, " makes '", joined, "', which is not in the vocabulary");
        model->merges_.insert(ia, ib, MergeInfo{rank, inew});
        ++rank;
    }

    const auto& chars = byte_level_chars();
    model->all_bytes_present_ = true;
    for (int i = 0; i < 256; ++i) {
        model->byte_ids_[i] = model->vocab_.find(chars[i]);
        if (model->byte_ids_[i] < 0) model->all_bytes_present_ = false;
        char buf[8];
        std::snprintf(buf, sizeof(buf), "<0x%02X>", i);
        model->fallback_ids_[i] = model->vocab_.find(buf);
    }
    return model;
}

void BpeModel::merge(std::vector<int32_t>& ids, std::vector<uint32_t>& lens, std::vector<int32_t>& out) const {
    const int32_t n = static_cast<int32_t>(ids.size());
    if (n == 1) {
        out.push_back(ids[0]);
        return;
    }
    thread_local std::vector<int32_t> prev, next;
    thread_local std::vector<HeapEntry> heap;
    prev.resize(n);
    next.resize(n);
    heap.clear();
    for (int32_t i = 0; i < n; ++i) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    auto cmp = [](const HeapEntry& x, const HeapEntry& y) { return x > y; };
    for (int32_t i = 0; i + 1 < n; ++i) {
        if (const MergeInfo* mi = merges_.find(ids[i], ids[i + 1])) heap.push_back({mi->rank, i, mi->new_id});
    }
    std::make_heap(heap.begin(), heap.end(), cmp);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), cmp);
        HeapEntry top = heap.back();
        heap.pop_back();
        int32_t pos = top.pos;
        if (lens[pos] == 0) continue;
        int32_t nx = next[pos];
        if (nx < 0) continue;
        const MergeInfo* mi = merges_.find(ids[pos], ids[nx]);
        if (!mi || mi->new_id != top.new_id) continue;
        ids[pos] = top.new_id;
        lens[pos] += lens[nx];
        lens[nx] = 0;
        next[pos] = next[nx];
        if (next[pos] >= 0) prev[next[pos]] = pos;
        if (prev[pos] >= 0) {
            if (const MergeInfo* m2 = merges_.find(ids[prev[pos]], ids[pos])) {
                heap.push_back({m2->rank, prev[pos], m2->new_id});
                std::push_heap(heap.begin(), heap.end(), cmp);
            }
        }
        if (next[pos] >= 0) {
            if (const MergeInfo* m2 = merges_.find(ids[pos], ids[next[pos]])) {
                heap.push_back({m2->rank, pos, m2->new_id});
                std::push_heap(heap.begin(), heap.end(), cmp);
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

void BpeModel::tokenize(std::string_view word, bool byte_level_input, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    thread_local std::string mapped;
    if (byte_level_input) {
        if (all_bytes_present_ && prefix_.empty() && suffix_.empty()) {
            if (ignore_merges_) {
                mapped.clear();
                byte_level_encode(word, mapped);
                int32_t id = vocab_.find(mapped);
                if (id >= 0) {
                    out.push_back(id);
                    return;
                }
            }
            thread_local std::vector<CacheEntry> cache(kCacheSlots);
            CacheEntry* entry = nullptr;
            if (word.size() <= kMaxCachedWordBytes) {
                entry = &cache[hash_bytes(word) & (kCacheSlots - 1)];
                if (entry->owner == instance_id_ && entry->word == word) {
                    out.insert(out.end(), entry->ids.begin(), entry->ids.end());
                    return;
                }
            }
            thread_local std::vector<int32_t> ids;
            thread_local std::vector<uint32_t> lens;
            ids.resize(word.size());
            lens.assign(word.size(), 1);
            for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
            size_t first = out.size();
            merge(ids, lens, out);
            if (entry) {
                entry->owner = instance_id_;
                entry->word.assign(word);
                entry->ids.assign(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
            }
            return;
        }
        mapped.clear();
        byte_level_encode(word, mapped);
        std::string copy = mapped;  // tokenize_chars uses `mapped` as scratch too
        tokenize_chars(copy, out);
        return;
    }
    tokenize_chars(word, out);
}

void BpeModel::tokenize_chars(std::string_view word, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
        int32_t id = vocab_.find(word);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    thread_local std::vector<int32_t> ids;
    thread_local std::vector<uint32_t> lens;
    ids.clear();
    lens.clear();
    std::string piece;
    int32_t unk_pending = -1;
    uint32_t unk_len = 0;
    size_t i = 0;
    while (i < word.size()) {
        size_t start = i;
        next_code_point(word, i);
        bool first = start == 0, last = i == word.size();
        auto ch = word.substr(start, i - start);
        uint32_t byte_len = static_cast<uint32_t>(ch.size());
        int32_t id;
        if (first && last) {
            piece.assign(ch);
            piece += suffix_;
        } else if (first) {
            piece.assign(ch);
        } else {
            piece.assign(prefix_);
            piece += ch;
            if (last) piece += suffix_;
        }
        id = vocab_.find(piece);
        if (id >= 0) {
            if (unk_pending >= 0) {
                ids.push_back(unk_pending);
                lens.push_back(unk_len);
                unk_pending = -1;
            }
            ids.push_back(id);
            lens.push_back(byte_len);
            continue;
        }
        if (byte_fallback_) {
            bool ok = true;
            for (unsigned char b : piece) ok = ok && fallback_ids_[b] >= 0;
            if (ok) {
                for (unsigned char b : piece) {
                    ids.push_back(fallback_ids_[b]);
                    lens.push_back(1);
                }
                continue;
            }
        }
        if (unk_id_ >= 0) {
            if (unk_pending >= 0 && fuse_unk_) {
                unk_len += byte_len;
            } else {
                if (unk_pending >= 0) {
                    ids.push_back(unk_pending);
                    lens.push_back(unk_len);
                }
                unk_pending = unk_id_;
                unk_len = byte_len;
            }
        }
        // Without an unknown token the character is dropped, as Hugging Face tokenizers does.
    }
    if (unk_pending >= 0) {
        ids.push_back(unk_pending);
        lens.push_back(unk_len);
    }
    if (ids.empty()) return;
    merge(ids, lens, out);
}

}  // namespace deepinfer::tok
