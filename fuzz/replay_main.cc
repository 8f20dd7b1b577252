// fuzz_replay: runs saved inputs through the fuzz targets once each, without
// libFuzzer, so the normal (gcc) build tests every seed and every past crash
// (ctest entry fuzz_replay, label unit).
//
//   fuzz_replay <fuzz dir>            every file of <fuzz dir>/{corpus,regressions}/<target>/
//   fuzz_replay <target> <file>...    just these files through one target
//
// Each target's LLVMFuzzerTestOneInput is compiled under its own name here
// (fuzz/CMakeLists.txt renames it with a -D), so one binary holds them all.
// A crash or a FUZZ_CHECK failure aborts with the file named on stderr just
// before it; exit status 1 when a directory names no target or holds nothing.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

extern "C" {
int SafetensorsHeaderFuzzerTestOneInput(const uint8_t* data, size_t size);
int GemmaConfigFuzzerTestOneInput(const uint8_t* data, size_t size);
int TokenizerJsonFuzzerTestOneInput(const uint8_t* data, size_t size);
int EnvDiscoveryFuzzerTestOneInput(const uint8_t* data, size_t size);
int CoordinationStateFuzzerTestOneInput(const uint8_t* data, size_t size);
}

namespace {

namespace fs = std::filesystem;
using TestOneInput = int (*)(const uint8_t*, size_t);

const std::map<std::string, TestOneInput>& Targets() {
  static const auto* targets = new std::map<std::string, TestOneInput>{
      {"safetensors_header_fuzzer", SafetensorsHeaderFuzzerTestOneInput},
      {"gemma_config_fuzzer", GemmaConfigFuzzerTestOneInput},
      {"tokenizer_json_fuzzer", TokenizerJsonFuzzerTestOneInput},
      {"env_discovery_fuzzer", EnvDiscoveryFuzzerTestOneInput},
      {"coordination_state_fuzzer", CoordinationStateFuzzerTestOneInput},
  };
  return *targets;
}

bool RunFile(TestOneInput target, const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_replay: cannot read %s\n", file.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "  %s (%zu bytes)\n", file.c_str(), bytes.size());
  std::fflush(stderr);
  target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

// Sorted, so that runs are reproducible.
std::vector<fs::path> FilesIn(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

int ReplayTree(const fs::path& root) {
  int failures = 0;
  int total = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    if (!fs::is_directory(root / kind)) continue;
    for (const auto& dir : fs::directory_iterator(root / kind)) {
      if (!dir.is_directory()) continue;
      const std::string name = dir.path().filename().string();
      auto target = Targets().find(name);
      if (target == Targets().end()) {
        std::fprintf(stderr, "fuzz_replay: %s names no fuzz target\n", dir.path().c_str());
        ++failures;
        continue;
      }
      for (const fs::path& file : FilesIn(dir.path())) {
        failures += RunFile(target->second, file) ? 0 : 1;
        ++total;
      }
    }
  }
  std::printf("fuzz_replay: %d inputs from %s, %d failures\n", total, root.c_str(), failures);
  return failures == 0 && total > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) return ReplayTree(argv[1]);
  if (argc < 3 || Targets().count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: %s <fuzz dir> | %s <target> <file>...\n", argv[0], argv[0]);
    return 2;
  }
  int failures = 0;
  for (int i = 2; i < argc; ++i) failures += RunFile(Targets().at(argv[1]), argv[i]) ? 0 : 1;
  return failures == 0 ? 0 : 1;
}
