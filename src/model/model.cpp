#include "model/model.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/file.h"
#include "deepinfer/error.h"
#include "model/config_reader.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v4/model.h"
#include "model/safetensors.h"

namespace deepinfer {

size_t StateSpec::ring_bytes() const {
    size_t n = 0;
    for (const StateBufferSpec& b : buffers)
        if (b.ring_rows > 0) n += static_cast<size_t>(b.ring_rows * b.row_elems) * 4;
    return n;
}

double StateSpec::paged_bytes_per_token() const {
    double n = 0;
    for (const StateBufferSpec& b : buffers)
        if (b.tokens_per_row > 0) n += 4.0 * static_cast<double>(b.row_elems) / static_cast<double>(b.tokens_per_row);
    return n;
}

SequenceMemory allocate_sequence_memory(const StateSpec& spec, int64_t max_tokens, Backend& backend,
                                        std::vector<Tensor>* storage) {
    DI_CHECK(max_tokens > 0, "state capacity must be positive");
    SequenceMemory memory;
    memory.rings.resize(spec.buffers.size());
    memory.pages.resize(spec.buffers.size());
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        const int64_t rows = b.ring_rows > 0 ? b.ring_rows : b.rows_for(max_tokens) + 1;
        storage->push_back(backend.alloc(DType::kF32, Shape{rows, b.row_elems}));
        if (b.ring_rows > 0) memory.rings[i] = storage->back().view();
        else memory.pages[i] = PagedRows{{storage->back().f32()}, rows, b.row_elems};
    }
    return memory;
}

void check_sequence_memory(const StateSpec& spec, const SequenceMemory& memory) {
    DI_CHECK(memory.rings.size() == spec.buffers.size() && memory.pages.size() == spec.buffers.size(),
             "state memory has ", memory.rings.size(), " buffers, the model needs ", spec.buffers.size());
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        if (b.ring_rows > 0) {
            DI_CHECK(memory.rings[i].dtype() == DType::kF32 && memory.rings[i].numel() == b.ring_rows * b.row_elems,
                     "state buffer ", b.name, " must be f32 [", b.ring_rows, ", ", b.row_elems, "]");
        } else {
            DI_CHECK(memory.pages[i].row_elems == b.row_elems && memory.pages[i].rows_per_block > 0, "state buffer ",
                     b.name, " must have rows of ", b.row_elems, " floats");
        }
    }
}

int64_t paged_capacity(const StateSpec& spec, const SequenceMemory& memory) {
    int64_t cap = INT64_MAX;
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        // rows_for(n) = n / tokens_per_row must not exceed the rows present.
        if (b.tokens_per_row > 0) cap = std::min(cap, (memory.pages[i].capacity_rows() + 1) * b.tokens_per_row - 1);
    }
    return cap;
}

void copy_sequence_memory(Backend& backend, const StateSpec& spec, const SequenceMemory& src, SequenceMemory& dst,
                          int64_t num_tokens) {
    check_sequence_memory(spec, src);
    check_sequence_memory(spec, dst);
    std::vector<float> staging;
    auto copy_rows = [&](float* to, const float* from, int64_t rows, int64_t row_elems) {
        staging.resize(static_cast<size_t>(rows * row_elems));
        const Shape shape{rows, row_elems};
        backend.download(staging.data(), TensorView(const_cast<float*>(from), DType::kF32, shape));
        backend.upload(TensorView(to, DType::kF32, shape), staging.data());
    };
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        if (b.ring_rows > 0) {
            copy_rows(dst.rings[i].f32(), src.rings[i].f32(), b.ring_rows, b.row_elems);
            continue;
        }
        // Rows [0, rows_for(n)] (the last may be partly filled), in runs that stay inside one block of each.
        const PagedRows& from = src.pages[i];
        const PagedRows& to = dst.pages[i];
        const int64_t rows = std::min(b.rows_for(num_tokens) + 1, from.capacity_rows());
        DI_CHECK(rows <= to.capacity_rows(), "state buffer ", b.name, ": the copy needs ", rows,
                 " rows, the destination has ", to.capacity_rows());
        for (int64_t r = 0; r < rows;) {
            const int64_t run = std::min({rows - r, from.rows_per_block - r % from.rows_per_block,
                                          to.rows_per_block - r % to.rows_per_block});
            copy_rows(to.row(r), from.row(r), run, b.row_elems);
            r += run;
        }
    }
}

Checkpoint open_checkpoint(const std::string& dir, const LoadOptions& options) {
    if (options.format == "random") return Checkpoint::synthetic("random weights for " + dir, options.seed);
    DI_CHECK(options.format == "auto", "load format must be auto or random, got '", options.format, "'");
    return Checkpoint(dir);
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, Backend& backend, const LoadOptions& options) {
    const std::string config_path = path_join(dir, "config.json");
    DI_CHECK(file_exists(dir), "model directory ", dir, " does not exist");
    DI_CHECK(file_exists(config_path), dir, " has no config.json (expected a Hugging Face checkpoint directory)");
    const std::string text = read_file(config_path);
    const nlohmann::json j = parse_config_object(text, config_path);
    const std::string model_type = ConfigReader(j, config_path).string("model_type", "");
    if (model_type == "deepseek_v4") return std::make_unique<dsv4::DeepseekV4Model>(dir, text, backend, options);
    if (model_type == "deepseek_v41") return std::make_unique<dsv41::DeepseekV41Model>(dir, text, backend, options);
    DI_THROW(config_path, ": unsupported model_type \"", model_type, "\" (supported: deepseek_v4, deepseek_v41)");
}

}  // namespace deepinfer
