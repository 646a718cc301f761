#include "cli_common.h"

#include <chrono>
#include <cstdlib>

#include "core/npy.h"
#include "deepinfer/error.h"

namespace deepinfer::cli {

std::vector<int32_t> read_ids_npy(const std::string& path) {
    NpyArray a = read_npy(path);
    DI_CHECK(a.dtype == DType::kI32 || a.dtype == DType::kI64 || a.dtype == DType::kI16 || a.dtype == DType::kU8 ||
                 a.dtype == DType::kI8,
             path, ": token ids must be an integer array, got ", dtype_name(a.dtype));
    DI_CHECK(a.shape.size() == 1 || (a.shape.size() == 2 && a.shape[0] == 1), path,
             ": token ids must be a 1-D array (or [1, T])");
    std::vector<int32_t> ids;
    for (int64_t v : a.to_i64()) {
        DI_CHECK(v >= 0 && v <= INT32_MAX, path, ": token id ", v, " is negative or too large");
        ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
}

double now_seconds() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace deepinfer::cli
