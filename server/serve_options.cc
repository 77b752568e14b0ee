// Flag parsing and backend construction for twinstep-serve; see serve_options.h.
#include "server/serve_options.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include "sim/sim_device.h"

#if TWINSTEP_SERVE_CUDA
#include "server/cuda_backend.h"  // make_cuda_backend
#endif

namespace twinstep::server {
namespace {

template <class Int>
std::optional<std::string> parse_int(const std::string& flag, const std::string& text, Int lo,
                                     Int hi, Int& out) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < lo || value > hi) {
    return flag + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
           "], got '" + text + "'";
  }
  out = value;
  return std::nullopt;
}

// DIR/generation_config.json's sampling over OpenAI's defaults; no file: OpenAI's.
Result<engine::SamplingParams, std::string> read_generation_defaults(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir) / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return openai_sampling_defaults();
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) return unexpected("cannot read " + path.string());
  return generation_defaults(text, openai_sampling_defaults());
}

}  // namespace

std::string serve_usage() {
  return R"(usage: twinstep-serve [--device sim|cuda] [--model DIR] [--host 127.0.0.1] [--port 8000]

An OpenAI-compatible completions server: token ids in and out, or text with --tokenizer.
  --device sim|cuda        simulated device (default) or the CUDA engine (CUDA builds only)
  --model DIR              HF checkpoint dir (config.json); sim: also a preset (gemma4-12b,
                           sim-tiny); sim without it: preset sim-tiny
  --tokenizer PATH         tokenizer.json, or a folder with it and tokenizer_config.json (the
                           chat template): string prompts, stop strings, text output and
                           POST /v1/chat/completions
  --random-weights         cuda: seeded random weights of DIR/config.json's geometry
  --model-id NAME          the id /v1/models reports (default: twinstep-sim, or DIR's name)
  --host ADDR --port N     where to listen (port 0: an ephemeral port, printed at start)
  --io-threads N           network threads (default 1; the engine has its own thread)
  --max-body-bytes N       larger request bodies get 413 (default 1048576)
  --idle-timeout-s N       close a connection that sends no complete request for N s (60)
  --max-queued-bytes N     response bytes queued per connection before a stream pauses (1 MiB)
  --write-timeout-s N      close (and abort) a connection whose client reads nothing for N s (30)
  --max-connections N      open connections at most; one more gets 503 (1024, or fewer when
                           the descriptor limit, ulimit -n, leaves less: that minus 32)
  --shutdown-timeout-s N   on SIGTERM, close connections still open N s after the drain (5)
  --api-key KEY            require "Authorization: Bearer KEY" on every route but /health
                           (default: the environment variable TWINSTEP_API_KEY, if set)
  --page-size N --pages-global N --pages-local N --max-running N --max-step-tokens N
  --max-context N          engine limits (defaults: the engine's; context 0 = the model's)
  --no-prefix-cache        recompute every prompt (default: share the K/V pages of equal
                           prefixes; /metrics reports hits, cached pages and evictions)
  --batch-invariant        a request's logits do not depend on what shares its steps or on
                           how its prompt is chunked (cuda: costs throughput; sim: always so)
  --cuda-graphs on|off     cuda: replay decode steps as CUDA graphs, one per batch bucket,
                           captured before the pools are sized (default on)
  --gpu-memory-fraction F  cuda: size the KV pools from F (0 < F < 1) of the GPU memory free
                           after the weights, activations and graphs (not with --pages-*)
  --tensor-parallel N      cuda: split the model over N GPUs (1..16; NCCL, rank r on GPU r);
                           decode runs without graphs then
  --tp-transport nccl|loopback
                           cuda: loopback puts every rank on GPU 0 (checks the split forward
                           on one GPU; not a speed-up)
  --sim-step-us N          sleep N us after each step, to pace the simulated device
SIGINT/SIGTERM: stop accepting, abort in-flight requests, exit 0 once the pools are empty.
)";
}

