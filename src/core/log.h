// Minimal leveled logging to stderr. Level from DEEPINFER_LOG_LEVEL (debug|info|warn|error), default warn.
#pragma once

#include "deepinfer/error.h"

namespace deepinfer {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

}  // namespace deepinfer

#define DI_LOG(level, ...)                                                                   \
    do {                                                                                     \
        if (::deepinfer::LogLevel::level >= ::deepinfer::log_level())                        \
            ::deepinfer::log_message(::deepinfer::LogLevel::level, ::deepinfer::detail::concat(__VA_ARGS__)); \
    } while (0)
