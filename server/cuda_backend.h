// --device cuda for twinstep-serve: the CUDA Device (kernels/cuda_device.h) over a checkpoint
// directory, or over seeded random weights of its config's geometry. Compiled only when the
// build has the CUDA device (TWINSTEP_SERVE_CUDA); serve_options.cc says so otherwise.
#pragma once

#include <memory>
#include <string>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/result.h"

namespace twinstep::server {

struct CudaBackend {
  engine::ModelConfig model;  // with generation_config.json's eos ids merged in
  std::unique_ptr<engine::Device> device;
};

// `random_weights`: read only DIR/config.json and fill the weights from a fixed seed.
Result<CudaBackend, std::string> make_cuda_backend(const std::string& model_dir,
                                                   bool random_weights);

}  // namespace twinstep::server
