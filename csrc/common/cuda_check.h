// CUDA error -> exception, shared by the launchers.
#pragma once
#include <cuda_runtime.h>
#include <stdexcept>
#include <string>

namespace gproj {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace gproj
