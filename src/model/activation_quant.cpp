#include "model/activation_quant.h"

#include <cstdlib>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer {

ActivationQuant ActivationQuant::from_env() {
    const char* v = std::getenv("DEEPINFER_FP8_ACTIVATIONS");
    const std::string s = v ? v : "";
    DI_CHECK(s.empty() || s == "0" || s == "1", "DEEPINFER_FP8_ACTIVATIONS must be 0 or 1, not '", s, "'");
    return ActivationQuant{s == "1" ? 128 : 0};
}

void ActivationQuant::linears(Backend& be, TensorView x, const std::vector<Backend::Projection>& ps) const {
    std::vector<Backend::Projection> plain, quantized;
    for (const Backend::Projection& p : ps) (quantizes(*p.w) ? quantized : plain).push_back(p);
    if (!plain.empty()) be.linears(x, plain);
    if (!quantized.empty()) be.quantized_linears(x, QuantSim::kFp8Ue8m0, block, quantized);
}

void ActivationQuant::linear(Backend& be, TensorView out, TensorView x, const LinearWeight& w) const {
    if (quantizes(w))
        be.quantized_linears(x, QuantSim::kFp8Ue8m0, block, {{out, &w}});
    else
        be.linear(out, x, w);
}

void ActivationQuant::grouped_linear(Backend& be, TensorView out, TensorView x, const LinearWeight& w,
                                     int groups) const {
    if (quantizes(w))
        be.quantized_grouped_linear(out, x, QuantSim::kFp8Ue8m0, block, w, groups);
    else
        be.grouped_linear(out, x, w, groups);
}

}  // namespace deepinfer
