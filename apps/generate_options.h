// apps/generate_options.h: the command line of twinstep-generate, parsed outside main() so that
// its flags are unit-tested (generate_options_test.cc), as twinstep-serve's are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/result.h"

namespace twinstep::apps {

struct GenerateOptions {
  std::string model;
  std::vector<std::vector<int32_t>> prompts;
  int32_t max_tokens = -1;
  std::string device;  // "cuda" where the build has it, else "sim", unless --device says
  bool random_weights = false;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool eager = false;            // cuda: no decode CUDA graphs
  bool batch_invariant = false;  // EngineConfig::batch_invariant, and the CUDA device's mode
  // --tensor-parallel N (issue 17, cuda only): the model split over N ranks
  // (kernels/tp_device.h), NCCL on N GPUs, or --tp-transport loopback: N ranks on one GPU (a
  // check of the split forward, not a speed-up). Decode runs eagerly then (no graphs).
  int32_t tensor_parallel = 1;
  std::string tp_transport = "nccl";
  engine::SamplingParams sampling;
  int32_t page_size = 16;
  int32_t max_step_tokens = 2048;
  // Text (text/): prompts as text and output as text.
  std::string tokenizer;                  // --tokenizer DIR|tokenizer.json
  std::vector<std::string> text_prompts;  // --prompt TEXT, repeatable
  bool chat = false;                      // --chat: each prompt is a user turn
  std::optional<std::string> system;      // --system TEXT, with --chat
  bool help = false;                      // --help / -h: print kGenerateUsage, nothing else
};

extern const char* const kGenerateUsage;

// `args` without the program name; `with_cuda`: the build has the CUDA device. A usage error
// is the message (what was wrong, what was expected); the caller prints it with the usage.
Result<GenerateOptions, std::string> parse_generate_args(const std::vector<std::string>& args,
                                                         bool with_cuda);

}  // namespace twinstep::apps
