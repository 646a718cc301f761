// Small per-step host arrays (token ids, positions, attention index lists, row addresses) copied into the
// backend's memory for the ops that read them, kept alive until the step ends.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace deepinfer {

// Arrays are staged on the host and copied in one transfer (each upload is a copy of its own on a device, a
// few microseconds): stage_*() keeps a host copy and returns a handle; reserve_i32() and reserve_rows() ask for
// room in the same block that backend ops fill (nothing staged or copied); upload_staged() allocates the block and
// copies everything staged; view() then gives an array in backend memory, alive as long as this object.
class StepArrays {
public:
    explicit StepArrays(Backend& backend) : backend_(backend) {}

    struct Handle {
        size_t offset = 0;  // bytes into the staged arrays, or into the reserved ones that follow them
        DType dtype = DType::kI32;
        int64_t n = 0;
        bool reserved = false;
    };
    Handle stage_i32(std::span<const int32_t> values);
    Handle stage_i64(std::span<const int64_t> values);
    Handle reserve_i32(int64_t n);
    // Room for n row addresses (I64) that backend ops write (fill_row_addresses).
    Handle reserve_rows(int64_t n);
    // Device addresses of rows (for gather_rows / scatter_rows).
    Handle stage_rows(std::span<float* const> addresses);
    void upload_staged();
    TensorView view(const Handle& h) const;

private:
    Handle stage(const void* data, DType dtype, int64_t n);
    Handle reserve(DType dtype, int64_t n);

    Backend& backend_;
    Tensor block_;                    // the staged arrays in backend memory (after upload_staged)
    std::vector<uint8_t> staged_;     // their host bytes, each array at a 16-byte boundary
    size_t reserved_bytes_ = 0;       // reserved arrays, each at a 16-byte boundary, after the staged ones
    uint8_t* staged_base_ = nullptr;  // block_'s data
};

struct PagedRows;

// Rows as runs of equally spaced addresses, for Backend::fill_row_addresses: values [runs, 4] = (at, address,
// count, stride in bytes), `at` counting the rows of the runs before.
struct RowRuns {
    std::vector<int64_t> values;
    int64_t rows = 0;

    // count rows of row_elems floats from `first` on (no run when count is 0), in runs of at most kMaxRunRows
    // (device backends give each run a block of threads).
    void add(const float* first, int64_t count, int64_t row_elems);
    static constexpr int64_t kMaxRunRows = 2048;
    // The first count rows of a paged buffer, a run a page.
    void add_paged(const PagedRows& paged, int64_t count);
    // Whether every row's address is a multiple of `bytes`.
    bool aligned(int64_t bytes) const;
    // These runs, then `more`'s, whose rows follow these (from row `rows` on).
    std::vector<int64_t> concat(const RowRuns& more) const;
};

// A device tensor's values on the host (a copy; the tensor itself on host backends).
Tensor to_host(Backend& backend, TensorView t);

}  // namespace deepinfer
