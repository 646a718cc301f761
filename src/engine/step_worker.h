// Runs one job at a time on a dedicated thread (async scheduling: the model's step computes there while the
// engine thread prepares the next step and processes the previous outputs), or inline when not threaded.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace deepinfer::engine {

class StepWorker {
public:
    explicit StepWorker(bool threaded);
    ~StepWorker();
    StepWorker(const StepWorker&) = delete;
    StepWorker& operator=(const StepWorker&) = delete;

    // Starts fn (inline: runs it now). One job at a time: wait() before the next submit.
    void submit(std::function<void()> fn);
    // Blocks until the job is done; rethrows what it threw.
    void wait();
    bool threaded() const { return threaded_; }

private:
    void loop();

    bool threaded_;
    std::thread thread_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::function<void()> job_;
    bool has_job_ = false, done_ = true, stop_ = false;
    std::exception_ptr error_;
};

}  // namespace deepinfer::engine
