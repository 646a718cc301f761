#include "backend/cuda/op_profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

OpProfiler::OpProfiler(cudaStream_t stream) : stream_(stream) {
    const char* env = std::getenv("DEEPINFER_CUDA_PROFILE");
    enabled_ = env && *env && std::strcmp(env, "0") != 0;
}

OpProfiler::~OpProfiler() {
    for (const Pending& p : pending_) {
        cudaEventDestroy(p.start);
        cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e;
    DI_CUDA_CHECK(cudaEventCreate(&e));
    return e;
}

OpProfiler::Scope OpProfiler::scope(const char* name) {
    if (!enabled_) return Scope(nullptr, name, nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t start = event();
    DI_CUDA_CHECK(cudaEventRecord(start, stream_));
    return Scope(this, name, start);
}

void OpProfiler::end(const char* name, cudaEvent_t start, double host_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t stop = event();
    DI_CUDA_CHECK(cudaEventRecord(stop, stream_));
    pending_.push_back({name, start, stop, host_ms});
}

void OpProfiler::host_only(const char* name, double host_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    Total& t = totals_[name];
    t.host_ms += host_ms;
    ++t.calls;
}

void OpProfiler::collect() {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Pending> later;  // ended on another thread after the drain
    for (const Pending& p : pending_) {
        if (cudaEventQuery(p.stop) != cudaSuccess) {
            (void)cudaGetLastError();  // "not ready" is not an error; do not leave it as the last one
            later.push_back(p);
            continue;
        }
        float ms = 0;
        DI_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
        Total& t = totals_[p.name];
        t.ms += ms;
        t.host_ms += p.host_ms;
        ++t.calls;
        free_.push_back(p.start);
        free_.push_back(p.stop);
    }
    pending_.swap(later);
}

std::string OpProfiler::take_report() {
    if (!enabled_) return {};
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double all = 0, all_host = 0;
    for (const auto& r : rows) all += r.second.ms, all_host += r.second.host_ms;
    std::string out;
    char line[192];
    std::snprintf(line, sizeof line, "%-22s %10s %8s %10s %7s %10s %12s\n", "op", "ms", "calls", "us/call", "share",
                  "host ms", "host us/call");
    out += line;
    for (const auto& [name, t] : rows) {
        std::snprintf(line, sizeof line, "%-22s %10.3f %8ld %10.1f %6.1f%% %10.3f %12.1f\n", name.c_str(), t.ms,
                      t.calls, t.calls ? 1e3 * t.ms / t.calls : 0.0, all > 0 ? 100.0 * t.ms / all : 0.0, t.host_ms,
                      t.calls ? 1e3 * t.host_ms / t.calls : 0.0);
        out += line;
    }
    std::snprintf(line, sizeof line, "%-22s %10.3f %8s %10s %7s %10.3f\n", "total", all, "", "", "", all_host);
    out += line;
    totals_.clear();
    return out;
}

}  // namespace deepinfer::cuda
