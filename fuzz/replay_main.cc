// Replay driver for the fuzz target in builds without libFuzzer (g++): runs every file named
// (or found in a named directory, in sorted order) through LLVMFuzzerTestOneInput, then
// `--random N SEED` inputs drawn from our PRNG. A violation aborts, as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "sim/rng.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "twinstep-fuzz-replay: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--random") {
      if (i + 2 >= argc) {
        std::fprintf(stderr, "twinstep-fuzz-replay: --random needs N and SEED\n");
        return 2;
      }
      const long count = std::strtol(argv[++i], nullptr, 10);
      twinstep::sim::Rng rng(std::strtoull(argv[++i], nullptr, 10));
      for (long n = 0; n < count; ++n) {
        std::vector<uint8_t> bytes(rng.below(600));
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.next() >> 56);
        LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      }
      std::printf("twinstep-fuzz-replay: %ld random inputs ok\n", count);
      continue;
    }
    const std::filesystem::path path(arg);
    if (std::filesystem::is_directory(path)) {
      std::vector<std::filesystem::path> entries;
      for (const auto& e : std::filesystem::directory_iterator(path)) {
        if (e.is_regular_file()) entries.push_back(e.path());
      }
      std::sort(entries.begin(), entries.end());
      for (const auto& e : entries) run_file(e);
      files += static_cast<int>(entries.size());
    } else {
      run_file(path);
      files += 1;
    }
  }
  std::printf("twinstep-fuzz-replay: %d corpus files ok\n", files);
  return 0;
}
