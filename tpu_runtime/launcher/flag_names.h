// Lets command lines spell flags with dashes, as the docs do
// ("--accelerator-type v6e"), although absl flag names use underscores.
//
// Pure; thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_FLAG_NAMES_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_FLAG_NAMES_H_

#include <string>
#include <vector>

namespace tpudist::tpu_runtime::launcher {

// Returns argv with '-' replaced by '_' in the name part of every "--name" or
// "--name=value" argument (never in values, never in argv[0], and not after a
// bare "--", which ends the flags: the rank binary's own arguments stay as
// given). Single-dash arguments are left alone.
std::vector<std::string> UnderscoreFlagNames(int argc, const char* const* argv);

// Owns a rewritten argv in the form absl::ParseCommandLine wants.
class NormalizedArgv {
 public:
  NormalizedArgv(int argc, const char* const* argv) : args_(UnderscoreFlagNames(argc, argv)) {
    for (std::string& a : args_) pointers_.push_back(a.data());
    pointers_.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(args_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<char*> pointers_;
};

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_FLAG_NAMES_H_
