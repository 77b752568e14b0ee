// Unit tests of twinstep-serve's flags and backend selection.
#include "server/serve_options.h"

#include <gtest/gtest.h>

#include <utility>

namespace twinstep::server {
namespace {

TEST(ServeOptions, DefaultsServeTheSimulatedDevice) {
  auto config = parse_serve_args({});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->device, "sim");
  EXPECT_FALSE(config->model_dir.has_value());
  auto backend = make_backend(config.value());
  ASSERT_TRUE(backend.ok()) << backend.error();
  EXPECT_EQ(backend->device->name(), "sim");
  EXPECT_GT(backend->model.vocab_size, 0);
  EXPECT_TRUE(backend->engine->idle());
}

TEST(ServeOptions, FlagsAndValues) {
  auto config =
      parse_serve_args({"--device", "sim", "--host", "0.0.0.0", "--port=8123", "--pages-global",
                        "64", "--max-context", "512", "--max-body-bytes", "4096", "--sim-step-us",
                        "100", "--idle-timeout-s", "7"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->server.host, "0.0.0.0");
  EXPECT_EQ(config->server.port, 8123);
  EXPECT_EQ(config->engine.pages_global, 64);
  EXPECT_EQ(config->engine.max_context, 512);
  EXPECT_EQ(config->server.max_body_bytes, 4096u);
  EXPECT_EQ(config->server.loop.step_sleep_us, 100);
  EXPECT_EQ(config->server.idle_timeout, std::chrono::seconds(7));
}

TEST(ServeOptions, LimitFlags) {
  auto config =
      parse_serve_args({"--max-queued-bytes", "65536", "--write-timeout-s", "3",
                        "--max-connections=10", "--shutdown-timeout-s", "0", "--api-key", "k1"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->server.max_queued_bytes, 65536u);
  EXPECT_EQ(config->server.write_timeout, std::chrono::seconds(3));
  EXPECT_EQ(config->server.max_connections, 10u);
  EXPECT_EQ(config->server.shutdown_timeout, std::chrono::seconds(0));
  EXPECT_EQ(config->server.api_key, "k1");
  auto defaults = parse_serve_args({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->server.max_connections, default_max_connections());
  EXPECT_LE(default_max_connections(), kDefaultMaxConnections);
  EXPECT_GE(default_max_connections(), 1u);
  EXPECT_EQ(defaults->server.write_timeout, std::chrono::seconds(30));
  EXPECT_EQ(defaults->server.shutdown_timeout, std::chrono::seconds(5));
  EXPECT_TRUE(defaults->server.api_key.empty());
}

TEST(ServeOptions, ApiKeyFromTheEnvironmentAndTheBindWarning) {
  auto config = parse_serve_args({"--host", "0.0.0.0"});
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(start_warning(*config).has_value());
  EXPECT_NE(start_warning(*config)->find("without an API key"), std::string::npos);
  apply_environment(*config, "from-env");
  EXPECT_EQ(config->server.api_key, "from-env");
  EXPECT_FALSE(start_warning(*config).has_value());
  auto flag_wins = parse_serve_args({"--api-key", "from-flag"});
  ASSERT_TRUE(flag_wins.ok());
  apply_environment(*flag_wins, "from-env");
  EXPECT_EQ(flag_wins->server.api_key, "from-flag");
  apply_environment(*flag_wins, nullptr);
  EXPECT_EQ(flag_wins->server.api_key, "from-flag");
  for (const char* host : {"127.0.0.1", "::1"}) {
    auto local = parse_serve_args({"--host", host});
    ASSERT_TRUE(local.ok());
    EXPECT_FALSE(start_warning(*local).has_value()) << host;
  }
}

TEST(ServeOptions, BadFlagsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* expect;
  };
  const Case cases[] = {
      {{"--device", "tpu"}, "--device: expected sim or cuda"},
      {{"--port", "70000"}, "--port: expected an integer in [0, 65535]"},
      {{"--port"}, "--port: expected a value"},
      {{"--pages-local", "0"}, "--pages-local: expected an integer"},
      {{"--bogus", "1"}, "unknown argument '--bogus'"},
      {{"--max-connections", "0"}, "--max-connections: expected an integer in [1, "},
      {{"--write-timeout-s", "0"}, "--write-timeout-s: expected an integer in [1, "},
      {{"--max-queued-bytes", "10"}, "--max-queued-bytes: expected an integer in [4096, "},
      {{"--api-key", ""}, "--api-key: expected a non-empty key"},
      {{"--device", "cuda"}, "--device cuda: expected --model DIR"},
      {{"--cuda-graphs", "yes"}, "--cuda-graphs: expected on or off"},
      {{"--device", "cuda", "--model", "m", "--gpu-memory-fraction", "1"},
       "--gpu-memory-fraction: expected a number in (0, 1)"},
      {{"--device", "cuda", "--model", "m", "--gpu-memory-fraction", "0.5x"},
       "--gpu-memory-fraction: expected a number in (0, 1)"},
      {{"--device", "cuda", "--model", "m", "--gpu-memory-fraction", "0.9", "--pages-global", "64"},
       "give it or --pages-global/--pages-local, not both"},
      {{"--gpu-memory-fraction", "0.9"},
       "--gpu-memory-fraction: only meaningful with --device cuda"},
  };
  for (const Case& c : cases) {
    auto config = parse_serve_args(c.args);
    ASSERT_FALSE(config.ok()) << c.expect;
    EXPECT_NE(config.error().find(c.expect), std::string::npos) << config.error();
  }
}

// Either build gives a clear error, never a crash: a build without the CUDA device says so; a
// build with it names the model directory it could not read.
TEST(ServeOptions, CudaBackendErrorsAreClear) {
  auto config = parse_serve_args({"--device", "cuda", "--model", "/nonexistent-model-dir"});
  ASSERT_TRUE(config.ok()) << config.error();
  if (cuda_device_compiled()) {
    auto backend = make_backend(config.value());
    ASSERT_FALSE(backend.ok());
    EXPECT_NE(backend.error().find("/nonexistent-model-dir"), std::string::npos) << backend.error();
    return;
  }
  config->model_dir.reset();
  auto backend = make_backend(config.value());
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.error().find("built without the CUDA device"), std::string::npos)
      << backend.error();
}

TEST(ServeOptions, CudaGraphAndMemoryFlags) {
  auto config = parse_serve_args({"--device", "cuda", "--model", "m"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_TRUE(config->cuda_graphs);
  EXPECT_FALSE(config->gpu_memory_fraction.has_value());
  config = parse_serve_args(
      {"--device", "cuda", "--model", "m", "--cuda-graphs", "off", "--gpu-memory-fraction=0.85"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_FALSE(config->cuda_graphs);
  ASSERT_TRUE(config->gpu_memory_fraction.has_value());
  EXPECT_DOUBLE_EQ(*config->gpu_memory_fraction, 0.85);
}

TEST(ServeOptions, TensorParallelFlags) {
  auto config = parse_serve_args({"--device", "cuda", "--model", "m"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->tensor_parallel, 1);
  EXPECT_EQ(config->tp_transport, "nccl");
  config = parse_serve_args(
      {"--device", "cuda", "--model", "m", "--tensor-parallel", "4", "--tp-transport=loopback"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->tensor_parallel, 4);
  EXPECT_EQ(config->tp_transport, "loopback");
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--device", "cuda", "--model", "m", "--tensor-parallel", "0"}, "--tensor-parallel"},
      {{"--device", "cuda", "--model", "m", "--tensor-parallel", "17"}, "--tensor-parallel"},
      {{"--device", "cuda", "--model", "m", "--tp-transport", "mpi"},
       "--tp-transport: expected nccl or loopback, got 'mpi'"},
      {{"--tensor-parallel", "2"}, "--tensor-parallel: only meaningful with --device cuda"},
      {{"--device", "cuda", "--model", "m", "--tensor-parallel", "2", "--batch-invariant"},
       "do not go together"},
  };
  for (const auto& [args, message] : bad) {
    auto refused = parse_serve_args(args);
    ASSERT_FALSE(refused.ok()) << message;
    EXPECT_NE(refused.error().find(message), std::string::npos) << refused.error();
  }
}

TEST(ServeOptions, RandomWeightsOnlyWithCuda) {
  auto config = parse_serve_args({"--random-weights"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_TRUE(config->random_weights);
  auto backend = make_backend(config.value());
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.error().find("--random-weights"), std::string::npos) << backend.error();
}

TEST(ServeOptions, MissingModelDirNamesIt) {
  auto config = parse_serve_args({"--model", "/nonexistent/dir"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->server.model_id, "dir");
  auto backend = make_backend(config.value());
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.error().find("/nonexistent/dir"), std::string::npos) << backend.error();
}

TEST(ServeOptions, TokenizerAndPresetModels) {
  auto config = parse_serve_args({"--model", "gemma4-12b", "--tokenizer", "/nonexistent/tok"});
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->tokenizer, "/nonexistent/tok");
  EXPECT_EQ(config->server.model_id, "gemma4-12b");
  auto backend = make_backend(config.value());
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.error().find("--tokenizer"), std::string::npos) << backend.error();
  EXPECT_NE(backend.error().find("/nonexistent/tok"), std::string::npos) << backend.error();
  // The preset's geometry on the sim device (the 12B vocabulary the Gemma 3 tokenizer needs).
  config->tokenizer.reset();
  auto preset = make_backend(config.value());
  ASSERT_TRUE(preset.ok()) << preset.error();
  EXPECT_EQ(preset->model.vocab_size, 262144);
  EXPECT_EQ(preset->text, nullptr);
  EXPECT_FALSE(parse_serve_args({"--tokenizer", ""}).ok());
}

}  // namespace
TEST(ServeOptions, PrefixCacheIsOnUnlessTurnedOff) {
  auto on = parse_serve_args({});
  ASSERT_TRUE(on.ok()) << on.error();
  EXPECT_TRUE(on->engine.prefix_cache);
  auto off = parse_serve_args({"--no-prefix-cache", "--max-running", "4"});
  ASSERT_TRUE(off.ok()) << off.error();
  EXPECT_FALSE(off->engine.prefix_cache);
  EXPECT_EQ(off->engine.max_running, 4);
}

TEST(ServeOptions, BatchInvariantIsOffUnlessAsked) {
  auto off = parse_serve_args({});
  ASSERT_TRUE(off.ok()) << off.error();
  EXPECT_FALSE(off->engine.batch_invariant);
  auto on = parse_serve_args({"--batch-invariant", "--max-step-tokens", "64"});
  ASSERT_TRUE(on.ok()) << on.error();
  EXPECT_TRUE(on->engine.batch_invariant);
  EXPECT_EQ(on->engine.max_step_tokens, 64);
  auto valued = parse_serve_args({"--batch-invariant=on"});
  ASSERT_FALSE(valued.ok());
  EXPECT_NE(valued.error().find("--batch-invariant=on"), std::string::npos) << valued.error();
  EXPECT_NE(serve_usage().find("--batch-invariant"), std::string::npos);
}

}  // namespace twinstep::server
