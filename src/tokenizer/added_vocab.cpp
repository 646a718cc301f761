#include "tokenizer/added_vocab.h"

#include "tokenizer/unicode.h"

namespace deepinfer::tok {

void AddedTokenMatcher::build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens) {
    nodes_.assign(1, Node{});
    edges_.clear();
    tokens_ = tokens;
    for (bool& b : first_byte_) b = false;
    for (size_t p = 0; p < patterns.size(); ++p) {
        const std::string& s = patterns[p];
        if (s.empty()) continue;
        first_byte_[static_cast<uint8_t>(s[0])] = true;
        int32_t node = 0;
        for (unsigned char c : s) {
            uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
            auto it = edges_.find(key);
            if (it == edges_.end()) {
                nodes_.push_back(Node{});
                it = edges_.emplace(key, static_cast<int32_t>(nodes_.size() - 1)).first;
            }
            node = it->second;
        }
        if (nodes_[node].terminal < 0) nodes_[node].terminal = static_cast<int32_t>(p);
    }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& len) const {
    int32_t node = 0, best = -1;
    for (size_t i = pos; i < text.size(); ++i) {
        auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
        if (it == edges_.end()) break;
        node = it->second;
        if (nodes_[node].terminal >= 0) {
            best = nodes_[node].terminal;
            len = i + 1 - pos;
        }
    }
    return best;
}

namespace {

bool ends_with_word_char(std::string_view s) {
    if (s.empty()) return false;
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    return is_word_char(next_code_point(s, i));
}

bool starts_with_word_char(std::string_view s) {
    if (s.empty()) return false;
    size_t i = 0;
    return is_word_char(next_code_point(s, i));
}

// Start of the run of whitespace that ends s.
size_t whitespace_run_start(std::string_view s) {
    size_t e = s.size();
    while (e > 0) {
        size_t start = e - 1;
        while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_whitespace(next_code_point(s, i))) break;
        e = start;
    }
    return e;
}

// Length of the run of whitespace that starts s.
size_t whitespace_run_len(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        size_t j = i;
        if (!is_whitespace(next_code_point(s, j))) break;
        i = j;
    }
    return i;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
    if (text.empty()) return;
    size_t emitted = 0;  // end of the last segment pushed
    size_t pos = 0;
    while (pos < text.size()) {
        // Leftmost start with a match.
        size_t len = 0;
        int32_t pat = -1;
        size_t start = pos;
        for (; start < text.size(); ++start) {
            if (!first_byte_[static_cast<uint8_t>(text[start])]) continue;
            pat = longest_at(text, start, len);
            if (pat >= 0) break;
        }
        if (pat < 0) break;
        size_t stop = start + len;
        pos = stop;
        const AddedToken* tok = tokens_[pat];
        if (tok->single_word) {
            bool start_ok = start == 0 || !ends_with_word_char(text.substr(0, start));
            bool stop_ok = stop == text.size() || !starts_with_word_char(text.substr(stop));
            if (!start_ok || !stop_ok) continue;
        }
        if (tok->lstrip) {
            size_t ns = whitespace_run_start(text.substr(0, start));
            start = ns > emitted ? ns : emitted;
        }
        if (tok->rstrip) stop += whitespace_run_len(text.substr(stop));
        if (emitted < start) out.push_back({emitted, start, -1});
        out.push_back({start, stop, tok->id});
        emitted = stop;
        pos = stop;
    }
    if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace deepinfer::tok
