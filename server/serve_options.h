// Command line of twinstep-serve, and building the model, device and engine it names. Kept out
// of main() so that flag errors and device selection are unit-tested.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/result.h"
#include "server/http_server.h"
#include "server/text_model.h"

namespace twinstep::server {

struct ServeConfig {
  std::string device = "sim";  // sim | cuda
  std::optional<std::string> model_dir;
  bool random_weights = false;           // cuda: weights from a seed instead of the checkpoint
  std::optional<std::string> tokenizer;  // tokenizer.json or a folder with it (and its config)
  bool cuda_graphs = true;               // cuda: decode steps replay CUDA graphs
  // cuda: size both KV pools from this fraction of the GPU memory left free once the weights,
  // activations and graphs are in (instead of --pages-global/--pages-local).
  std::optional<double> gpu_memory_fraction;
  // cuda: the model split over N ranks (issue 17, kernels/tp_device.h): NCCL, rank r on GPU r,
  // or the loopback transport (every rank on GPU 0: a check of the split, not a speed-up).
  // Decode runs eagerly then (no graphs).
  int32_t tensor_parallel = 1;
  std::string tp_transport = "nccl";
  ServerOptions server;
  engine::EngineConfig engine;
  bool help = false;
};

std::string serve_usage();
// Every flag takes a value except --help, --random-weights, --no-prefix-cache and
// --batch-invariant. Unknown flags and bad values are errors that name the flag and what was
// expected.
Result<ServeConfig, std::string> parse_serve_args(const std::vector<std::string>& args);
// --max-connections when not given: 1024, or the descriptor limit (RLIMIT_NOFILE) less
// kReservedDescriptors when that is smaller, so that the cap, not an accept failing with
// EMFILE, is what a flood of connections meets first (and it gets a 503, not silence).
inline constexpr size_t kDefaultMaxConnections = 1024;
inline constexpr size_t kReservedDescriptors = 32;  // listener, stdio, /proc reads, the engine
size_t default_max_connections();

// Settings the environment may give: the API key from TWINSTEP_API_KEY (pass getenv's value,
// or nullptr), used when --api-key did not set one.
void apply_environment(ServeConfig& config, const char* api_key_env);
// What to print at start about an unsafe setting (a non-loopback address without an API
// key), or nullopt.
std::optional<std::string> start_warning(const ServeConfig& config);

// The model geometry, the device and the engine of a ServeConfig, owned together (the engine
// refers to the device).
struct Backend {
  engine::ModelConfig model;
  std::unique_ptr<engine::Device> device;
  std::unique_ptr<engine::Engine> engine;
  // Sampling for fields a request leaves out: --model DIR's generation_config.json over
  // OpenAI's defaults.
  engine::SamplingParams sampling_defaults = openai_sampling_defaults();
  // --tokenizer's tokenizer and chat template (null without it).
  std::shared_ptr<const TextModel> text;
  std::string device_summary;  // cuda: its decode graphs and pool sizes, printed at start
};
// `--device cuda` needs a build with the CUDA device; otherwise this says so.
Result<Backend, std::string> make_backend(const ServeConfig& config);
bool cuda_device_compiled();

}  // namespace twinstep::server
