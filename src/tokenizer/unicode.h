// UTF-8 helpers and the Unicode character classes the tokenizer needs (backed by utf8proc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tok {

// Decodes the code point starting at s[i] (s must be valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Length in bytes of the UTF-8 sequence introduced by lead byte b (1 for continuation/invalid bytes).
inline size_t utf8_seq_len(uint8_t b) {
    return b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
}

// Byte offset of the first invalid UTF-8 sequence in s, or npos when s is valid UTF-8.
size_t find_invalid_utf8(std::string_view s);
// Length of the longest prefix of s that ends on a character boundary, treating a trailing incomplete
// (but so far valid) sequence as not yet complete. Invalid bytes count as complete (they decode to U+FFFD).
size_t complete_utf8_prefix(std::string_view s);
// Decodes bytes as UTF-8, replacing each maximal invalid subpart with U+FFFD (as Rust's from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space property (Rust char::is_whitespace, Oniguruma \s).
bool is_whitespace(char32_t c);
// General category groups.
bool is_letter(char32_t c);
bool is_mark(char32_t c);
bool is_numeric(char32_t c);        // N* (Rust char::is_numeric)
bool is_decimal_digit(char32_t c);  // Nd
bool is_punctuation(char32_t c);    // P*
// Unicode "word" character (Rust regex / Oniguruma \w): Alphabetic, Mark, Nd, Pc, Join_Control.
bool is_word_char(char32_t c);
// Simple-plus-special lowercase mapping of one character (Rust char::to_lowercase), appended to out.
void append_lowercase(std::string& out, char32_t c);

}  // namespace deepinfer::tok
