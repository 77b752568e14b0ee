// apps/twinstep_generate.cc: twinstep-generate, greedy (or sampled) generation of token ids
// through the real scheduler on the CUDA device or the simulated one. All prompts are
// submitted at once and batched by the scheduler; one output line per prompt, in order.
//
//   twinstep-generate --model DIR|PRESET --prompt-ids 2,17,99[;5,6,7...] --max-tokens N
//                     [--device cuda|sim] [--random-weights] [--seed S] [--ignore-eos]
//                     [--eager] [--batch-invariant]
//                     [--temperature T --top-k K --top-p P --sample-seed S]
//                     [--page-size P] [--max-step-tokens N]
//   twinstep-generate --model ... --tokenizer DIR|tokenizer.json --prompt TEXT [--prompt ...]
//                     [--chat [--system TEXT]] --max-tokens N ...
// With --tokenizer the output is text (text/: HF tokenizer.json, Gemma chat template).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "sim/sim_device.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#if defined(TWINSTEP_WITH_CUDA)
#include "kernels/cuda_device.h"
#endif

namespace {

using namespace twinstep;

const char* kUsage =
    "usage: twinstep-generate --model DIR|PRESET --prompt-ids 2,17,99[;5,6,...] --max-tokens N\n"
    "                         [--device cuda|sim] [--random-weights] [--seed S] [--ignore-eos]\n"
    "                         [--eager] [--batch-invariant]\n"
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

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "twinstep-generate: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

struct Options {
  std::string model;
  std::vector<std::vector<int32_t>> prompts;
  int32_t max_tokens = -1;
#if defined(TWINSTEP_WITH_CUDA)
  std::string device = "cuda";
#else
  std::string device = "sim";
#endif
  bool random_weights = false;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool eager = false;            // cuda: no decode CUDA graphs
  bool batch_invariant = false;  // EngineConfig::batch_invariant, and the CUDA device's mode
  engine::SamplingParams sampling;
  int32_t page_size = 16;
  int32_t max_step_tokens = 2048;
  // Text (text/): prompts as text and output as text.
  std::string tokenizer;                  // --tokenizer DIR|tokenizer.json
  std::vector<std::string> text_prompts;  // --prompt TEXT, repeatable
  bool chat = false;                      // --chat: each prompt is a user turn
  std::optional<std::string> system;      // --system TEXT, with --chat
};

int64_t parse_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) {
    usage_error(flag + " expects an integer, got '" + text + "'");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') usage_error(flag + " expects a number, got '" + text + "'");
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
      if (v < 0 || v > INT32_MAX) usage_error("--prompt-ids: id " + id + " out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) usage_error("--prompt-ids: empty prompt in '" + text + "'");
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) usage_error("--prompt-ids: no prompt");
  return prompts;
}

// The text options against each other and the id prompts.
void check_text_options(const Options& o) {
  if (!o.prompts.empty() && !o.text_prompts.empty()) {
    usage_error("--prompt and --prompt-ids are exclusive");
  }
  if (o.prompts.empty() && o.text_prompts.empty())
    usage_error("--prompt-ids or --prompt is required");
  if (!o.text_prompts.empty() && o.tokenizer.empty()) usage_error("--prompt needs --tokenizer");
  if (o.chat && o.text_prompts.empty()) usage_error("--chat needs --prompt");
  if (o.system && !o.chat) usage_error("--system needs --chat");
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
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
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (o.model.empty()) usage_error("--model is required");
  check_text_options(o);
  if (o.max_tokens <= 0) usage_error("--max-tokens must be a positive integer");
  if (o.device != "cuda" && o.device != "sim") {
    usage_error("--device must be 'cuda' or 'sim', got '" + o.device + "'");
  }
  if (o.page_size <= 0) usage_error("--page-size must be positive");
#if !defined(TWINSTEP_WITH_CUDA)
  if (o.device == "cuda") usage_error("this build has no CUDA: use --device sim");
#endif
  return o;
}

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

[[noreturn]] void text_error(const std::string& message) {
  std::fprintf(stderr, "twinstep-generate: %s\n", message.c_str());
  std::exit(1);
}

// Text in: the tokenizer (and, with --chat, the chat template) of --tokenizer.
struct TextSide {
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat;
  std::vector<int32_t> stop_ids;  // the end-of-turn token with --chat
};

