#include "tokenizer/byte_level.h"

#include "tokenizer/unicode.h"

namespace deepinfer::tok {

namespace {

struct Alphabet {
    std::array<std::string, 256> chars;
    std::array<int16_t, 512> byte_of;  // indexed by code point (all alphabet code points are < 512)
    Alphabet() {
        byte_of.fill(-1);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
            append_utf8(chars[b], cp);
            byte_of[cp] = static_cast<int16_t>(b);
        }
    }
};

const Alphabet& alphabet() {
    static const Alphabet a;
    return a;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return alphabet().chars; }

int byte_level_byte(char32_t c) { return c < 512 ? alphabet().byte_of[c] : -1; }

void byte_level_encode(std::string_view bytes, std::string& out) {
    const auto& chars = alphabet().chars;
    for (unsigned char b : bytes) out += chars[b];
}

bool byte_level_decode(std::string_view text, std::string& out) {
    size_t i = 0;
    while (i < text.size()) {
        char32_t c = next_code_point(text, i);
        int b = byte_level_byte(c);
        if (b < 0) return false;
        out.push_back(static_cast<char>(b));
    }
    return true;
}

}  // namespace deepinfer::tok
