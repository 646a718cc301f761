// Stop strings: finding the first stop string in generated text as it grows, and how much text a stream
// must hold back because it could still become the start of a stop string.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace deepinfer {

struct StopMatch {
    size_t pos = 0;    // byte offset of the match in the text
    size_t index = 0;  // which stop string
};

// The earliest occurrence of any stop string that ends after byte `new_from` (text before new_from was
// searched already). On equal positions the earlier stop string in the list wins.
std::optional<StopMatch> find_stop_string(std::string_view text, size_t new_from, std::span<const std::string> stops);

// Bytes at the end of a growing text that may still be the start of a stop string (the longest stop string
// minus one); a stream emits only text before them.
size_t stop_string_holdback(std::span<const std::string> stops);

// The largest n <= limit such that text[:n] does not end inside a UTF-8 multi-byte sequence.
size_t utf8_safe_prefix(std::string_view text, size_t limit);

}  // namespace deepinfer
