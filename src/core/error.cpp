#include "deepinfer/error.h"

namespace deepinfer::detail {

void throw_check_failure(const std::string& message) { throw Error(message); }

void throw_internal_failure(const char* file, int line, const char* condition, const std::string& message) {
    std::string text = concat("internal error at ", file, ":", line, ": check `", condition, "` failed");
    if (!message.empty()) text += ": " + message;
    throw InternalError(text);
}

}  // namespace deepinfer::detail
