#include "sample/stop_strings.h"

#include <algorithm>

namespace deepinfer {

std::optional<StopMatch> find_stop_string(std::string_view text, size_t new_from, std::span<const std::string> stops) {
    std::optional<StopMatch> best;
    for (size_t k = 0; k < stops.size(); ++k) {
        const std::string& s = stops[k];
        if (s.empty() || s.size() > text.size()) continue;
        // A match must end after new_from: it starts at or after new_from - (len - 1).
        const size_t start = new_from >= s.size() - 1 ? new_from - (s.size() - 1) : 0;
        const size_t pos = text.find(s, start);
        if (pos == std::string_view::npos) continue;
        if (!best || pos < best->pos) best = StopMatch{pos, k};
    }
    return best;
}

size_t stop_string_holdback(std::span<const std::string> stops) {
    size_t longest = 0;
    for (const std::string& s : stops) longest = std::max(longest, s.size());
    return longest > 0 ? longest - 1 : 0;
}

size_t utf8_safe_prefix(std::string_view text, size_t limit) {
    size_t n = std::min(limit, text.size());
    if (n == text.size()) return n;
    // Back up over continuation bytes (10xxxxxx) to the start of the character that text[n] belongs to.
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
    return n;
}

}  // namespace deepinfer
