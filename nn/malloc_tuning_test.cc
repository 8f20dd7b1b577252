#include "nn/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace tpudist::nn {
namespace {

std::optional<MallocTuning> Choose(const std::map<std::string, std::string>& env) {
  return ChooseMallocTuning([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(MallocTuningTest, ChoosesTheTrainingSettingsUnlessOptedOutOrUserTuned) {
  const std::optional<MallocTuning> d = Choose({});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->mmap_threshold, int64_t{64} << 20);
  EXPECT_EQ(d->trim_threshold, int64_t{256} << 20);
  EXPECT_TRUE(Choose({{"TPU_DIST_MALLOC_TUNING", "1"}}).has_value());
  EXPECT_FALSE(Choose({{"TPU_DIST_MALLOC_TUNING", "0"}}).has_value());
  for (const char* user : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "GLIBC_TUNABLES"}) {
    EXPECT_FALSE(Choose({{user, "1"}}).has_value()) << user;
  }
}

void* volatile sink = nullptr;  // keeps the compiler from eliding malloc/free pairs

// Bytes of live mmap'ed blocks while a fresh `bytes` block is held.
size_t MmappedWhileHolding(size_t bytes) {
  sink = std::malloc(bytes);
  const size_t held = mallinfo2().hblkhd;
  std::free(sink);
  sink = nullptr;
  return held;
}

// In a child process (mallopt is process-wide): a 48 MiB block is mmap'ed
// (and unmapped on free) under glibc's defaults -- above its largest dynamic
// threshold of 32 MiB -- and comes from the heap once tuned.
TEST(MallocTuningTest, TunedBlocksComeFromTheHeap) {
  if (!Choose({}).has_value() || std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("GLIBC_TUNABLES") ||
      std::getenv("TPU_DIST_MALLOC_TUNING")) {
    GTEST_SKIP() << "malloc settings come from the environment";
  }
  EXPECT_EXIT(
      {
        const size_t base = mallinfo2().hblkhd;
        if (MmappedWhileHolding(48 << 20) < base + (48 << 20)) std::_Exit(2);  // default: mmap'ed
        const std::string said = TuneMallocForTraining();
        if (said.find("kept for reuse") == std::string::npos) std::_Exit(3);
        if (MmappedWhileHolding(48 << 20) >= base + (48 << 20)) std::_Exit(4);  // tuned: heap
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tpudist::nn
