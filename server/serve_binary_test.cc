// Drives the built twinstep-serve binary with curl (a widely used third-party client):
// `--no-buffer` streams equal the engine's direct output, and SIGTERM while a stream is busy
// ends the stream, drains the pools and exits 0. Every wait polls a pipe with a deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "sim/sim_device.h"

namespace twinstep::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(120);

// A child process with its stdout (and stderr) on a pipe we read line by line.
class Child {
 public:
  // `max_fds` > 0: the child runs with that RLIMIT_NOFILE (as under `ulimit -n`); `env`:
  // "NAME=VALUE" entries set in the child only.
  explicit Child(const std::vector<std::string>& argv, rlim_t max_fds = 0,
                 const std::vector<std::string>& env = {}) {
    int fds[2];
    TS_CHECK(pipe(fds) == 0) << "pipe";
    pid_ = fork();
    TS_CHECK(pid_ >= 0) << "fork";
    if (pid_ == 0) {
      if (max_fds > 0) {
        rlimit limit{max_fds, max_fds};
        if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
      }
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::perror("execvp");
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  // The next line (without '\n'), or nullopt at EOF or when the deadline passes.
  std::optional<std::string> line(std::chrono::steady_clock::duration deadline = kDeadline) {
    auto until = Clock::now() + deadline;
    for (;;) {
      if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string out = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return out;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      ssize_t n = read(fd_, chunk, sizeof chunk);
      if (n <= 0) {
        if (buffer_.empty()) return std::nullopt;
        std::string out;
        out.swap(buffer_);
        return out;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  std::vector<std::string> rest() {
    std::vector<std::string> lines;
    while (auto l = line()) lines.push_back(*l);
    return lines;
  }
  // Exit status, or -1 if it has not exited by the deadline.
  int wait_exit(std::chrono::steady_clock::duration deadline = kDeadline) {
    auto until = Clock::now() + deadline;
    while (Clock::now() < until) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        // Whatever it wrote before exiting is still in the pipe.
        for (;;) {
          char chunk[4096];
          pollfd p{fd_, POLLIN, 0};
          if (poll(&p, 1, 1000) <= 0) break;
          ssize_t n = read(fd_, chunk, sizeof chunk);
          if (n <= 0) break;
          buffer_.append(chunk, static_cast<size_t>(n));
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      pollfd p{fd_, POLLIN, 0};  // drain output meanwhile, so the child never blocks on it
      if (poll(&p, 1, 50) > 0) {
        char chunk[4096];
        ssize_t n = read(fd_, chunk, sizeof chunk);
        if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
      }
    }
    return -1;
  }
  pid_t pid() const { return pid_; }
  const std::string& buffered() const { return buffer_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

// Starts twinstep-serve on an ephemeral port and returns the port it printed.
uint16_t start_server(Child& server) {
  std::optional<std::string> first = server.line();
  TS_CHECK(first.has_value()) << "twinstep-serve printed nothing";
  const std::string marker = "listening on http://127.0.0.1:";
  size_t at = first->find(marker);
  TS_CHECK(at != std::string::npos) << "unexpected first line: " << *first;
  return static_cast<uint16_t>(std::stoi(first->substr(at + marker.size())));
}

std::vector<std::string> curl_args(uint16_t port, const std::string& path, const json& body) {
  std::vector<std::string> args = {
      "curl",       "-sS", "--no-buffer",
      "--max-time", "120", "http://127.0.0.1:" + std::to_string(port) + path};
  if (!body.is_null()) {
    args.insert(args.end(), {"-H", "Content-Type: application/json", "-d", body.dump()});
  }
  return args;
}

std::vector<int32_t> direct_tokens(const engine::Request& request) {
  auto model = engine::ModelConfig::preset("sim-tiny").value();
  sim::SimDevice device(model);
  auto engine = std::move(engine::Engine::create(model, {}, device).value());
  engine->submit(request);
  std::vector<int32_t> tokens;
  while (!engine->idle()) {
    for (const auto& u : engine->step().updates) {
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  return tokens;
}

// Token ids of every `data:` chunk, and whether [DONE] closed the stream.
struct Parsed {
  std::vector<int32_t> tokens;
  std::string finish_reason;
  std::vector<json> errors;
  bool done = false;
};
Parsed parse_sse(const std::vector<std::string>& lines) {
  Parsed out;
  for (const std::string& l : lines) {
    if (l.empty()) continue;
    EXPECT_EQ(l.rfind("data: ", 0), 0u) << l;
    std::string data = l.substr(6);
    if (data == "[DONE]") {
      out.done = true;
      continue;
    }
    json event = json::parse(data);
    if (event.contains("error")) {
      out.errors.push_back(event);
      continue;
    }
    for (const json& choice : event["choices"]) {
      for (const json& t : choice["token_ids"]) out.tokens.push_back(t.get<int32_t>());
      if (choice["finish_reason"].is_string()) out.finish_reason = choice["finish_reason"];
    }
  }
  return out;
}

TEST(ServeBinary, CurlStreamsEqualTheEngineAndSigtermExitsZero) {
  // Paced at 5 ms a step so that the long stream below runs for about 20 s: it is surely
  // still running when SIGTERM arrives, and nothing waits for it to end on its own.
  Child server({TWINSTEP_SERVE_BINARY, "--device", "sim", "--port", "0", "--sim-step-us", "5000"});
  uint16_t port = start_server(server);

  engine::Request request;
  request.prompt = {11, 12, 13, 14, 15};
  request.max_tokens = 24;
  request.sampling.temperature = 0.9f;
  request.sampling.seed = 4242;
  request.stop_ids = {1};  // the model's eos, which the server adds
  std::vector<int32_t> expected = direct_tokens(request);

  json body = {{"prompt", request.prompt},
               {"max_tokens", 24},
               {"temperature", 0.9},
               {"seed", 4242},
               {"stream", true}};
  Child stream(curl_args(port, "/v1/completions", body));
  std::vector<std::string> lines = stream.rest();
  ASSERT_EQ(stream.wait_exit(), 0) << "curl failed";
  Parsed parsed = parse_sse(lines);
  EXPECT_TRUE(parsed.done);
  EXPECT_EQ(parsed.tokens, expected);
  EXPECT_EQ(parsed.finish_reason, expected.size() == 24 ? "length" : "stop");

  body["stream"] = false;
  Child plain(curl_args(port, "/v1/completions", body));
  std::vector<std::string> doc_lines = plain.rest();
  ASSERT_EQ(plain.wait_exit(), 0);
  ASSERT_FALSE(doc_lines.empty());
  json doc = json::parse(doc_lines[0]);
  EXPECT_EQ(doc["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expected);

  // A long stream, busy when SIGTERM arrives.
  json long_body = {
      {"prompt", {3, 4, 5}}, {"max_tokens", 4000}, {"stream", true}, {"ignore_eos", true}};
  Child busy(curl_args(port, "/v1/completions", long_body));
  std::optional<std::string> first = busy.line();
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->rfind("data: {", 0), 0u) << *first;
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  std::vector<std::string> tail = busy.rest();
  EXPECT_EQ(busy.wait_exit(), 0);
  tail.insert(tail.begin(), *first);
  Parsed cut = parse_sse(tail);
  EXPECT_TRUE(cut.done);
  EXPECT_LT(cut.tokens.size(), 4000u);
  ASSERT_EQ(cut.errors.size(), 1u);
  EXPECT_EQ(cut.errors[0]["error"]["type"], "server_shutting_down");

  EXPECT_EQ(server.wait_exit(), 0) << server.buffered();
  std::string log = server.buffered();
  EXPECT_NE(log.find("aborted 1 in flight"), std::string::npos) << log;
  EXPECT_NE(log.find("(baseline)"), std::string::npos) << log;
}

// /proc/PID/status's VmRSS in bytes (0 if unreadable).
double rss_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      double kb = 0;
      status >> kb;
      return kb * 1024;
    }
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// User + system CPU seconds of a process, from /proc/PID/stat.
double cpu_seconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::vector<std::string> f((std::istream_iterator<std::string>(fields)),
                             std::istream_iterator<std::string>());
  return f.size() > 12 ? (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK) : -1;
}

// A connected socket that never reads (a small receive buffer, so that it fills fast).
int silent_socket(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  TS_CHECK(fd >= 0) << "socket";
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TS_CHECK(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) << "connect";
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size();) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    TS_CHECK(n > 0) << "send";
    sent += static_cast<size_t>(n);
  }
}

// The client: 120 pipelined streams (~24 KB) on one connection, never reading. With
// it attached, the server's RSS stays within a bound, and SIGTERM ends the process within
// --shutdown-timeout-s plus the drain. (It used to grow RSS by 600 MB and hold SIGTERM 22 s.)
// Under AddressSanitizer (the asan preset) the allocator holds freed chunks back in a quarantine
// (256 MB by default) so that a use after free is caught; that retention is the sanitizer's, not
// the server's buffering, which this test bounds: the measured server runs without it there.
#if defined(__SANITIZE_ADDRESS__)
const std::vector<std::string> kMeasuredServerEnv = {"ASAN_OPTIONS=quarantine_size_mb=0"};
#else
const std::vector<std::string> kMeasuredServerEnv = {};
#endif

TEST(ServeBinary, NonReadingPipeliningClientBoundsRssAndSigtermTime) {
  Child server({TWINSTEP_SERVE_BINARY, "--port", "0", "--sim-step-us", "0", "--max-queued-bytes",
                "65536", "--write-timeout-s", "600", "--shutdown-timeout-s", "2"},
               0, kMeasuredServerEnv);
  uint16_t port = start_server(server);
  const double baseline = rss_bytes(server.pid());
  ASSERT_GT(baseline, 0);
  int fd = silent_socket(port);
  std::string bytes;
  for (int i = 0; i < 120; ++i) {
    std::string body = json{
        {"prompt", {2 + i % 50, 3, 4}},
        {"max_tokens", 4000},
        {"ignore_eos", true},
        {"stream", true}}.dump();
    bytes +=
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Accept: text/event-stream\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  ASSERT_GT(bytes.size(), 20'000u);
  send_all(fd, bytes);
  // Watch for 4 s: unpaced, the simulated device runs all 120 streams within it, and
  // without the bound every one would queue its ~800 KB of events (~90 MB in all).
  double peak = baseline;
  for (auto until = Clock::now() + std::chrono::seconds(4); Clock::now() < until;) {
    peak = std::max(peak, rss_bytes(server.pid()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  constexpr double kRssBoundBytes = 32.0 * 1024 * 1024;
  std::printf("rss: baseline %.1f MB, peak %.1f MB with the non-reading client (bound +%.0f MB)\n",
              baseline / 1048576, peak / 1048576, kRssBoundBytes / 1048576);
  EXPECT_LT(peak - baseline, kRssBoundBytes);
  auto begun = Clock::now();
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(30)), 0) << server.buffered();
  double took = std::chrono::duration<double>(Clock::now() - begun).count();
  std::printf("sigterm: exited %.2f s after the signal (--shutdown-timeout-s 2)\n", took);
  EXPECT_LT(took, 2.0 + 3.0);
  EXPECT_NE(server.buffered().find("(baseline)"), std::string::npos) << server.buffered();
  close(fd);
}

// Out of descriptors (`ulimit -n 64`, 100 idle connections, a cap above what fits): accept
// backs off instead of spinning, and the server serves again once descriptors free up.
TEST(ServeBinary, OutOfDescriptorsAcceptBacksOffAndRecovers) {
  Child server({TWINSTEP_SERVE_BINARY, "--port", "0", "--max-connections", "1000"}, 64);
  uint16_t port = start_server(server);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(silent_socket(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let it hit EMFILE
  double before = cpu_seconds(server.pid());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  double used = cpu_seconds(server.pid()) - before;
  std::printf("emfile: %.2f s of CPU in 2 s with accept out of descriptors\n", used);
  EXPECT_LT(used, 0.5) << "the accept loop spins";
  for (int fd : idle) close(fd);
  Child health(curl_args(port, "/health", nullptr));
  std::vector<std::string> lines = health.rest();
  EXPECT_EQ(health.wait_exit(), 0);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("\"ok\""), std::string::npos) << lines[0];
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait_exit(), 0) << server.buffered();
  // It did run out (else this test proved nothing), and said so once, not per failure.
  const std::string& log = server.buffered();
  size_t said = log.find("pausing new connections");
  EXPECT_NE(said, std::string::npos) << log;
  EXPECT_EQ(log.find("pausing new connections", said + 1), std::string::npos) << log;
}

// The setting itself (`ulimit -n 64`, default flags, 100 idle connections): the cap
// is below the descriptor limit, so /health gets a clean 503 at once, and 200 once the idle
// connections are gone.
TEST(ServeBinary, DescriptorLimitLowersTheDefaultCapSoRefusalsAre503) {
  Child server({TWINSTEP_SERVE_BINARY, "--port", "0"}, 64);
  uint16_t port = start_server(server);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(silent_socket(port));
  Child refused({"curl", "-sS", "--max-time", "30", "-w", "%{http_code}", "-o", "/dev/null",
                 "http://127.0.0.1:" + std::to_string(port) + "/health"});
  std::vector<std::string> code = refused.rest();
  refused.wait_exit();
  ASSERT_FALSE(code.empty());
  EXPECT_EQ(code.back(), "503");
  for (int fd : idle) close(fd);
  std::optional<std::string> ok;
  for (auto until = Clock::now() + kDeadline; Clock::now() < until;) {
    Child health(curl_args(port, "/health", nullptr));
    std::vector<std::string> lines = health.rest();
    health.wait_exit();
    if (!lines.empty() && lines[0].find("\"ok\"") != std::string::npos) {
      ok = lines[0];
      break;
    }
  }
  EXPECT_TRUE(ok.has_value()) << "/health never answered 200 again";
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait_exit(), 0) << server.buffered();
}

// promtool (Debian's prometheus package, from .ci/deps) accepts /metrics; a missing promtool
// fails this test.
TEST(ServeBinary, PromtoolChecksMetrics) {
  Child server({TWINSTEP_SERVE_BINARY, "--port", "0"});
  uint16_t port = start_server(server);
  Child check({"bash", "-o", "pipefail", "-c",
               "curl -sS --max-time 60 http://127.0.0.1:" + std::to_string(port) +
                   "/metrics | promtool check metrics"});
  std::vector<std::string> out = check.rest();
  std::string text;
  for (const auto& l : out) text += l + "\n";
  EXPECT_EQ(check.wait_exit(), 0) << text;
  ASSERT_EQ(kill(server.pid(), SIGTERM), 0);
  EXPECT_EQ(server.wait_exit(), 0);
}

// Without a CUDA build, or without the checkpoint, --device cuda fails with a message, exit 2.
TEST(ServeBinary, CudaWithoutItsRequirementsIsAClearError) {
  Child server({TWINSTEP_SERVE_BINARY, "--device", "cuda", "--model", "/nonexistent"});
  std::vector<std::string> lines = server.rest();
  EXPECT_EQ(server.wait_exit(), 2);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("twinstep-serve: "), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace twinstep::server