TextSide load_text(const Options& o) {
  TextSide side;
  if (o.tokenizer.empty()) return side;
  auto files = text::find_tokenizer_files(o.tokenizer);
  if (!files) text_error("--tokenizer: " + files.error().message);
  auto t = text::Tokenizer::from_file(files->tokenizer_json);
  if (!t) text_error("--tokenizer: " + t.error().message);
  side.tokenizer.emplace(std::move(t.value()));
  if (!o.chat) return side;
  if (files->tokenizer_config_json.empty()) {
    text_error("--chat: no tokenizer_config.json beside " + files->tokenizer_json.string());
  }
  auto c = text::ChatTemplate::from_config_file(files->tokenizer_config_json);
  if (!c)
    text_error(std::string("--chat: ") + text::chat_error_name(c.error().code) + ": " +
               c.error().message);
  side.chat.emplace(std::move(c.value()));
  for (const std::string& s : side.chat->end_of_turn()) {
    if (const auto id = side.tokenizer->token_to_id(s)) side.stop_ids.push_back(*id);
  }
  return side;
}

// --prompt TEXT as ids: encoded with the post-processor (<bos>), or, with --chat, rendered as
// a user turn (after --system) with the generation prompt and encoded as it is.
std::vector<std::vector<int32_t>> text_prompt_ids(const Options& o, const TextSide& side) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : o.text_prompts) {
    if (!side.chat) {
      prompts.push_back(side.tokenizer->encode(p, /*add_special_tokens=*/true));
    } else {
      nlohmann::json messages = nlohmann::json::array();
      if (o.system) messages.push_back({{"role", "system"}, {"content", *o.system}});
      messages.push_back({{"role", "user"}, {"content", p}});
      auto rendered = side.chat->render(messages, /*add_generation_prompt=*/true);
      if (!rendered)
        text_error(std::string("--chat: ") + text::chat_error_name(rendered.error().code) + ": " +
                   rendered.error().message);
      prompts.push_back(side.tokenizer->encode(*rendered, /*add_special_tokens=*/false));
    }
    if (prompts.back().empty()) usage_error("--prompt '" + p + "' encodes to no tokens");
  }
  return prompts;
}

// Text out: a detokenizer per prompt, special tokens (the stop token) left out. One prompt
// streams its text as the steps produce it.
class TextOutput {
 public:
  TextOutput(const TextSide& side, const std::vector<engine::RequestId>& ids)
      : stream_(side.tokenizer && ids.size() == 1) {
    if (!side.tokenizer) return;
    for (engine::RequestId id : ids) {
      detokenizers_.emplace(id, text::Detokenizer(*side.tokenizer, {.skip_special_tokens = true}));
    }
  }
  bool active() const { return !detokenizers_.empty(); }
  void on_tokens(engine::RequestId id, std::span<const int32_t> tokens) {
    const auto d = detokenizers_.find(id);
    if (d == detokenizers_.end()) return;
    for (const int32_t token : tokens) d->second.push_into(token, texts_[id]);
    if (stream_) write(std::exchange(texts_[id], {}));
  }
  // The rest of the prompt's text, then a newline.
  void print(engine::RequestId id) { write(texts_[id] + detokenizers_.at(id).finish() + "\n"); }

 private:
  static void write(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  }
  bool stream_;
  std::map<engine::RequestId, text::Detokenizer> detokenizers_;
  std::map<engine::RequestId, std::string> texts_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  const TextSide text_side = load_text(o);
  if (!o.text_prompts.empty()) o.prompts = text_prompt_ids(o, text_side);
  // The model: a checkpoint directory (config + shards), or its config alone / a preset with
  // --random-weights.
  std::unique_ptr<engine::ModelWeights> weights;
  engine::ModelConfig config;
  if (std::filesystem::is_directory(o.model)) {
    if (o.random_weights || o.device == "sim") {
      auto c = engine::ModelConfig::from_file(std::filesystem::path(o.model) / "config.json");
      if (!c) {
        std::fprintf(stderr, "twinstep-generate: %s/config.json: %s\n", o.model.c_str(),
                     c.error().message.c_str());
        return 1;
      }
      config = c.value();
    } else {
      auto w = engine::ModelWeights::load(o.model);
      if (!w) {
        std::fprintf(stderr, "twinstep-generate: %s\n", w.error().message.c_str());
        return 1;
      }
      weights = std::move(w.value());
      config = weights->config();
    }
  } else {
    auto c = engine::ModelConfig::preset(o.model);
    if (!c) {
      std::fprintf(stderr,
                   "twinstep-generate: --model '%s' is neither a directory nor a preset: %s\n",
                   o.model.c_str(), c.error().message.c_str());
      return 1;
    }
    if (o.device == "cuda" && !o.random_weights) {
      usage_error("preset '" + o.model + "' has no weights: add --random-weights");
    }
    config = c.value();
  }

