// Per-op device time for DEEPINFER_CUDA_PROFILE=1: CUDA events around every op of the backend's stream,
// read back whenever the stream has drained, summed by op name; beside it the host time spent issuing each op
// (its launches, allocations and uploads, and any wait inside them), and rows of host-only time for what is issued
// between ops (allocations of the model's tensors; frees only push a block onto the block cache's free list, so
// they have no row). Off (and free) otherwise.
#pragma once

#include <cuda_runtime.h>

#include <chrono>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace deepinfer::cuda {

class OpProfiler {
public:
    explicit OpProfiler(cudaStream_t stream);
    ~OpProfiler();
    OpProfiler(const OpProfiler&) = delete;
    OpProfiler& operator=(const OpProfiler&) = delete;

    bool enabled() const { return enabled_; }

    // Marks the op's end on destruction.
    class Scope {
    public:
        Scope(OpProfiler* p, const char* name, cudaEvent_t start)
            : p_(p), name_(name), start_(start), issued_(p ? std::chrono::steady_clock::now() : Clock::time_point{}) {
            if (p_) ++depth_;
        }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
        ~Scope() {
            if (!p_) return;
            --depth_;
            p_->end(name_, start_, std::chrono::duration<double, std::milli>(Clock::now() - issued_).count());
        }

    private:
        using Clock = std::chrono::steady_clock;
        OpProfiler* p_;
        const char* name_;
        cudaEvent_t start_;
        Clock::time_point issued_;
    };
    // `name` must outlive the profiler (a string literal).
    Scope scope(const char* name);
    // Host time of work issued outside every op (the model's allocations between ops), reported as a row
    // `name` with no device time; nothing when disabled or inside an op (whose row already counts it).
    class HostScope {
    public:
        HostScope(OpProfiler* p, const char* name)
            : p_(p), name_(name), start_(p ? std::chrono::steady_clock::now() : Clock::time_point{}) {}
        HostScope(const HostScope&) = delete;
        HostScope& operator=(const HostScope&) = delete;
        ~HostScope() {
            if (p_) p_->host_only(name_, std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
        }

    private:
        using Clock = std::chrono::steady_clock;
        OpProfiler* p_;
        const char* name_;
        Clock::time_point start_;
    };
    // `name` must outlive the profiler (a string literal).
    HostScope host_scope(const char* name) { return HostScope(enabled_ && depth_ == 0 ? this : nullptr, name); }

    // Reads the events of ops that have ended (call after the stream has drained).
    void collect();
    // A table of the time per op name since the last call (then cleared); empty when disabled.
    std::string take_report();

private:
    struct Pending {
        const char* name;
        cudaEvent_t start, stop;
        double host_ms;
    };
    struct Total {
        double ms = 0, host_ms = 0;
        long calls = 0;
    };
    void end(const char* name, cudaEvent_t start, double host_ms);
    void host_only(const char* name, double host_ms);
    cudaEvent_t event();  // needs mu_

    inline static thread_local int depth_ = 0;  // this thread's open scopes
    cudaStream_t stream_;
    bool enabled_ = false;
    std::mutex mu_;  // ops may be issued from more than one host thread
    std::vector<Pending> pending_;  // ended ops whose times are not read yet
    std::vector<cudaEvent_t> free_;
    std::map<std::string, Total> totals_;
};

}  // namespace deepinfer::cuda
