// Test helpers: fixture paths, .npy loading and the error measure of the tolerance table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "core/npy.h"

namespace deepinfer::testing_support {

// A fixture path: under DEEPINFER_TEST_DATA_DIR when set (binaries run from another checkout), else the
// source tree's tests/data.
inline std::string data_path(const std::string& rel) {
    const char* dir = std::getenv("DEEPINFER_TEST_DATA_DIR");
    return std::string(dir && *dir ? dir : DI_TEST_DATA_DIR) + "/" + rel;
}

// The backend the model tests run on: DEEPINFER_TEST_DEVICE (cpu, cuda, cuda:N), cpu by default.
inline std::string test_device() {
    const char* d = std::getenv("DEEPINFER_TEST_DEVICE");
    return d && *d ? d : "cpu";
}

inline std::vector<float> load_f32(const std::string& path, std::vector<int64_t>* shape = nullptr) {
    NpyArray a = read_npy(path);
    if (shape) *shape = a.shape;
    return a.to_f32();
}

inline std::vector<int32_t> load_i32(const std::string& path) {
    std::vector<int32_t> out;
    for (int64_t v : read_npy(path).to_i64()) out.push_back(static_cast<int32_t>(v));
    return out;
}

// max |a - ref| / max |ref| over everything; NaN anywhere gives +inf (NaN never passes).
inline double rel_error(const float* a, const float* ref, size_t n) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) || std::isnan(ref[i])) return INFINITY;
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - ref[i])));
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

inline double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
    return a.size() == ref.size() ? rel_error(a.data(), ref.data(), a.size()) : INFINITY;
}

// Per-row errors of [rows, cols] logits: row r's max |a - ref| over max |ref| of the whole tensor. For models
// with discrete choices (top-k routing, top-k attention) a small perturbation may flip one choice at one
// position: that row (and the rows attending to it) move far while the rest stay at the perturbation's size,
// so the distribution tells a flip from a wrong kernel, which moves every row.
struct RowErrors {
    double median = INFINITY, max = INFINITY;
    double within = 0;  // fraction of rows at or under the bound
};

inline RowErrors row_errors(const float* a, const float* ref, size_t rows, size_t cols, double bound) {
    double max_ref = 0;
    for (size_t i = 0; i < rows * cols; ++i) max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
    std::vector<double> err(rows);
    for (size_t r = 0; r < rows; ++r) {
        double d = 0;
        for (size_t c = 0; c < cols; ++c) {
            const float x = a[r * cols + c], y = ref[r * cols + c];
            d = std::isnan(x) || std::isnan(y) ? INFINITY : std::max(d, static_cast<double>(std::fabs(x - y)));
        }
        err[r] = max_ref > 0 ? d / max_ref : d;
    }
    RowErrors out;
    if (rows == 0) return out;
    size_t within = 0;
    for (double e : err) within += e <= bound;
    out.within = static_cast<double>(within) / static_cast<double>(rows);
    std::sort(err.begin(), err.end());
    out.median = err[rows / 2];
    out.max = err.back();
    return out;
}

// Length of the common prefix of two token sequences.
inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

}  // namespace deepinfer::testing_support