Result<ServeConfig, std::string> parse_serve_args(const std::vector<std::string>& args) {
  ServeConfig config;
  bool model_id_given = false;
  std::map<std::string, std::function<std::optional<std::string>(const std::string&)>> flags;
  auto int32_flag = [&](const char* name, int32_t lo, int32_t& out) {
    flags[name] = [name, lo, &out](const std::string& v) {
      return parse_int<int32_t>(name, v, lo, INT32_MAX, out);
    };
  };
  flags["--device"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v != "sim" && v != "cuda") return "--device: expected sim or cuda, got '" + v + "'";
    config.device = v;
    return std::nullopt;
  };
  flags["--model"] = [&](const std::string& v) -> std::optional<std::string> {
    config.model_dir = v;
    return std::nullopt;
  };
  flags["--tokenizer"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v.empty()) return "--tokenizer: expected a path (tokenizer.json or its folder)";
    config.tokenizer = v;
    return std::nullopt;
  };
  flags["--model-id"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v.empty()) return "--model-id: expected a non-empty name";
    config.server.model_id = v;
    model_id_given = true;
    return std::nullopt;
  };
  flags["--host"] = [&](const std::string& v) -> std::optional<std::string> {
    config.server.host = v;
    return std::nullopt;
  };
  flags["--port"] = [&](const std::string& v) {
    return parse_int<uint16_t>("--port", v, 0, 65535, config.server.port);
  };
  flags["--io-threads"] = [&](const std::string& v) {
    return parse_int<int>("--io-threads", v, 1, 64, config.server.io_threads);
  };
  flags["--max-body-bytes"] = [&](const std::string& v) {
    return parse_int<size_t>("--max-body-bytes", v, 64, size_t{1} << 30,
                             config.server.max_body_bytes);
  };
  flags["--idle-timeout-s"] = [&](const std::string& v) -> std::optional<std::string> {
    int64_t seconds = 0;
    if (auto e = parse_int<int64_t>("--idle-timeout-s", v, 1, 86'400, seconds)) return e;
    config.server.idle_timeout = std::chrono::seconds(seconds);
    return std::nullopt;
  };
  auto seconds_flag = [&](const char* name, int64_t lo, std::chrono::milliseconds& out) {
    flags[name] = [name, lo, &out](const std::string& v) -> std::optional<std::string> {
      int64_t seconds = 0;
      if (auto e = parse_int<int64_t>(name, v, lo, 86'400, seconds)) return e;
      out = std::chrono::seconds(seconds);
      return std::nullopt;
    };
  };
  seconds_flag("--write-timeout-s", 1, config.server.write_timeout);
  seconds_flag("--shutdown-timeout-s", 0, config.server.shutdown_timeout);
  flags["--max-queued-bytes"] = [&](const std::string& v) {
    return parse_int<size_t>("--max-queued-bytes", v, 4096, size_t{1} << 30,
                             config.server.max_queued_bytes);
  };
  bool max_connections_given = false;
  flags["--max-connections"] = [&](const std::string& v) {
    max_connections_given = true;
    return parse_int<size_t>("--max-connections", v, 1, 1'000'000, config.server.max_connections);
  };
  flags["--api-key"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v.empty()) return "--api-key: expected a non-empty key";
    config.server.api_key = v;
    return std::nullopt;
  };
  flags["--sim-step-us"] = [&](const std::string& v) {
    return parse_int<int64_t>("--sim-step-us", v, 0, 10'000'000, config.server.loop.step_sleep_us);
  };
  flags["--cuda-graphs"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v != "on" && v != "off") return "--cuda-graphs: expected on or off, got '" + v + "'";
    config.cuda_graphs = v == "on";
    return std::nullopt;
  };
  flags["--gpu-memory-fraction"] = [&](const std::string& v) -> std::optional<std::string> {
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno != 0 || !(f > 0.0 && f < 1.0)) {
      return "--gpu-memory-fraction: expected a number in (0, 1), got '" + v + "'";
    }
    config.gpu_memory_fraction = f;
    return std::nullopt;
  };
  flags["--tensor-parallel"] = [&](const std::string& v) {
    return parse_int<int32_t>("--tensor-parallel", v, 1, 16, config.tensor_parallel);
  };
  flags["--tp-transport"] = [&](const std::string& v) -> std::optional<std::string> {
    if (v != "nccl" && v != "loopback") {
      return "--tp-transport: expected nccl or loopback, got '" + v + "'";
    }
    config.tp_transport = v;
    return std::nullopt;
  };
  bool pages_given = false;
  auto pages_flag = [&](const char* name, int32_t& out) {
    flags[name] = [name, &out, &pages_given](const std::string& v) {
      pages_given = true;
      return parse_int<int32_t>(name, v, 1, INT32_MAX, out);
    };
  };
  int32_flag("--page-size", 1, config.engine.page_size);
  pages_flag("--pages-global", config.engine.pages_global);
  pages_flag("--pages-local", config.engine.pages_local);
  int32_flag("--max-running", 1, config.engine.max_running);
  int32_flag("--max-step-tokens", 1, config.engine.max_step_tokens);
  int32_flag("--max-context", 0, config.engine.max_context);

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      config.help = true;
      continue;
    }
    if (arg == "--random-weights") {
      config.random_weights = true;
      continue;
    }
    if (arg == "--no-prefix-cache") {
      config.engine.prefix_cache = false;
      continue;
    }
    if (arg == "--batch-invariant") {
      config.engine.batch_invariant = true;
      continue;
    }
    std::string name = arg, value;
    bool inline_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    auto it = flags.find(name);
    if (it == flags.end()) return unexpected("unknown argument '" + arg + "' (see --help)");
    if (!inline_value) {
      if (i + 1 >= args.size()) return unexpected(name + ": expected a value");
      value = args[++i];
    }
    if (auto error = it->second(value)) return unexpected(std::move(*error));
  }
  if (!max_connections_given) config.server.max_connections = default_max_connections();
  if (config.gpu_memory_fraction && pages_given) {
    return unexpected(std::string(
        "--gpu-memory-fraction sizes the pools itself: give it or --pages-global/--pages-local, "
        "not both"));
  }
  if (config.gpu_memory_fraction && config.device != "cuda") {
    return unexpected(std::string("--gpu-memory-fraction: only meaningful with --device cuda"));
  }
  if (config.tensor_parallel > 1 && config.device != "cuda") {
    return unexpected(std::string("--tensor-parallel: only meaningful with --device cuda"));
  }
  if (config.tensor_parallel > 1 && config.engine.batch_invariant) {
    return unexpected(std::string(
        "--tensor-parallel and --batch-invariant do not go together (the collectives' sums are "
        "the transport's, not a row's own)"));
  }
  if (config.device == "cuda" && !config.model_dir && !config.help) {
    return unexpected(std::string("--device cuda: expected --model DIR (a checkpoint)"));
  }
  if (config.model_dir && !model_id_given) {
    std::string name = std::filesystem::path(*config.model_dir).filename().string();
    if (name.empty()) name = std::filesystem::path(*config.model_dir).parent_path().filename();
    if (!name.empty()) config.server.model_id = name;
  }
  return config;
}

