// The GPT-2 byte-level alphabet: every byte is shown as one printable Unicode character.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tok {

// UTF-8 of the character standing for each byte.
const std::array<std::string, 256>& byte_level_chars();
// The byte a byte-level character stands for, or -1 when c is not in the alphabet.
int byte_level_byte(char32_t c);
// Maps raw bytes to their byte-level characters (appending to out).
void byte_level_encode(std::string_view bytes, std::string& out);
// Maps a byte-level string back to bytes; returns false (leaving out unspecified) when some character is
// outside the alphabet.
bool byte_level_decode(std::string_view text, std::string& out);

}  // namespace deepinfer::tok
