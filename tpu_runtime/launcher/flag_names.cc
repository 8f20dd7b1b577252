#include "tpu_runtime/launcher/flag_names.h"

namespace tpudist::tpu_runtime::launcher {

std::vector<std::string> UnderscoreFlagNames(int argc, const char* const* argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    std::string& arg = out[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) continue;
    for (size_t c = 2; c < arg.size() && arg[c] != '='; ++c) {
      if (arg[c] == '-') arg[c] = '_';
    }
  }
  return out;
}

}  // namespace tpudist::tpu_runtime::launcher
