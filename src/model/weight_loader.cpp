#include "model/weight_loader.h"

#include <algorithm>
#include <cstring>

#include "model/random_weights.h"

namespace deepinfer {

WeightLoader::WeightLoader(Checkpoint& ckpt, std::vector<std::pair<std::string, std::string>> aliases)
    : ckpt_(ckpt), aliases_(std::move(aliases)) {}

std::vector<std::string> WeightLoader::candidates(const std::string& canonical) const {
    std::vector<std::string> names = {canonical};
    for (const auto& [from, to] : aliases_) {
        size_t pos = canonical.find(from);
        if (pos == std::string::npos) continue;
        // Match whole dot-separated components only.
        bool starts = pos == 0 || canonical[pos - 1] == '.';
        bool ends = pos + from.size() == canonical.size() || canonical[pos + from.size()] == '.';
        if (!starts || !ends) continue;
        names.push_back(canonical.substr(0, pos) + to + canonical.substr(pos + from.size()));
    }
    const size_t n = names.size();
    for (size_t i = 0; i < n; ++i) names.push_back("model." + names[i]);
    return names;
}

std::string WeightLoader::find(const std::string& canonical) const {
    for (const std::string& name : candidates(canonical))
        if (ckpt_.has(name)) return name;
    return "";
}

TensorView WeightLoader::require(const std::string& canonical, std::string* actual) {
    std::string name = find(canonical);
    if (name.empty()) {
        std::string tried;
        for (const std::string& c : candidates(canonical)) tried += (tried.empty() ? "" : ", ") + c;
        DI_THROW("checkpoint ", ckpt_.dir(), ": missing tensor '", canonical, "' (looked for ", tried, ")");
    }
    used_.push_back(name);
    if (actual) *actual = name;
    return ckpt_.view(name);
}

namespace {

std::string where(Checkpoint& ckpt, const std::string& name) { return ckpt.file_of(name) + ": tensor '" + name + "'"; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

LinearWeight WeightLoader::linear(const std::string& base, int64_t rows, int64_t cols) {
    if (absent_to_synthesize(base + ".weight"))
        for (NamedTensor& t : random_matrix(base, rows, cols, release_format(base), fp8_block_rows_, fp8_block_cols_,
                                            tensor_seed(ckpt_.seed(), base)))
            ckpt_.add(t.name, std::move(t.tensor));
    std::string name;
    TensorView data = require(base + ".weight", &name);
    LinearWeight w;
    w.name = name;
    w.rows = rows;
    w.cols = cols;
    w.data = data;
    const Shape& s = data.shape();
    const std::string at = where(ckpt_, name);
    switch (data.dtype()) {
        case DType::kF32:
        case DType::kBF16:
        case DType::kF16:
            DI_CHECK(s == Shape({rows, cols}), at, " has shape ", s.str(), ", expected [", rows, ", ", cols, "]");
            w.format = WeightFormat::kDense;
            return w;
        case DType::kF8E4M3: {
            DI_CHECK(s == Shape({rows, cols}), at, " has shape ", s.str(), ", expected [", rows, ", ", cols, "]");
            w.format = WeightFormat::kFp8Block;
            w.block_rows = fp8_block_rows_;
            w.block_cols = fp8_block_cols_;
            std::string scale_name;
            if (has(base + ".scale")) w.scale = require(base + ".scale", &scale_name);
            else if (has(base + ".weight_scale_inv")) w.scale = require(base + ".weight_scale_inv", &scale_name);
            else DI_THROW(at, " is F8_E4M3 but neither '", base, ".scale' nor '", base, ".weight_scale_inv' exists");
            const Shape expected{ceil_div(rows, w.block_rows), ceil_div(cols, w.block_cols)};
            DI_CHECK(w.scale.dtype() == DType::kE8M0 || w.scale.dtype() == DType::kF32, where(ckpt_, scale_name),
                     " has dtype ", dtype_name(w.scale.dtype()), ", expected F8_E8M0 or F32 block scales");
            DI_CHECK(w.scale.shape() == expected, where(ckpt_, scale_name), " has shape ", w.scale.shape().str(),
                     ", expected ", expected.str(), " (", w.block_rows, "x", w.block_cols, " blocks)");
            return w;
        }
        case DType::kI8:
        case DType::kU8: {
            // Packed FP4 e2m1: two codes per byte.
            DI_CHECK(cols % 2 == 0 && s == Shape({rows, cols / 2}), at, " (packed FP4) has shape ", s.str(),
                     ", expected [", rows, ", ", cols / 2, "]");
            std::string scale_name;
            DI_CHECK(has(base + ".scale"), at, " is packed FP4 but '", base, ".scale' is missing");
            w.scale = require(base + ".scale", &scale_name);
            DI_CHECK(w.scale.dtype() == DType::kE8M0 && w.scale.ndim() == 2 && w.scale.dim(0) == rows &&
                         w.scale.dim(1) > 0 && cols % w.scale.dim(1) == 0 && (cols / w.scale.dim(1)) % 2 == 0,
                     where(ckpt_, scale_name), " must be F8_E8M0 [", rows, ", ", cols, "/group] for FP4 weights, got ",
                     dtype_name(w.scale.dtype()), " ", w.scale.shape().str());
            w.format = WeightFormat::kFp4Group;
            w.block_cols = static_cast<int>(cols / w.scale.dim(1));
            w.data = TensorView(data.data(), DType::kFP4E2M1, Shape{rows, cols});
            return w;
        }
        default:
            DI_THROW(at, " has dtype ", dtype_name(data.dtype()),
                     "; a weight matrix must be F32, BF16, F16, F8_E4M3 or packed FP4 (I8)");
    }
}

Tensor WeightLoader::f32(const std::string& canonical, Shape shape) {
    if (absent_to_synthesize(canonical))
        ckpt_.add(canonical, random_float_tensor(canonical, shape, tensor_seed(ckpt_.seed(), canonical)));
    std::string name;
    TensorView v = require(canonical, &name);
    DI_CHECK(v.shape() == shape, where(ckpt_, name), " has shape ", v.shape().str(), ", expected ", shape.str());
    DI_CHECK(v.dtype() == DType::kF32 || v.dtype() == DType::kBF16 || v.dtype() == DType::kF16, where(ckpt_, name),
             " has dtype ", dtype_name(v.dtype()), ", expected F32, BF16 or F16");
    Tensor out = Tensor::f32(shape);
    convert_to_f32(v, out.f32());
    return out;
}

std::vector<int32_t> WeightLoader::i32(const std::string& canonical, Shape shape, int32_t random_bound) {
    if (absent_to_synthesize(canonical))
        ckpt_.add(canonical, random_index_table(shape[0], shape.numel() / std::max<int64_t>(shape[0], 1), random_bound,
                                                tensor_seed(ckpt_.seed(), canonical)));
    std::string name;
    TensorView v = require(canonical, &name);
    DI_CHECK(v.shape() == shape, where(ckpt_, name), " has shape ", v.shape().str(), ", expected ", shape.str());
    std::vector<int32_t> out(static_cast<size_t>(v.numel()));
    if (v.dtype() == DType::kI32) {
        std::memcpy(out.data(), v.data(), out.size() * 4);
    } else if (v.dtype() == DType::kI64) {
        for (size_t i = 0; i < out.size(); ++i) {
            int64_t x;
            std::memcpy(&x, static_cast<const uint8_t*>(v.data()) + 8 * i, 8);
            DI_CHECK(x >= INT32_MIN && x <= INT32_MAX, where(ckpt_, name), " holds an out-of-range value ", x);
            out[i] = static_cast<int32_t>(x);
        }
    } else {
        DI_THROW(where(ckpt_, name), " has dtype ", dtype_name(v.dtype()), ", expected I32 or I64");
    }
    return out;
}

}  // namespace deepinfer
