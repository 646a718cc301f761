// A fixed pool of worker threads for data-parallel loops. The calling thread takes part.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer {

class ThreadPool {
public:
    // num_threads <= 0: the number of hardware threads (or DEEPINFER_NUM_THREADS when set).
    explicit ThreadPool(int num_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

    // Calls fn(begin, end) on disjoint sub-ranges covering [0, n), each at least `grain` long
    // (except the last). Returns when all are done. Exceptions from fn are rethrown here.
    // Nested calls from inside fn run serially on the calling thread.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop();
    void run_chunks();

    std::vector<std::thread> workers_;
    std::mutex submit_mutex_;  // one job at a time when several threads share the pool
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0, job_chunk_ = 0, next_chunk_ = 0, num_chunks_ = 0, finished_chunks_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace deepinfer
