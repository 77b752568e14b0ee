// apps/gates_check.cc: twinstep-gates-check, the proof that the GPU gate manifest
// (manifests/gpu-gates.json) matches reality in both directions:
//   (a) the gates compiled into the gate binaries (each run with --gtest_list_tests), and
//   (b) the tests the gpu-gates test preset registers (its label filter, read from
//       CMakePresets.json, applied to `ctest -N --show-only=json-v1` of a build tree).
// Needs no GPU: listing tests runs no test body. Exits 1 naming every difference.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#ifndef TWINSTEP_SOURCE_DIR
#define TWINSTEP_SOURCE_DIR "."
#endif
#ifndef TWINSTEP_BINARY_DIR
#define TWINSTEP_BINARY_DIR "."
#endif
#ifndef TWINSTEP_CTEST
#define TWINSTEP_CTEST "ctest"
#endif

struct Options {
  std::string manifest = TWINSTEP_SOURCE_DIR "/manifests/gpu-gates.json";
  std::string presets = TWINSTEP_SOURCE_DIR "/CMakePresets.json";
  std::string build_dir = TWINSTEP_BINARY_DIR;
  std::string ctest = TWINSTEP_CTEST;
  std::string preset = "gpu-gates";
  std::vector<std::string> gate_binaries;
};

// An operating error of the tool itself (unreadable file, malformed JSON): exit 2.
struct Fatal {
  std::string message;
};

const char* kUsage =
    "usage: twinstep-gates-check [--manifest PATH] [--presets PATH] [--build-dir DIR]\n"
    "                            [--ctest PATH] [--preset NAME] [--gate-binary PATH]...\n"
    "Compares the gate manifest with the gates compiled into the gate binaries and with the\n"
    "tests the test preset registers in DIR. Exit 0: they agree; 1: differences (each named);\n"
    "2: the inputs could not be read.\n";

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Fatal{a + " needs a value\n" + kUsage};
      return argv[++i];
    };
    if (a == "--manifest")
      o.manifest = value();
    else if (a == "--presets")
      o.presets = value();
    else if (a == "--build-dir")
      o.build_dir = value();
    else if (a == "--ctest")
      o.ctest = value();
    else if (a == "--preset")
      o.preset = value();
    else if (a == "--gate-binary")
      o.gate_binaries.push_back(value());
    else if (a == "--help" || a == "-h")
      throw Fatal{kUsage};
    else
      throw Fatal{"unknown argument '" + a + "'\n" + kUsage};
  }
  return o;
}

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw Fatal{std::string("cannot open ") + what + " '" + path + "'"};
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Fatal{std::string(what) + " '" + path + "' is not valid JSON: " + e.what()};
  }
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a command, returns its stdout; a non-zero exit is fatal.
std::string run(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw Fatal{"cannot run: " + command};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    throw Fatal{"command failed (status " + std::to_string(status) + "): " + command};
  }
  return out;
}

std::string basename_of(const std::string& path) { return fs::path(path).filename().string(); }

// name -> binary basename, from the manifest. Malformed entries are fatal.
std::map<std::string, std::string> load_manifest(const std::string& path) {
  const json m = read_json(path, "manifest");
  if (!m.is_object() || !m.contains("gates") || !m["gates"].is_array()) {
    throw Fatal{"manifest '" + path + "' must be an object with a \"gates\" array"};
  }
  std::map<std::string, std::string> gates;
  size_t i = 0;
  for (const json& g : m["gates"]) {
    const std::string at = "manifest gates[" + std::to_string(i++) + "]";
    for (const char* field : {"name", "binary", "purpose"}) {
      if (!g.is_object() || !g.contains(field) || !g[field].is_string() ||
          g[field].get<std::string>().empty()) {
        throw Fatal{at + " needs a non-empty string \"" + field + "\""};
      }
    }
    const std::string name = g["name"];
    if (name.find('.') == std::string::npos) {
      throw Fatal{at + " name '" + name + "' must be the full gtest name Suite.Test"};
    }
    if (!gates.emplace(name, g["binary"].get<std::string>()).second) {
      throw Fatal{at + " names '" + name + "' a second time"};
    }
  }
  return gates;
}

struct LabelFilter {
  std::string include;  // regex; a test needs a label matching it
  std::string exclude;  // regex or empty; a test with a label matching it is dropped
};

LabelFilter load_filter(const std::string& path, const std::string& preset) {
  const json p = read_json(path, "presets file");
  if (p.contains("testPresets") && p["testPresets"].is_array()) {
    for (const json& t : p["testPresets"]) {
      if (!t.is_object() || t.value("name", "") != preset) continue;
      LabelFilter f;
      if (t.contains("filter")) {
        const json& filter = t["filter"];
        if (filter.contains("include") && filter["include"].contains("label")) {
          f.include = filter["include"]["label"].get<std::string>();
        }
        if (filter.contains("exclude") && filter["exclude"].contains("label")) {
          f.exclude = filter["exclude"]["label"].get<std::string>();
        }
      }
      if (f.include.empty()) {
        throw Fatal{"test preset '" + preset + "' in '" + path +
                    "' has no filter.include.label; it would run every test"};
      }
      return f;
    }
  }
  throw Fatal{"no test preset named '" + preset + "' in '" + path + "'"};
}

