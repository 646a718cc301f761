// A compiled regular expression (PCRE2 with UTF + UCP, JIT-compiled when available) that follows the
// Oniguruma semantics Hugging Face tokenizers uses where the two differ (\s and \S are the Unicode
// White_Space property).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tok {

struct Span {
    size_t begin;
    size_t end;
};

class Regex {
public:
    // Throws deepinfer::Error naming the pattern and PCRE2's message when it does not compile.
    explicit Regex(const std::string& pattern);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Appends the non-overlapping, non-empty matches in s (valid UTF-8) from left to right.
    void find_all(std::string_view s, std::vector<Span>& out) const;
    const std::string& pattern() const { return pattern_; }

private:
    std::string pattern_;
    void* code_ = nullptr;  // pcre2_code_8*
};

// Rewrites an Oniguruma pattern into an equivalent PCRE2 pattern (exposed for tests).
std::string onig_to_pcre2(const std::string& pattern);

}  // namespace deepinfer::tok