size_t default_max_connections() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return kDefaultMaxConnections;
  }
  const auto fds = static_cast<size_t>(limit.rlim_cur);
  if (fds <= kReservedDescriptors) return 1;
  return std::min(kDefaultMaxConnections, fds - kReservedDescriptors);
}

void apply_environment(ServeConfig& config, const char* api_key_env) {
  if (config.server.api_key.empty() && api_key_env != nullptr) config.server.api_key = api_key_env;
}

std::optional<std::string> start_warning(const ServeConfig& config) {
  if (!config.server.api_key.empty()) return std::nullopt;
  boost::system::error_code ec;
  auto address = boost::asio::ip::make_address(config.server.host, ec);
  if (!ec && address.is_loopback()) return std::nullopt;
  return "warning: listening on " + config.server.host +
         ", which is not a loopback address, without an API key: anyone who can reach it can "
         "use it (set --api-key or TWINSTEP_API_KEY)";
}

bool cuda_device_compiled() {
#if TWINSTEP_SERVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<Backend, std::string> make_backend(const ServeConfig& config) {
  Backend backend;
  engine::EngineConfig engine_config = config.engine;
  if (config.device == "cuda") {
#if TWINSTEP_SERVE_CUDA
    TS_CHECK(config.model_dir.has_value())
        << "parse_serve_args lets --device cuda through only with --model";
    CudaBackendOptions options;
    options.random_weights = config.random_weights;
    options.decode_graphs = config.cuda_graphs;
    options.gpu_memory_fraction = config.gpu_memory_fraction;
    options.tensor_parallel = config.tensor_parallel;
    options.tp_loopback = config.tp_transport == "loopback";
    auto cuda = make_cuda_backend(*config.model_dir, options, engine_config);
    if (!cuda) return unexpected("--device cuda: " + cuda.error());
    backend.model = std::move(cuda->model);
    backend.device = std::move(cuda->device);
    backend.device_summary = std::move(cuda->summary);
#else
    return unexpected(std::string(
        "--device cuda: this twinstep-serve was built without the CUDA device (configure with "
        "a CUDA toolkit and TWINSTEP_CUDA=ON), so only --device sim is available"));
#endif
  } else {
    if (config.random_weights) {
      return unexpected(std::string("--random-weights: only meaningful with --device cuda"));
    }
    std::error_code ec;
    const bool preset =
        config.model_dir && !std::filesystem::is_directory(*config.model_dir, ec) &&
        std::ranges::count(engine::ModelConfig::preset_names(), *config.model_dir) == 1;
    if (preset) {
      auto model = engine::ModelConfig::preset(*config.model_dir);
      if (!model) return unexpected("--model " + *config.model_dir + ": " + model.error().message);
      backend.model = std::move(model.value());
    } else if (config.model_dir) {
      auto model =
          engine::ModelConfig::from_file(std::filesystem::path(*config.model_dir) / "config.json");
      if (!model) return unexpected("--model " + *config.model_dir + ": " + model.error().message);
      backend.model = std::move(model.value());
    } else {
      auto model = engine::ModelConfig::preset("sim-tiny");
      if (!model) return unexpected("preset sim-tiny: " + model.error().message);
      backend.model = std::move(model.value());
    }
    backend.device = std::make_unique<sim::SimDevice>(backend.model);
  }
  if (config.model_dir) {
    auto defaults = read_generation_defaults(*config.model_dir);
    if (!defaults) return unexpected("--model " + *config.model_dir + ": " + defaults.error());
    backend.sampling_defaults = defaults.value();
  }
  if (config.tokenizer) {
    auto text = load_text_model(*config.tokenizer);
    if (!text) return unexpected(text.error());
    backend.text = std::move(text.value());
  }
  auto engine = engine::Engine::create(backend.model, engine_config, *backend.device);
  if (!engine) return unexpected("engine: " + engine.error().message);
  backend.engine = std::move(engine.value());
  return backend;
}

}  // namespace twinstep::server