// name -> binary basename of every test registered in build_dir that the filter selects.
std::map<std::string, std::string> load_registered(const Options& o, const LabelFilter& f,
                                                   std::set<std::string>* binaries) {
  const std::string out = run(shell_quote(o.ctest) + " --test-dir " + shell_quote(o.build_dir) +
                              " -N --show-only=json-v1");
  json info;
  try {
    info = json::parse(out);
  } catch (const json::exception& e) {
    throw Fatal{std::string("ctest --show-only=json-v1 printed invalid JSON: ") + e.what()};
  }
  const std::regex include(f.include);
  const std::regex exclude(f.exclude.empty() ? "(?!)" : f.exclude);
  std::map<std::string, std::string> registered;
  for (const json& t : info.value("tests", json::array())) {
    std::vector<std::string> labels;
    for (const json& prop : t.value("properties", json::array())) {
      if (prop.value("name", "") == "LABELS")
        labels = prop["value"].get<std::vector<std::string>>();
    }
    bool in = false, out_ = false;
    for (const std::string& l : labels) {
      in = in || std::regex_search(l, include);
      out_ = out_ || std::regex_search(l, exclude);
    }
    if (!in || out_) continue;
    std::string binary = "?";
    if (t.contains("command") && t["command"].is_array() && !t["command"].empty()) {
      binaries->insert(t["command"][0].get<std::string>());
      binary = basename_of(t["command"][0].get<std::string>());
    }
    registered.emplace(t.value("name", ""), binary);
  }
  return registered;
}

// name -> binary basename of every gate compiled into the binaries (--gtest_list_tests).
std::map<std::string, std::string> load_compiled(const std::set<std::string>& binaries) {
  std::map<std::string, std::string> compiled;
  for (const std::string& bin : binaries) {
    std::istringstream lines(run(shell_quote(bin) + " --gtest_list_tests"));
    std::string line, suite;
    while (std::getline(lines, line)) {
      const size_t hash = line.find('#');  // "  Name/0  # GetParam() = ..."
      if (hash != std::string::npos) line.erase(hash);
      while (!line.empty() && line.back() == ' ') line.pop_back();
      if (line.empty()) continue;
      if (line[0] != ' ') {
        suite = line;  // "Suite."
      } else {
        compiled.emplace(suite + line.substr(line.find_first_not_of(' ')), basename_of(bin));
      }
    }
  }
  return compiled;
}

// Appends a line per key of `have` missing from `want`.
void diff_into(const std::map<std::string, std::string>& have,
               const std::map<std::string, std::string>& want, const std::string& message,
               std::vector<std::string>* problems) {
  for (const auto& [name, binary] : have) {
    if (!want.count(name)) problems->push_back(name + " (" + binary + "): " + message);
  }
}

int check(const Options& o) {
  const auto manifest = load_manifest(o.manifest);
  const LabelFilter filter = load_filter(o.presets, o.preset);
  std::set<std::string> binaries(o.gate_binaries.begin(), o.gate_binaries.end());
  const auto registered = load_registered(o, filter, &binaries);
  const auto compiled = load_compiled(binaries);

  std::vector<std::string> problems;
  diff_into(manifest, compiled,
            "in the manifest, but no gate binary has it (deleted from the source?)", &problems);
  diff_into(compiled, manifest, "compiled into a gate binary, but not in the manifest", &problems);
  diff_into(manifest, registered,
            "in the manifest, but the '" + o.preset + "' preset does not register it", &problems);
  diff_into(registered, manifest,
            "registered with label /" + filter.include + "/ for the '" + o.preset +
                "' preset, but not in the manifest",
            &problems);
  for (const auto& [name, binary] : manifest) {
    auto it = compiled.find(name);
    if (it != compiled.end() && it->second != binary) {
      problems.push_back(name + ": the manifest says binary " + binary + ", it is compiled into " +
                         it->second);
    }
  }
  std::cout << "manifest " << o.manifest << ": " << manifest.size()
            << " gates; compiled: " << compiled.size() << " in " << binaries.size()
            << " binaries; registered for '" << o.preset << "' in " << o.build_dir << ": "
            << registered.size() << "\n";
  for (const std::string& p : problems) std::cout << "DIFFERENCE: " << p << "\n";
  if (!problems.empty()) {
    std::cout << problems.size() << " difference(s); FAIL\n";
    return 1;
  }
  std::cout << "OK: manifest, compiled gates and registered gpu tests agree\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return check(parse_args(argc, argv));
  } catch (const Fatal& f) {
    std::cerr << "twinstep-gates-check: " << f.message << "\n";
    return 2;
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
    std::cerr << "twinstep-gates-check: malformed JSON input: " << e.what() << "\n";
    return 2;
  }
}
