// FastUnixNanos against the system clock (absl::GetCurrentTimeNanos, i.e.
// CLOCK_REALTIME): every reading lies between a system-clock reading taken
// just before it and one taken just after (with 20 us of slack), through the
// first 20 ms (system-clock reads), the calibration, and several 50 ms
// re-anchors, on two threads; and a thread's readings never go backwards.
#include "collectives/fast_clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace tpudist::collectives {
namespace {

constexpr int64_t kSlackNs = 20'000;

// Brackets FastUnixNanos between system-clock reads for ~`ms` milliseconds;
// returns the largest distance outside a bracket (0: always inside).
int64_t WorstOutsideBracket(int ms) {
  int64_t worst = 0;
  const int64_t end = absl::GetCurrentTimeNanos() + int64_t{ms} * 1'000'000;
  for (int i = 0;; ++i) {
    const int64_t before = absl::GetCurrentTimeNanos();
    const int64_t fast = FastUnixNanos();
    const int64_t after = absl::GetCurrentTimeNanos();
    worst = std::max({worst, before - fast, fast - after});
    if (after > end) break;
    if (i % 64 == 0) absl::SleepFor(absl::Microseconds(200));  // let ticks pass unread
  }
  return worst;
}

TEST(FastClockTest, StaysWithinTheSystemClockOnEveryThread) {
  std::printf("FastClockUsesTsc: %d\n", FastClockUsesTsc() ? 1 : 0);
  int64_t worst_other = 0;
  std::thread other([&] { worst_other = WorstOutsideBracket(300); });
  const int64_t worst_main = WorstOutsideBracket(300);
  other.join();
  EXPECT_LE(worst_main, kSlackNs) << "ns outside the system clock's bracket";
  EXPECT_LE(worst_other, kSlackNs) << "ns outside the system clock's bracket";
}

TEST(FastClockTest, NeverGoesBackwardsOnAThread) {
  int64_t last = FastUnixNanos();
  int64_t backwards = 0;
  const int64_t end = absl::GetCurrentTimeNanos() + 150'000'000;  // three re-anchors
  while (absl::GetCurrentTimeNanos() < end) {
    for (int i = 0; i < 1000; ++i) {
      const int64_t now = FastUnixNanos();
      backwards = std::max(backwards, last - now);
      last = now;
    }
  }
  EXPECT_EQ(backwards, 0) << "ns backwards";
}

}  // namespace
}  // namespace tpudist::collectives
