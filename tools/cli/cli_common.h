// Helpers shared by the deepinfer subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::cli {

// Token ids from a .npy file: a 1-D integer array, or [1, T].
std::vector<int32_t> read_ids_npy(const std::string& path);

double now_seconds();

}  // namespace deepinfer::cli
