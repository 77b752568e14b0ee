// text/encode_bench.cc: twinstep-text-bench, one-thread encode throughput of the Gemma 3
// tokenizer on the parity corpus (the strings of text/testdata/gemma3_tokenizer_fixture.json,
// the same corpus gates/hf/make_tokenizer_fixtures.py times HF `tokenizers` on), and the cost
// of one ~32k-token prompt built the same way as the script's.
//
//   twinstep-text-bench [--tokenizer DIR|tokenizer.json] [--fixture FILE] [--passes N]
// Prints one JSON object: corpus bytes, cold (first pass) and warm (best pass) MB/s, the long
// prompt's tokens, bytes and best time in ms, and HF's figures from the runner for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One pass over the corpus; returns seconds.
double encode_pass(const twinstep::text::Tokenizer& t, const std::vector<std::string>& corpus,
                   std::vector<int32_t>& ids, size_t* total_ids) {
  const auto t0 = Clock::now();
  size_t n = 0;
  for (const std::string& s : corpus) {
    ids.clear();
    t.encode_into(s, false, ids);
    n += ids.size();
  }
  const double s = seconds_since(t0);
  *total_ids = n;
  return s;
}

// The script's long prompt: corpus strings from the end, each + "\n", to >= 32768 tokens.
std::string long_prompt(const twinstep::text::Tokenizer& t, const std::vector<std::string>& c) {
  std::string text;
  size_t count = 0;
  for (size_t i = 0; count < 32768; ++i) {
    const std::string piece = c[c.size() - 1 - (i % 64)] + "\n";
    count += t.encode(piece).size();
    text += piece;
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path = TWINSTEP_TOKENIZER_DIR;
  std::string fixture_path = std::string(TWINSTEP_TEXT_TESTDATA) + "/gemma3_tokenizer_fixture.json";
  int passes = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer"))
      tokenizer_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--fixture"))
      fixture_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--passes"))
      passes = std::max(1, std::atoi(argv[i + 1]));
  }
  auto files = twinstep::text::find_tokenizer_files(tokenizer_path);
  if (!files) {
    std::fprintf(stderr, "twinstep-text-bench: %s (run .ci/deps)\n", files.error().message.c_str());
    return 1;
  }
  auto t = twinstep::text::Tokenizer::from_file(files->tokenizer_json);
  std::ifstream in(fixture_path);
  if (!t || !in) {
    std::fprintf(stderr, "twinstep-text-bench: %s\n",
                 !t ? t.error().message.c_str() : (fixture_path + ": cannot open").c_str());
    return 1;
  }
  const json fixture = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (fixture.is_discarded() || !fixture.contains("encode")) {
    std::fprintf(stderr, "twinstep-text-bench: %s: not a fixture\n", fixture_path.c_str());
    return 1;
  }
  std::vector<std::string> corpus;
  size_t bytes = 0;
  for (const json& c : fixture["encode"]) {
    corpus.push_back(c[0].get<std::string>());
    bytes += corpus.back().size();
  }
  std::vector<int32_t> ids;
  size_t total_ids = 0;
  const double cold = encode_pass(*t, corpus, ids, &total_ids);
  double best = cold;
  for (int p = 1; p < passes; ++p) best = std::min(best, encode_pass(*t, corpus, ids, &total_ids));
  const std::string prompt = long_prompt(*t, corpus);
  double prompt_best = 1e9;
  size_t prompt_tokens = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = Clock::now();
    ids.clear();
    t->encode_into(prompt, false, ids);
    prompt_best = std::min(prompt_best, seconds_since(t0));
    prompt_tokens = ids.size();
  }
  json out = {{"corpus_strings", corpus.size()},
              {"corpus_bytes", bytes},
              {"corpus_ids", total_ids},
              {"cold_mb_s", bytes / cold / 1e6},
              {"warm_mb_s", bytes / best / 1e6},
              {"long_prompt_tokens", prompt_tokens},
              {"long_prompt_bytes", prompt.size()},
              {"long_prompt_ms", prompt_best * 1e3},
              {"threads", 1}};
  std::ifstream hf(std::string(TWINSTEP_TEXT_TESTDATA) + "/gemma3_hf_encode_bench.json");
  if (hf) out["hf_on_runner"] = json::parse(hf, nullptr, false);
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
