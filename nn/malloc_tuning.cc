#include "nn/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <string>

namespace tpudist::nn {

std::optional<MallocTuning> ChooseMallocTuning(
    const std::function<const char*(const char*)>& getenv) {
  const char* opt = getenv("TPU_DIST_MALLOC_TUNING");
  if (opt != nullptr && std::string(opt) == "0") return std::nullopt;
  for (const char* user : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "GLIBC_TUNABLES"}) {
    if (getenv(user) != nullptr) return std::nullopt;
  }
  return MallocTuning{};
}

std::string TuneMallocForTraining() {
  const std::optional<MallocTuning> t =
      ChooseMallocTuning([](const char* name) { return std::getenv(name); });
  if (!t.has_value()) return "malloc: glibc settings left as they are (opted out or set by the user)";
  // Setting M_MMAP_THRESHOLD also turns off glibc's dynamic threshold, so it
  // goes with the trim threshold: one without the other is worse than neither.
  const bool ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(t->mmap_threshold)) == 1 &&
                  mallopt(M_TRIM_THRESHOLD, static_cast<int>(t->trim_threshold)) == 1 &&
                  mallopt(M_TOP_PAD, static_cast<int>(t->top_pad)) == 1;
  if (!ok) return "malloc: mallopt refused part of the training settings (some glibc defaults remain)";
  return "malloc: freed blocks kept for reuse (mmap threshold " +
         std::to_string(t->mmap_threshold >> 20) + " MiB, trim threshold " +
         std::to_string(t->trim_threshold >> 20) + " MiB; TPU_DIST_MALLOC_TUNING=0 turns this off)";
}

}  // namespace tpudist::nn
