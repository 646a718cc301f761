#include "backend/cuda/lanes.h"

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

CublasGemm& Lane::gemm() {
    if (!cublas) {
        DI_CUDA_CHECK(cudaSetDevice(device));
        cublas = std::make_unique<CublasGemm>(stream);
    }
    return *cublas;
}

Fp8Gemm& Lane::fp8_gemm() {
    if (!fp8) {
        DI_CUDA_CHECK(cudaSetDevice(device));
        fp8 = std::make_unique<Fp8Gemm>(stream);
    }
    return *fp8;
}

void Lane::release_handles() {
    cublas.reset();
    fp8.reset();
}

SideLanes::SideLanes(int device, int count) {
    try {
        DI_CUDA_CHECK(cudaSetDevice(device));
        DI_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        for (int i = 0; i < count; ++i) {
            lanes_.push_back(Lane{device});
            DI_CUDA_CHECK(cudaStreamCreateWithFlags(&lanes_.back().stream, cudaStreamNonBlocking));
            joins_.push_back(nullptr);
            DI_CUDA_CHECK(cudaEventCreateWithFlags(&joins_.back(), cudaEventDisableTiming));
        }
    } catch (...) {  // the destructor does not run for a throwing constructor
        release();
        throw;
    }
}

SideLanes::~SideLanes() { release(); }

void SideLanes::release() {
    for (Lane& lane : lanes_) {
        lane.release_handles();
        if (lane.stream) cudaStreamDestroy(lane.stream);
    }
    for (cudaEvent_t e : joins_)
        if (e) cudaEventDestroy(e);
    if (fork_) cudaEventDestroy(fork_);
}

SideLanes::Fork::Fork(SideLanes& lanes, cudaStream_t origin, int used) : lanes_(lanes), origin_(origin), used_(used) {
    DI_ICHECK(used >= 0 && used <= lanes.size(), "fork of ", used, " lanes of ", lanes.size());
    DI_CUDA_CHECK(cudaEventRecord(lanes.fork_, origin));
    for (int i = 0; i < used; ++i) DI_CUDA_CHECK(cudaStreamWaitEvent(lanes.lanes_[i].stream, lanes.fork_, 0));
}

void SideLanes::Fork::join() {
    for (int i = 0; i < used_; ++i) {
        DI_CUDA_CHECK(cudaEventRecord(lanes_.joins_[i], lanes_.lanes_[i].stream));
        DI_CUDA_CHECK(cudaStreamWaitEvent(origin_, lanes_.joins_[i], 0));
    }
    joined_ = true;
}

SideLanes::Fork::~Fork() {
    if (joined_) return;
    for (int i = 0; i < used_; ++i) {
        cudaEventRecord(lanes_.joins_[i], lanes_.lanes_[i].stream);
        cudaStreamWaitEvent(origin_, lanes_.joins_[i], 0);
    }
}

}  // namespace deepinfer::cuda
