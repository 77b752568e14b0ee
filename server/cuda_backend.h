// --device cuda for twinstep-serve: the CUDA Device (kernels/cuda_device.h) over a checkpoint
// directory, or over seeded random weights of its config's geometry. Compiled only when the
// build has the CUDA device (TWINSTEP_SERVE_CUDA); serve_options.cc says so otherwise.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/result.h"

namespace twinstep::server {

struct CudaBackend {
  engine::ModelConfig model;  // with generation_config.json's eos ids merged in
  std::unique_ptr<engine::Device> device;
  std::string summary;  // one line on the graphs and pools, for the start banner
};

struct CudaBackendOptions {
  bool random_weights = false;  // read only DIR/config.json; weights from a fixed seed
  bool decode_graphs = true;    // capture decode CUDA graphs before the pools are sized
  // Size the pools from this fraction of the free GPU memory (sets engine.pages_global and
  // engine.pages_local); nullopt: keep engine's.
  std::optional<double> gpu_memory_fraction;
  // The model split over this many ranks (kernels/tp_device.h; decode graphs off then): NCCL,
  // rank r on GPU r, or with tp_loopback every rank on GPU 0. The pools are sized from the
  // tightest rank's free memory (a GPU's share under loopback) and a rank's page bytes.
  int32_t tensor_parallel = 1;
  bool tp_loopback = false;
};

// The device for `engine` (its page size, step and running limits size the graphs and their
// stage; with gpu_memory_fraction its pool sizes are set here, from the memory left after the
// weights, the activations and the graphs).
Result<CudaBackend, std::string> make_cuda_backend(const std::string& model_dir,
                                                   const CudaBackendOptions& options,
                                                   engine::EngineConfig& engine);

}  // namespace twinstep::server
