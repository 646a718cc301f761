#include "tokenizer/unicode.h"

#include <utf8proc.h>

namespace deepinfer::tok {

char32_t next_code_point(std::string_view s, size_t& i) {
    auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
        ++i;
        return b;
    }
    size_t n = utf8_seq_len(b);
    if (n == 1 || i + n > s.size()) {  // not expected on validated input; consume one byte
        ++i;
        return 0xFFFD;
    }
    char32_t cp = b & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    i += n;
    return cp;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

namespace {

// Length of the valid UTF-8 sequence at s[i], 0 when it is invalid, or -k when it is a valid but
// truncated prefix of length k that runs into the end of s.
int valid_seq_at(std::string_view s, size_t i) {
    auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) return 1;
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int k = 1; k < n; ++k) {
        if (i + k >= s.size()) return -k;
        auto b = static_cast<uint8_t>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

// Number of bytes forming the maximal invalid subpart at s[i] (at least 1).
size_t invalid_subpart_len(std::string_view s, size_t i) {
    auto b0 = static_cast<uint8_t>(s[i]);
    uint8_t lo = 0x80, hi = 0xBF;
    int n = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    }
    size_t len = 1;
    for (int k = 1; k < n && i + k < s.size(); ++k) {
        auto b = static_cast<uint8_t>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
        ++len;
    }
    return len;
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        int n = valid_seq_at(s, i);
        if (n <= 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

size_t complete_utf8_prefix(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        int n = valid_seq_at(s, i);
        if (n > 0) {
            i += n;
        } else if (n < 0) {
            return i;  // valid but incomplete tail
        } else {
            i += invalid_subpart_len(s, i);
        }
    }
    return i;
}

std::string utf8_lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        int n = valid_seq_at(s, i);
        if (n > 0) {
            out.append(s.data() + i, n);
            i += n;
        } else {
            out.append("\xEF\xBF\xBD");
            i += n < 0 ? static_cast<size_t>(-n) : invalid_subpart_len(s, i);
        }
    }
    return out;
}

bool is_whitespace(char32_t c) {
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
inline utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
}  // namespace

bool is_letter(char32_t c) {
    auto k = category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_mark(char32_t c) {
    auto k = category(c);
    return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}
bool is_numeric(char32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    auto k = category(c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_decimal_digit(char32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return category(c) == UTF8PROC_CATEGORY_ND;
}
bool is_punctuation(char32_t c) {
    auto k = category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool is_word_char(char32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    auto k = category(c);
    if ((k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
        k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC)
        return true;
    // Join_Control and the Other_Alphabetic symbols (circled / squared Latin letters).
    return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
           (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

void append_lowercase(std::string& out, char32_t c) {
    if (c < 0x80) {
        out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
        return;
    }
    if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
        out.append("i\xCC\x87");
        return;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace deepinfer::tok
