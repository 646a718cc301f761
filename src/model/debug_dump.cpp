#include "model/debug_dump.h"

#include <cstdlib>

#include "core/npy.h"

namespace deepinfer {

namespace {
const char* dump_dir() {
    static const char* dir = std::getenv("DEEPINFER_DEBUG_DUMP");
    return dir && *dir ? dir : nullptr;
}
}  // namespace

bool debug_dump_enabled() { return dump_dir() != nullptr; }

void debug_dump(const std::string& name, TensorView t) {
    if (!dump_dir()) return;
    std::vector<int64_t> shape(t.shape().dims, t.shape().dims + t.ndim());
    write_npy(std::string(dump_dir()) + "/" + name + ".npy", t.f32(), shape);
}

void debug_dump(const std::string& name, const std::vector<int32_t>& values, int64_t cols) {
    if (!dump_dir()) return;
    write_npy(std::string(dump_dir()) + "/" + name + ".npy", values.data(),
              {static_cast<int64_t>(values.size()) / cols, cols});
}

}  // namespace deepinfer