  // Pools sized so that every prompt fits at once: the global family holds whole contexts; the
  // local family holds as much (the scheduler releases pages behind the window as it goes).
  engine::EngineConfig ec;
  ec.page_size = o.page_size;
  int64_t pages = 0;
  for (const auto& p : o.prompts)
    pages += ceil_div(static_cast<int64_t>(p.size()) + o.max_tokens, o.page_size);
  ec.pages_global = static_cast<int32_t>(pages + 1);
  ec.pages_local = static_cast<int32_t>(pages + 1);
  ec.max_running = static_cast<int32_t>(o.prompts.size());
  ec.max_step_tokens = o.max_step_tokens;
  ec.batch_invariant = o.batch_invariant;

  std::unique_ptr<engine::Device> device;
  if (o.device == "sim") {
    device = std::make_unique<sim::SimDevice>(config);
  } else {
#if defined(TWINSTEP_WITH_CUDA)
    kernels::CudaDeviceOptions dopt;
    dopt.random_seed = o.seed;
    dopt.batch_invariant = ec.batch_invariant;
    auto d = kernels::CudaDevice::create(config, weights.get(), dopt);
    if (!d) {
      std::fprintf(stderr, "twinstep-generate: cuda device: %s\n", d.error().message.c_str());
      return 1;
    }
    if (!o.eager) {
      // Decode steps replay a CUDA graph per batch bucket (kernels/decode_graphs.h).
      kernels::DecodeGraphConfig g;
      g.max_step_rows = ec.max_step_tokens;
      g.max_logits = ec.max_running;
      int64_t longest = 1;
      for (const auto& p : o.prompts) {
        longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()) + o.max_tokens);
      }
      g.max_context = static_cast<int32_t>(std::min<int64_t>(longest, INT32_MAX));
      g.page_size = ec.page_size;
      if (auto s = d.value()->enable_decode_graphs(g); !s.ok()) {
        std::fprintf(stderr, "twinstep-generate: decode graphs: %s\n", s.error().message.c_str());
        return 1;
      }
    }
    device = std::move(d.value());
#else
    usage_error("this build has no CUDA: use --device sim");
#endif
  }
  auto engine = engine::Engine::create(config, ec, *device);
  if (!engine) {
    std::fprintf(stderr, "twinstep-generate: engine: %s\n", engine.error().message.c_str());
    return 1;
  }
  std::vector<engine::RequestId> ids;
  for (const auto& p : o.prompts) {
    engine::Request r;
    r.prompt = p;
    r.max_tokens = o.max_tokens;
    r.sampling = o.sampling;
    if (!o.ignore_eos) r.stop_ids = config.eos_token_ids;
    r.stop_ids.insert(r.stop_ids.end(), text_side.stop_ids.begin(), text_side.stop_ids.end());
    ids.push_back(engine.value()->submit(std::move(r)).id());
  }
  TextOutput text_out(text_side, ids);
  std::map<engine::RequestId, std::vector<int32_t>> out;
  std::map<engine::RequestId, engine::Terminal> terminal;
  int failed_steps = 0;
  while (!engine.value()->idle()) {
    const engine::StepOutputs step = engine.value()->step();
    if (step.failed) {
      std::fprintf(stderr, "twinstep-generate: step %llu failed: %s\n",
                   static_cast<unsigned long long>(step.step_index), step.error.c_str());
      if (++failed_steps > 8) return 1;
    }
    for (const engine::RequestUpdate& u : step.updates) {
      auto& tokens = out[u.id];
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.terminal) terminal[u.id] = *u.terminal;
      text_out.on_tokens(u.id, u.new_tokens);
    }
  }
  int rc = 0;
  for (engine::RequestId id : ids) {
    const auto it = terminal.find(id);
    if (it != terminal.end() && (it->second.kind == engine::TerminalKind::kRejected ||
                                 it->second.kind == engine::TerminalKind::kFailed)) {
      std::fprintf(stderr, "twinstep-generate: prompt %llu: %s: %s\n",
                   static_cast<unsigned long long>(id.value),
                   engine::terminal_kind_name(it->second.kind), it->second.message.c_str());
      rc = 1;
    }
    if (text_out.active()) {
      text_out.print(id);
      continue;
    }
    const auto& tokens = out[id];
    std::string line;
    for (size_t i = 0; i < tokens.size(); ++i) line += (i ? "," : "") + std::to_string(tokens[i]);
    std::printf("%s\n", line.c_str());
  }
  return rc;
}
