// Lanes: where the backend issues matrix products. The backend's own stream is one; an op whose parts are
// independent (grouped_experts' experts) forks side lanes from it with an event and joins them back with one
// event each, so that the parts run concurrently while the op stays stream-ordered (no host synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "backend/cuda/gemm_fp8.h"
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

// A stream and the cuBLAS handles bound to it. cuBLAS handles and their workspaces must not be shared by streams
// that run concurrently (nor would cuBLAS then promise the same algorithms, and so the same bits), so each lane
// has its own; every handle has the same workspace size, so a product's algorithm does not depend on the lane.
struct Lane {
    int device = 0;
    cudaStream_t stream = nullptr;
    std::unique_ptr<CublasGemm> cublas;  // created on first use: decode-only backends never need a handle
    std::unique_ptr<Fp8Gemm> fp8;        // likewise (FP8 activations only)

    CublasGemm& gemm();
    Fp8Gemm& fp8_gemm();
    // Destroys the handles (each waits for the stream first): before the stream goes.
    void release_handles();
};

// A fixed set of side lanes on fresh non-blocking streams, with the events that fork and join them.
class SideLanes {
public:
    SideLanes(int device, int count);
    ~SideLanes();
    SideLanes(const SideLanes&) = delete;
    SideLanes& operator=(const SideLanes&) = delete;

    int size() const { return static_cast<int>(lanes_.size()); }
    Lane& operator[](int i) { return lanes_[i]; }

    // Lanes 0 .. used - 1 start after the work queued on `origin` so far; join() makes `origin` wait for all they
    // were given since. A fork not joined joins on destruction (unchecked: a destructor must not throw), so that
    // memory freed on `origin` afterwards is never still in use on a lane, even when issuing the work threw.
    class Fork {
    public:
        Fork(SideLanes& lanes, cudaStream_t origin, int used);
        ~Fork();
        Fork(const Fork&) = delete;
        Fork& operator=(const Fork&) = delete;
        void join();

    private:
        SideLanes& lanes_;
        cudaStream_t origin_;
        int used_;
        bool joined_ = false;
    };

private:
    void release();

    std::vector<Lane> lanes_;
    std::vector<cudaEvent_t> joins_;  // one per lane, recorded on it at the join
    cudaEvent_t fork_ = nullptr;      // recorded on the origin at the fork
};

}  // namespace deepinfer::cuda
