#include "tokenizer/hash_table.h"

#include "deepinfer/error.h"

namespace deepinfer::tok {

void StringIdMap::grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.id < 0) continue;
        uint64_t h = hash_bytes(std::string_view(arena_.data() + s.offset, s.len));
        size_t i = h & mask;
        while (slots_[i].id >= 0) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void StringIdMap::insert(std::string_view key, int32_t id) {
    DI_ICHECK(id >= 0, "negative id");
    if ((count_ + 1) * 2 > slots_.size()) grow();
    uint64_t h = hash_bytes(key);
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        Slot& s = slots_[i];
        if (s.id < 0) {
            DI_CHECK(arena_.size() + key.size() < (1ull << 32), "vocabulary too large");
            s.hash = static_cast<uint32_t>(h);
            s.offset = static_cast<uint32_t>(arena_.size());
            s.len = static_cast<uint32_t>(key.size());
            s.id = id;
            arena_.append(key);
            ++count_;
            return;
        }
        if (s.hash == static_cast<uint32_t>(h) && s.len == key.size() &&
            std::string_view(arena_.data() + s.offset, s.len) == key) {
            s.id = id;
            return;
        }
    }
}

void PairMap::grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key == kEmpty) continue;
        size_t i = mix64(s.key) & mask;
        while (slots_[i].key != kEmpty) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void PairMap::insert(int32_t a, int32_t b, MergeInfo info) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t mask = slots_.size() - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        Slot& s = slots_[i];
        if (s.key == kEmpty) {
            s.key = key;
            s.info = info;
            ++count_;
            return;
        }
        if (s.key == key) {
            s.info = info;
            return;
        }
    }
}

}  // namespace deepinfer::tok
