// apps/generate_options.cc: twinstep-generate's flags (generate_options.h). A usage error is
// thrown as UsageError inside this file only and returned by parse_generate_args.
#include "apps/generate_options.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>

namespace twinstep::apps {
namespace {

struct UsageError {
  std::string message;
};

[[noreturn]] void fail(const std::string& message) { throw UsageError{message}; }

int64_t parse_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) {
    fail(flag + " expects an integer, got '" + text + "'");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') fail(flag + " expects a number, got '" + text + "'");
  return v;
}

std::vector<std::vector<int32_t>> parse_prompts(const std::string& text) {
  std::vector<std::vector<int32_t>> prompts;
  std::stringstream all(text);
  std::string one;
  while (std::getline(all, one, ';')) {
    std::vector<int32_t> ids;
    std::stringstream ss(one);
    std::string id;
    while (std::getline(ss, id, ',')) {
      const int64_t v = parse_int("--prompt-ids", id);
      if (v < 0 || v > INT32_MAX) fail("--prompt-ids: id " + id + " out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) fail("--prompt-ids: empty prompt in '" + text + "'");
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) fail("--prompt-ids: no prompt");
  return prompts;
}

// The text options against each other and the id prompts.
void check_text_options(const GenerateOptions& o) {
  if (!o.prompts.empty() && !o.text_prompts.empty()) {
    fail("--prompt and --prompt-ids are exclusive");
  }
  if (o.prompts.empty() && o.text_prompts.empty()) fail("--prompt-ids or --prompt is required");
  if (!o.text_prompts.empty() && o.tokenizer.empty()) fail("--prompt needs --tokenizer");
  if (o.chat && o.text_prompts.empty()) fail("--chat needs --prompt");
  if (o.system && !o.chat) fail("--system needs --chat");
}

GenerateOptions parse_or_throw(const std::vector<std::string>& args, bool with_cuda) {
  GenerateOptions o;
  o.device = with_cuda ? "cuda" : "sim";
  const size_t n = args.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= n) fail(a + " needs a value");
      return args[++i];
    };
    if (a == "--model")
      o.model = value();
    else if (a == "--prompt-ids")
      o.prompts = parse_prompts(value());
    else if (a == "--max-tokens")
      o.max_tokens = static_cast<int32_t>(parse_int(a, value()));
    else if (a == "--device")
      o.device = value();
    else if (a == "--random-weights")
      o.random_weights = true;
    else if (a == "--seed")
      o.seed = static_cast<uint64_t>(parse_int(a, value()));
    else if (a == "--ignore-eos")
      o.ignore_eos = true;
    else if (a == "--eager")
      o.eager = true;
    else if (a == "--batch-invariant")
      o.batch_invariant = true;
    else if (a == "--tensor-parallel")
      o.tensor_parallel = static_cast<int32_t>(parse_int(a, value()));
    else if (a == "--tp-transport")
      o.tp_transport = value();
    else if (a == "--temperature")
      o.sampling.temperature = static_cast<float>(parse_double(a, value()));
    else if (a == "--top-k")
      o.sampling.top_k = static_cast<int32_t>(parse_int(a, value()));
    else if (a == "--top-p")
      o.sampling.top_p = static_cast<float>(parse_double(a, value()));
    else if (a == "--sample-seed")
      o.sampling.seed = static_cast<uint64_t>(parse_int(a, value()));
    else if (a == "--page-size")
      o.page_size = static_cast<int32_t>(parse_int(a, value()));
    else if (a == "--max-step-tokens")
      o.max_step_tokens = static_cast<int32_t>(parse_int(a, value()));
    else if (a == "--tokenizer")
      o.tokenizer = value();
    else if (a == "--prompt")
      o.text_prompts.push_back(value());
    else if (a == "--chat")
      o.chat = true;
    else if (a == "--system")
      o.system = value();
    else if (a == "--help" || a == "-h") {
      o.help = true;
      return o;
    } else {
      fail("unknown argument '" + a + "'");
    }
  }
  if (o.model.empty()) fail("--model is required");
  check_text_options(o);
  if (o.max_tokens <= 0) fail("--max-tokens must be a positive integer");
  if (o.device != "cuda" && o.device != "sim") {
    fail("--device must be 'cuda' or 'sim', got '" + o.device + "'");
  }
  if (o.page_size <= 0) fail("--page-size must be positive");
  if (!with_cuda && o.device == "cuda") fail("this build has no CUDA: use --device sim");
  if (o.tensor_parallel < 1 || o.tensor_parallel > 16) {
    fail("--tensor-parallel must be in [1, 16], got " + std::to_string(o.tensor_parallel));
  }
  if (o.tp_transport != "nccl" && o.tp_transport != "loopback") {
    fail("--tp-transport must be 'nccl' or 'loopback', got '" + o.tp_transport + "'");
  }
  if (o.tensor_parallel > 1 && o.device != "cuda") fail("--tensor-parallel needs --device cuda");
  if (o.tensor_parallel > 1 && o.batch_invariant) {
    fail(
        "--tensor-parallel and --batch-invariant do not go together (the collectives' sums "
        "are the transport's, not a row's own)");
  }
  return o;
}

}  // namespace

const char* const kGenerateUsage =
    "usage: twinstep-generate --model DIR|PRESET --prompt-ids 2,17,99[;5,6,...] --max-tokens N\n"
    "                         [--device cuda|sim] [--random-weights] [--seed S] [--ignore-eos]\n"
    "                         [--eager] [--batch-invariant]\n"
    "                         [--tensor-parallel N [--tp-transport nccl|loopback]]\n"
    "                         [--temperature T] [--top-k K] [--top-p P] [--sample-seed S]\n"
    "                         [--page-size P] [--max-step-tokens N]\n"
    "       twinstep-generate --model ... --tokenizer DIR|tokenizer.json --prompt TEXT\n"
    "                         [--prompt TEXT ...] [--chat [--system TEXT]] --max-tokens N ...\n"
    "DIR holds config.json (+ generation_config.json, *.safetensors unless --random-weights);\n"
    "PRESET is a built-in geometry (gemma4-12b, sim-tiny), which needs --random-weights on cuda.\n"
    "On cuda, decode steps replay CUDA graphs; --eager runs every step without them.\n"
    "--batch-invariant: a prompt's logits do not depend on the other prompts sharing its steps\n"
    "or on --max-step-tokens (cuda: at some throughput; sim: always so).\n"
    "Prints the generated ids of each prompt, comma-separated, one line per prompt; with\n"
    "--tokenizer, the generated text of each prompt instead (special tokens left out),\n"
    "followed by a newline, streamed when there is one prompt. --prompt TEXT is encoded with\n"
    "the tokenizer's post-processor (Gemma: <bos> first); --chat makes each prompt a user\n"
    "turn (after --system TEXT) in the chat template of the tokenizer_config.json beside\n"
    "tokenizer.json, with the generation prompt, and stops at the end-of-turn token.\n";

Result<GenerateOptions, std::string> parse_generate_args(const std::vector<std::string>& args,
                                                         bool with_cuda) {
  try {
    return parse_or_throw(args, with_cuda);
  } catch (const UsageError& e) {
    return unexpected(e.message);
  }
}

}  // namespace twinstep::apps
