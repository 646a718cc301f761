// A byte trie over token strings, flattened in preorder so that walking it is a linear scan that
// skips whole subtrees when a prefix is rejected.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer::grammar {

struct TokenTrie {
    // Node 0 is the root (empty prefix). Node i's subtree is [i, end[i]); its children are the nodes
    // of that range at depth depth[i] + 1.
    std::vector<uint8_t> byte;     // [n] the last byte of node i's prefix
    std::vector<uint16_t> depth;   // [n]
    std::vector<int32_t> end;      // [n]
    std::vector<int32_t> tok_off;  // [n + 1] tokens whose bytes end at node i: toks[tok_off[i], tok_off[i+1])
    std::vector<int32_t> toks;
    int32_t max_depth = 0;

    int32_t size() const { return static_cast<int32_t>(byte.size()); }
    bool has_children(int32_t i) const { return end[i] > i + 1; }

    // entries: (bytes, token id); empty strings are dropped.
    static TokenTrie build(std::vector<std::pair<std::string, int32_t>> entries);
};

}  // namespace deepinfer::grammar
