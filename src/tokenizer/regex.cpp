#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "deepinfer/error.h"

namespace deepinfer::tok {

namespace {

// The Unicode White_Space property as class members (usable inside [...] ).
constexpr const char* kWhiteSpaceMembers =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

struct MatchData {
    pcre2_match_data* data = nullptr;
    MatchData() : data(pcre2_match_data_create(4, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(data); }
};

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
    std::string out;
    out.reserve(p.size() + 16);
    int class_depth = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            char n = p[i + 1];
            if (n == 's') {
                if (class_depth > 0) {
                    out += kWhiteSpaceMembers;
                } else {
                    out += "[";
                    out += kWhiteSpaceMembers;
                    out += "]";
                }
            } else if (n == 'S' && class_depth == 0) {
                out += "[^";
                out += kWhiteSpaceMembers;
                out += "]";
            } else {
                out.push_back(c);
                out.push_back(n);
            }
            ++i;
            continue;
        }
        if (c == '[') {
            ++class_depth;
            out.push_back(c);
            // A ']' right after '[' or '[^' is a literal member.
            if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
            if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
            continue;
        }
        if (c == ']' && class_depth > 0) --class_depth;
        out.push_back(c);
    }
    return out;
}

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
    std::string translated = onig_to_pcre2(pattern);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        DI_THROW("invalid regex '", pattern, "' at offset ", err_offset, ": ", reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<Span>& out) const {
    thread_local MatchData md;
    auto* code = static_cast<pcre2_code*>(code_);
    auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
        int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.data, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        DI_CHECK(rc >= 0, "regex '", pattern_, "' failed while matching (PCRE2 error ", rc, ")");
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
        size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.push_back({b, e});
            pos = e;
        } else {  // empty match: step over one character
            if (b >= s.size()) break;
            pos = b + 1;
            while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        }
    }
}

}  // namespace deepinfer::tok
