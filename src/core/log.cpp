#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace deepinfer {

LogLevel log_level() {
    static const LogLevel level = [] {
        const char* env = std::getenv("DEEPINFER_LOG_LEVEL");
        if (!env) return LogLevel::kWarn;
        if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
        if (!std::strcmp(env, "info")) return LogLevel::kInfo;
        if (!std::strcmp(env, "error")) return LogLevel::kError;
        return LogLevel::kWarn;
    }();
    return level;
}

void log_message(LogLevel level, const std::string& message) {
    static std::mutex mutex;
    static const char* const kNames[] = {"debug", "info", "warn", "error"};
    std::lock_guard<std::mutex> lock(mutex);
    std::fprintf(stderr, "[deepinfer %s] %s\n", kNames[static_cast<int>(level)], message.c_str());
}

}  // namespace deepinfer
