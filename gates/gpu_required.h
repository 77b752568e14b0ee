// The one rule every gate fixture shares: no usable GPU is a failure, never a skip.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace twinstep::gates {

// Use as ASSERT_NO_FATAL_FAILURE(require_gpu()) at the top of a fixture's SetUp.
inline void require_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  ASSERT_EQ(err, cudaSuccess) << "no usable CUDA device: " << cudaGetErrorString(err)
                              << " (a gpu gate fails without a GPU; it never skips)";
  ASSERT_GT(count, 0) << "no CUDA device (a gpu gate fails without a GPU)";
}

}  // namespace twinstep::gates
