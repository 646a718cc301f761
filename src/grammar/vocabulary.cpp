#include <algorithm>

#include "deepinfer/error.h"
#include "grammar/grammar.h"
#include "grammar/token_trie.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar {

TokenTrie TokenTrie::build(std::vector<std::pair<std::string, int32_t>> entries) {
    entries.erase(std::remove_if(entries.begin(), entries.end(), [](const auto& e) { return e.first.empty(); }),
                  entries.end());
    std::sort(entries.begin(), entries.end());
    TokenTrie t;
    std::vector<int32_t> node_tok_count;
    auto add_node = [&](uint8_t b, uint16_t d) {
        t.byte.push_back(b);
        t.depth.push_back(d);
        t.end.push_back(-1);
        node_tok_count.push_back(0);
        return static_cast<int32_t>(t.byte.size()) - 1;
    };
    add_node(0, 0);
    std::vector<int32_t> path{0};                          // path[d] = node at depth d on the current prefix
    std::vector<std::pair<int32_t, int32_t>> node_tokens;  // (node, token), nodes ascending
    const std::string* prev = nullptr;
    for (const auto& [bytes, id] : entries) {
        size_t lcp = 0;
        if (prev) {
            while (lcp < prev->size() && lcp < bytes.size() && (*prev)[lcp] == bytes[lcp]) ++lcp;
        }
        while (path.size() > lcp + 1) {
            t.end[path.back()] = t.size();
            path.pop_back();
        }
        for (size_t d = lcp; d < bytes.size(); ++d) {
            path.push_back(add_node(static_cast<uint8_t>(bytes[d]), static_cast<uint16_t>(d + 1)));
        }
        node_tokens.push_back({path.back(), id});
        t.max_depth = std::max<int32_t>(t.max_depth, static_cast<int32_t>(bytes.size()));
        prev = &bytes;
    }
    while (!path.empty()) {
        t.end[path.back()] = t.size();
        path.pop_back();
    }
    t.tok_off.assign(t.size() + 1, 0);
    for (const auto& [node, id] : node_tokens) t.tok_off[node + 1]++;
    for (int32_t i = 0; i < t.size(); ++i) t.tok_off[i + 1] += t.tok_off[i];
    t.toks.resize(node_tokens.size());
    {
        std::vector<int32_t> pos(t.tok_off.begin(), t.tok_off.end() - 1);
        for (const auto& [node, id] : node_tokens) t.toks[pos[node]++] = id;
    }
    return t;
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tok,
                                                             std::optional<std::vector<int32_t>> stop_ids,
                                                             int32_t mask_size, int32_t num_tokens) {
    const int32_t n = num_tokens > 0 ? std::min(num_tokens, tok.vocab_size()) : tok.vocab_size();
    std::vector<std::string> bytes(n);
    std::vector<int32_t> special;
    for (int32_t i = 0; i < n; ++i) {
        bytes[i] = tok.token_bytes(i);
        if (tok.is_special(i)) special.push_back(i);
    }
    if (!stop_ids) {
        stop_ids.emplace();
        if (tok.eos_id() && *tok.eos_id() < n) stop_ids->push_back(*tok.eos_id());
    }
    return create(std::move(bytes), std::move(*stop_ids), std::move(special), mask_size);
}

std::shared_ptr<const Vocabulary> Vocabulary::create(std::vector<std::string> token_bytes,
                                                     std::vector<int32_t> stop_ids, std::vector<int32_t> special_ids,
                                                     int32_t mask_size) {
    std::shared_ptr<Vocabulary> v(new Vocabulary());
    int32_t n = static_cast<int32_t>(token_bytes.size());
    DI_CHECK(n > 0, "grammar vocabulary is empty");
    v->size_ = std::max(n, mask_size);
    v->special_.assign(n, 0);
    for (int32_t id : special_ids) {
        DI_CHECK(id >= 0 && id < n, "special token id ", id, " out of range [0, ", n, ")");
        v->special_[id] = 1;
    }
    for (int32_t id : stop_ids) {
        DI_CHECK(id >= 0 && id < n, "stop token id ", id, " out of range [0, ", n, ")");
        v->special_[id] = 2;
    }
    std::sort(stop_ids.begin(), stop_ids.end());
    stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
    v->stop_ids_ = std::move(stop_ids);
    std::vector<std::pair<std::string, int32_t>> entries;
    entries.reserve(n);
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; ++i) {
        for (unsigned char c : token_bytes[i]) h = (h ^ c) * 1099511628211ull;
        h = (h ^ (0x100u + v->special_[i])) * 1099511628211ull;
        if (!v->special_[i]) entries.emplace_back(token_bytes[i], i);
    }
    v->fingerprint_ = h ^ static_cast<uint64_t>(v->size_);
    v->trie_ = std::make_unique<TokenTrie>(TokenTrie::build(std::move(entries)));
    v->tokens_ = std::move(token_bytes);
    return v;
}

Vocabulary::~Vocabulary() = default;

bool Vocabulary::is_stop(int32_t id) const { return id >= 0 && id < num_tokens() && special_[id] == 2; }
bool Vocabulary::is_special(int32_t id) const { return id >= 0 && id < num_tokens() && special_[id] != 0; }

}  // namespace deepinfer::grammar
