// Small open-addressing hash tables for the tokenizer's hot paths: string -> id (vocabulary) and
// (id, id) -> (rank, id) (BPE merges). Both are built once and read concurrently without locks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tok {

inline uint64_t hash_bytes(std::string_view s) {
    // FNV-1a over 8-byte words followed by a final mix; fast for the short keys tokenizers use.
    uint64_t h = 0xcbf29ce484222325ull ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t w;
        __builtin_memcpy(&w, s.data() + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    uint64_t tail = 0;
    __builtin_memcpy(&tail, s.data() + i, s.size() - i);
    h = (h ^ tail) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

class StringIdMap {
public:
    // Inserts or overwrites.
    void insert(std::string_view key, int32_t id);
    // -1 when absent.
    int32_t find(std::string_view key) const {
        if (slots_.empty()) return -1;
        uint64_t h = hash_bytes(key);
        size_t mask = slots_.size() - 1;
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.id < 0) return -1;
            if (s.hash == static_cast<uint32_t>(h) && s.len == key.size() &&
                std::string_view(arena_.data() + s.offset, s.len) == key)
                return s.id;
        }
    }
    size_t size() const { return count_; }

private:
    struct Slot {
        uint32_t hash = 0;
        uint32_t offset = 0;
        uint32_t len = 0;
        int32_t id = -1;
    };
    void grow();
    std::vector<Slot> slots_;
    std::string arena_;
    size_t count_ = 0;
};

struct MergeInfo {
    int32_t rank;
    int32_t new_id;
};

class PairMap {
public:
    void insert(int32_t a, int32_t b, MergeInfo info);
    // nullptr when the pair has no merge.
    const MergeInfo* find(int32_t a, int32_t b) const {
        if (slots_.empty()) return nullptr;
        uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
        size_t mask = slots_.size() - 1;
        for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
            const Slot& s = slots_[i];
            if (s.key == kEmpty) return nullptr;
            if (s.key == key) return &s.info;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~0ull;
    struct Slot {
        uint64_t key = kEmpty;
        MergeInfo info{};
    };
    void grow();
    std::vector<Slot> slots_;
    size_t count_ = 0;
};

}  // namespace deepinfer::tok
