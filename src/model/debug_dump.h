// DEEPINFER_DEBUG_DUMP=DIR makes models write intermediate tensors of each forward call as DIR/<name>.npy,
// to compare with a reference implementation's intermediates (or one path with another).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

bool debug_dump_enabled();
void debug_dump(const std::string& name, TensorView t);
void debug_dump(const std::string& name, const std::vector<int32_t>& values, int64_t cols);

}  // namespace deepinfer
