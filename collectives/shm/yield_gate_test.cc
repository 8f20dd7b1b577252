// The adaptive yield stage of WaitForSeq (wait.h): NextYieldGate as a pure
// function of yield timings, and how WaitForSeq drives a YieldGate.
#include <atomic>
#include <cstdint>

#include "collectives/shm/wait.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::shm {
namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

WaitPolicy Policy(int slow_stages_to_close = 3) {
  WaitPolicy p;
  p.slow_yield = absl::Microseconds(250);
  p.slow_stages_to_close = slow_stages_to_close;
  p.yield_backoff_min = absl::Milliseconds(20);
  p.yield_backoff_max = absl::Seconds(1);
  return p;
}

TEST(YieldGateTest, FastYieldsKeepTheGateOpen) {
  const YieldGate g = NextYieldGate(YieldGate{}, 5 * kMs, 30 * kUs, Policy());
  EXPECT_TRUE(YieldGateOpen(g, 5 * kMs));
  EXPECT_EQ(g.backoff_ns, 0);
}

// A hog in our own scheduling group makes every stage slow; one slow stage
// (a preemption by another group) does not close the gate.
TEST(YieldGateTest, SlowStagesInARowCloseTheGateForTheMinimumBackoff) {
  const int64_t now = 7 * kMs;
  YieldGate g = NextYieldGate(YieldGate{}, now, 1500 * kUs, Policy());  // a hog's slice
  g = NextYieldGate(g, now, 1500 * kUs, Policy());
  EXPECT_TRUE(YieldGateOpen(g, now));
  EXPECT_EQ(g.slow_streak, 2);
  g = NextYieldGate(g, now, 20 * kUs, Policy());  // a fast stage resets the streak
  EXPECT_EQ(g.slow_streak, 0);
  g = NextYieldGate(g, now, 1500 * kUs, Policy());
  g = NextYieldGate(g, now, 1500 * kUs, Policy());
  EXPECT_TRUE(YieldGateOpen(g, now));
  EXPECT_EQ(g.backoff_ns, 0);
  g = NextYieldGate(g, now, 1500 * kUs, Policy());
  EXPECT_EQ(g.backoff_ns, 20 * kMs);
  EXPECT_EQ(g.closed_until_ns, now + 20 * kMs);
  EXPECT_FALSE(YieldGateOpen(g, now));
  EXPECT_FALSE(YieldGateOpen(g, now + 20 * kMs - 1));
  EXPECT_TRUE(YieldGateOpen(g, now + 20 * kMs));
}

TEST(YieldGateTest, TheThresholdIsInclusive) {
  EXPECT_EQ(NextYieldGate(YieldGate{}, 0, 250 * kUs, Policy(1)).backoff_ns, 20 * kMs);
  EXPECT_EQ(NextYieldGate(YieldGate{}, 0, 250 * kUs - 1, Policy(1)).backoff_ns, 0);
}

// After a closure, one slow probe closes the gate again, for twice as long,
// up to the cap.
TEST(YieldGateTest, RepeatedSlowProbesDoubleTheBackoffUpToTheCap) {
  YieldGate g;
  int64_t now = 0;
  g = NextYieldGate(g, now, 2 * kMs, Policy());
  g = NextYieldGate(g, now, 2 * kMs, Policy());
  const int64_t expected[] = {20, 40, 80, 160, 320, 640, 1000, 1000};
  for (int64_t ms : expected) {
    g = NextYieldGate(g, now, 2 * kMs, Policy());
    EXPECT_EQ(g.backoff_ns, ms * kMs);
    EXPECT_EQ(g.closed_until_ns, now + ms * kMs);
    now = g.closed_until_ns;  // the next probe runs when the gate reopens
  }
}

// Once the hog is gone the remembered back-off decays: halves per fast
// stage, to 0 below the minimum, so a later hog starts at the minimum again.
TEST(YieldGateTest, FastStagesDecayTheBackoff) {
  const WaitPolicy p = Policy(1);
  YieldGate g{10 * kMs, 160 * kMs};
  g = NextYieldGate(g, 11 * kMs, 10 * kUs, p);
  EXPECT_EQ(g.backoff_ns, 80 * kMs);
  EXPECT_TRUE(YieldGateOpen(g, 11 * kMs));
  g = NextYieldGate(g, 12 * kMs, 10 * kUs, p);
  EXPECT_EQ(g.backoff_ns, 40 * kMs);
  g = NextYieldGate(g, 12 * kMs, 10 * kUs, p);
  EXPECT_EQ(g.backoff_ns, 20 * kMs);
  g = NextYieldGate(g, 12 * kMs, 10 * kUs, p);
  EXPECT_EQ(g.backoff_ns, 0);
  g = NextYieldGate(g, 13 * kMs, 3 * kMs, p);
  EXPECT_EQ(g.backoff_ns, 20 * kMs);
  // After a decay to 80 ms a slow probe doubles from there, not from 20.
  g = NextYieldGate(YieldGate{0, 80 * kMs}, 0, 3 * kMs, p);
  EXPECT_EQ(g.backoff_ns, 160 * kMs);
}

// WaitForSeq: with every yield counted slow (threshold 0) and one slow stage
// enough, the first yield closes the gate; a closed gate skips the stage and
// is left alone.
TEST(YieldGateTest, WaitForSeqClosesTheGateOnASlowYield) {
  std::atomic<uint32_t> word{0}, waiters{0};
  WaitPolicy p = Policy(1);
  p.spin_iters = 0;
  p.yield_iters = 64;
  p.slow_yield = absl::ZeroDuration();
  p.futex_slice = absl::Milliseconds(1);
  YieldGate gate;
  const int64_t before = SteadyNanos();
  absl::Status s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Milliseconds(5), p, &gate,
                              [] { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(gate.backoff_ns, 20 * kMs);
  EXPECT_GE(gate.closed_until_ns, before + 20 * kMs);
  EXPECT_FALSE(YieldGateOpen(gate, SteadyNanos()));
  const YieldGate closed = gate;
  s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Milliseconds(5), p, &gate,
                 [] { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(gate.closed_until_ns, closed.closed_until_ns);
  EXPECT_EQ(gate.backoff_ns, closed.backoff_ns);
}

// Fast yields (threshold an hour) keep the gate open and decay the back-off;
// adaptive_yield = false never touches the gate.
TEST(YieldGateTest, WaitForSeqDecaysOnFastYieldsAndPlainYieldsIgnoreTheGate) {
  std::atomic<uint32_t> word{0}, waiters{0};
  WaitPolicy p = Policy();
  p.spin_iters = 0;
  p.yield_iters = 8;
  p.slow_yield = absl::Hours(1);
  p.futex_slice = absl::Milliseconds(1);
  YieldGate gate{0, 80 * kMs};
  absl::Status s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Milliseconds(5), p, &gate,
                              [] { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(gate.backoff_ns, 40 * kMs);
  EXPECT_TRUE(YieldGateOpen(gate, SteadyNanos()));

  p.slow_yield = absl::ZeroDuration();
  p.adaptive_yield = false;
  s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Milliseconds(5), p, &gate,
                 [] { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(gate.backoff_ns, 40 * kMs);
  EXPECT_TRUE(YieldGateOpen(gate, SteadyNanos()));

  // Reached before any yield: no information, no change.
  word.store(1);
  p.adaptive_yield = true;
  s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Seconds(5), p, &gate,
                 [] { return absl::OkStatus(); });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(gate.backoff_ns, 40 * kMs);
}

}  // namespace
}  // namespace tpudist::collectives::shm
