// Errors raised by DeepInfer. Caller mistakes (bad input, bad checkpoints, bad requests) throw
// deepinfer::Error with a message meant for the user; broken internal invariants throw
// deepinfer::InternalError. Both are caught at the CLI / Python / HTTP boundary.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace deepinfer {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class InternalError : public Error {
public:
    explicit InternalError(const std::string& message) : Error(message) {}
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
}

[[noreturn]] void throw_check_failure(const std::string& message);
[[noreturn]] void throw_internal_failure(const char* file, int line, const char* condition, const std::string& message);

}  // namespace detail
}  // namespace deepinfer

// Validates caller input: throws deepinfer::Error(message) when `cond` is false.
#define DI_CHECK(cond, ...)                                                               \
    do {                                                                                  \
        if (!(cond)) ::deepinfer::detail::throw_check_failure(::deepinfer::detail::concat(__VA_ARGS__)); \
    } while (0)

// Validates an internal invariant: throws deepinfer::InternalError with file:line.
#define DI_ICHECK(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond))                                                                          \
            ::deepinfer::detail::throw_internal_failure(__FILE__, __LINE__, #cond,            \
                                                        ::deepinfer::detail::concat(__VA_ARGS__)); \
    } while (0)

#define DI_THROW(...) ::deepinfer::detail::throw_check_failure(::deepinfer::detail::concat(__VA_ARGS__))
