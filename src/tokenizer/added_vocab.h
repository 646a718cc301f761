// Finds added tokens in text: leftmost-longest, non-overlapping matches of a set of strings, with the
// single_word / lstrip / rstrip rules of Hugging Face tokenizers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tok {

struct AddedToken {
    std::string content;
    // What decode() shows: the content run through the normalizer when `normalized` (as Hugging Face
    // tokenizers 0.23 does), else the content.
    std::string decoded;
    int32_t id = -1;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = true;
    bool special = false;
};

// A piece of text: either an added token (id >= 0) or plain text (id < 0), as a byte range.
struct Segment {
    size_t begin, end;
    int32_t id;
};

class AddedTokenMatcher {
public:
    // `patterns[i]` is what token `tokens[i]` looks like in the text it is matched against.
    void build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens);
    bool empty() const { return tokens_.empty(); }
    // Splits text into segments covering it completely (empty text gives no segments).
    void split(std::string_view text, std::vector<Segment>& out) const;

private:
    // Longest pattern starting at text[pos]: its index, or -1.
    int32_t longest_at(std::string_view text, size_t pos, size_t& len) const;

    struct Node {
        int32_t terminal = -1;  // pattern index ending here
    };
    std::vector<Node> nodes_;
    std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child
    bool first_byte_[256] = {};
    std::vector<const AddedToken*> tokens_;
};

}  // namespace deepinfer::tok
