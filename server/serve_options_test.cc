// Unit tests of twinstep-serve's flags and backend selection.
#include "server/serve_options.h"

#include <gtest/gtest.h>

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
      {{"--device", "cuda"}, "--device cuda: expected --model DIR"},
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

}  // namespace
}  // namespace twinstep::server
