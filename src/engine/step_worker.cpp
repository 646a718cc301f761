#include "engine/step_worker.h"

#include "deepinfer/error.h"

namespace deepinfer::engine {

StepWorker::StepWorker(bool threaded) : threaded_(threaded) {
    if (threaded_) thread_ = std::thread([this] { loop(); });
}

StepWorker::~StepWorker() {
    if (!threaded_) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void StepWorker::submit(std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mutex_);
    DI_ICHECK(done_, "a step is already running");
    if (!threaded_) {
        lock.unlock();
        try {
            fn();
        } catch (...) {
            error_ = std::current_exception();
        }
        return;
    }
    job_ = std::move(fn);
    has_job_ = true;
    done_ = false;
    cv_.notify_all();
}

void StepWorker::wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

void StepWorker::loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        cv_.wait(lock, [this] { return has_job_ || stop_; });
        if (stop_) return;
        std::function<void()> job = std::move(job_);
        has_job_ = false;
        lock.unlock();
        std::exception_ptr error;
        try {
            job();
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        error_ = error;
        done_ = true;
        cv_.notify_all();
    }
}

}  // namespace deepinfer::engine
