// CoordinationState without RPCs: KV semantics, blocking waits, barrier
// rounds and heartbeat staleness with injected clocks.
#include "tpu_runtime/coordination/coordination_state.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(CoordinationStateTest, ValidateSender) {
  CoordinationState state("job-a", 2, absl::Seconds(1));
  EXPECT_TRUE(state.ValidateSender("job-a", 1).ok());
  absl::Status wrong = state.ValidateSender("job-b", 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong));
  EXPECT_THAT(wrong.message(), HasSubstr("job-a"));
  EXPECT_THAT(wrong.message(), HasSubstr("job-b"));
  EXPECT_TRUE(absl::IsInvalidArgument(state.ValidateSender("job-a", 2)));
  EXPECT_TRUE(absl::IsInvalidArgument(state.ValidateSender("job-a", -1)));
}

TEST(CoordinationStateTest, SetGetOverwrite) {
  CoordinationState state("j", 1, absl::Seconds(1));
  ASSERT_TRUE(state.Set(0, "k", "v1", false).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(state.Set(0, "k", "v2", false)));
  EXPECT_EQ(*state.TryGet("k"), "v1");
  ASSERT_TRUE(state.Set(0, "k", "v2", true).ok());
  EXPECT_EQ(*state.Get(0, "k", Soon()), "v2");
  EXPECT_TRUE(absl::IsNotFound(state.TryGet("absent").status()));
  // Binary values survive.
  const std::string bin("a\0b\xff", 4);
  ASSERT_TRUE(state.Set(0, "bin", bin, true).ok());
  EXPECT_EQ(*state.TryGet("bin"), bin);
}

TEST(CoordinationStateTest, AddDecimalSemantics) {
  CoordinationState state("j", 1, absl::Seconds(1));
  EXPECT_EQ(*state.Add("n", 5), 5);
  EXPECT_EQ(*state.Add("n", -7), -2);
  EXPECT_EQ(*state.TryGet("n"), "-2");
  ASSERT_TRUE(state.Set(0, "s", "12", true).ok());
  EXPECT_EQ(*state.Add("s", 30), 42);
  ASSERT_TRUE(state.Set(0, "bad", "x1", true).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(state.Add("bad", 1).status()));
  ASSERT_TRUE(state.Set(0, "big", "9223372036854775807", true).ok());
  EXPECT_TRUE(absl::IsOutOfRange(state.Add("big", 1).status()));
}

TEST(CoordinationStateTest, CompareSetFollowsTcpStore) {
  CoordinationState state("j", 1, absl::Seconds(1));
  // Absent + non-empty expected: nothing stored, expected returned.
  EXPECT_EQ(state.CompareSet("k", "old", "new"), "old");
  EXPECT_FALSE(state.TryGet("k").ok());
  // Absent + empty expected: stored.
  EXPECT_EQ(state.CompareSet("k", "", "a"), "a");
  // Mismatch: unchanged, current returned.
  EXPECT_EQ(state.CompareSet("k", "zzz", "b"), "a");
  // Match: swapped.
  EXPECT_EQ(state.CompareSet("k", "a", "b"), "b");
  EXPECT_EQ(*state.TryGet("k"), "b");
}

TEST(CoordinationStateTest, DeleteCheckNumKeys) {
  CoordinationState state("j", 1, absl::Seconds(1));
  for (const char* k : {"p/a", "p/b", "q/c"}) {
    ASSERT_TRUE(state.Set(0, k, "1", true).ok());
  }
  EXPECT_EQ(state.NumKeys(""), 3);
  EXPECT_EQ(state.NumKeys("p/"), 2);
  EXPECT_TRUE(state.Check({"p/a", "q/c"}));
  EXPECT_FALSE(state.Check({"p/a", "nope"}));
  EXPECT_TRUE(state.Delete("p/a"));
  EXPECT_FALSE(state.Delete("p/a"));
  EXPECT_EQ(state.NumKeys("p/"), 1);
}

TEST(CoordinationStateTest, BlockingGetWakesOnSetAndTimesOut) {
  CoordinationState state("j", 2, absl::Seconds(1));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(state.Set(1, "late", "x", true).ok());
  });
  EXPECT_EQ(*state.Get(0, "late", Soon()), "x");
  setter.join();
  const absl::Time start = absl::Now();
  auto missing = state.Get(0, "never", absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("never"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
}

TEST(CoordinationStateTest, HeartbeatStalenessFailsJob) {
  CoordinationState state("j", 3, absl::Seconds(1));
  const absl::Time t0 = absl::Now();
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(state.RegisterTask(t, 7, t0).ok());
  EXPECT_TRUE(state.CheckHeartbeats(t0 + absl::Milliseconds(900)).empty());
  ASSERT_TRUE(state.Heartbeat(0, 7, t0 + absl::Milliseconds(800)).ok());
  ASSERT_TRUE(state.Heartbeat(2, 7, t0 + absl::Milliseconds(800)).ok());
  EXPECT_TRUE(absl::IsAborted(state.Heartbeat(2, 8, t0)));  // wrong incarnation
  EXPECT_THAT(state.CheckHeartbeats(t0 + absl::Milliseconds(1500)),
              ::testing::ElementsAre(1));
  EXPECT_EQ(state.task_state(1), TaskState::kError);
  EXPECT_EQ(state.JobErrorTask(), 1);
  EXPECT_TRUE(absl::IsUnavailable(state.JobError()));
  EXPECT_THAT(state.JobError().message(), HasSubstr("task 1"));
  // Blocking calls of the others now fail at once with that error.
  auto get = state.Get(0, "k", Soon());
  EXPECT_THAT(get.status().message(), HasSubstr("task 1"));
  EXPECT_THAT(state.PollForError(Soon()).message(), HasSubstr("task 1"));
  EXPECT_THAT(state.Barrier(0, "b", {}, absl::Seconds(5), absl::Now(), Soon())
                  .message(),
              HasSubstr("task 1"));
}

TEST(CoordinationStateTest, RestartWithNewIncarnationFailsJob) {
  CoordinationState state("j", 2, absl::Seconds(1));
  ASSERT_TRUE(state.RegisterTask(0, 1, absl::Now()).ok());
  ASSERT_TRUE(state.RegisterTask(0, 1, absl::Now()).ok());  // retry is fine
  EXPECT_TRUE(absl::IsAborted(state.RegisterTask(0, 2, absl::Now())));
  EXPECT_THAT(state.JobError().message(), HasSubstr("restarted"));
}

TEST(CoordinationStateTest, PollForErrorReturnsOkAtDeadline) {
  CoordinationState state("j", 2, absl::Seconds(1));
  EXPECT_TRUE(state.PollForError(absl::Now() + absl::Milliseconds(50)).ok());
  std::thread reporter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    state.ReportError(1, absl::InternalError("boom"));
  });
  absl::Status error = state.PollForError(Soon());
  reporter.join();
  EXPECT_TRUE(absl::IsInternal(error));
  EXPECT_THAT(error.message(), HasSubstr("boom"));
  EXPECT_THAT(error.message(), HasSubstr("task 1"));
}

TEST(CoordinationStateTest, BarrierRoundsAndReuse) {
  constexpr int kTasks = 3;
  CoordinationState state("j", kTasks, absl::Seconds(10));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(kTasks);
    for (int t = 0; t < kTasks; ++t) {
      threads.emplace_back([&, t] {
        results[t] =
            state.Barrier(t, "b", {}, absl::Seconds(5), absl::Now(), Soon());
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kTasks; ++t) EXPECT_TRUE(results[t].ok()) << results[t];
  }
}

TEST(CoordinationStateTest, BarrierTimeoutNamesMissingAndLateArrivalSeesIt) {
  CoordinationState state("j", 4, absl::Seconds(10));
  std::vector<int> subset = {0, 2, 3};
  std::thread t2([&] {
    EXPECT_TRUE(absl::IsDeadlineExceeded(state.Barrier(
        2, "s", subset, absl::Milliseconds(200), absl::Now(), Soon())));
  });
  absl::Status s0 = state.Barrier(0, "s", subset, absl::Milliseconds(200),
                                  absl::Now(), Soon());
  t2.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s0));
  EXPECT_THAT(s0.message(), HasSubstr("missing tasks {3}"));
  // Task 3 arrives late: it gets the round's error instead of a new round.
  absl::Status s3 = state.Barrier(3, "s", subset, absl::Milliseconds(200),
                                  absl::Now(), Soon());
  EXPECT_THAT(s3.message(), HasSubstr("missing tasks {3}"));
  // Mismatched task sets and outsiders are refused.
  EXPECT_TRUE(absl::IsInvalidArgument(
      state.Barrier(1, "s", subset, absl::Seconds(1), absl::Now(), Soon())));
}

TEST(CoordinationStateTest, BarrierFailsFastWhenParticipantLeft) {
  CoordinationState state("j", 2, absl::Seconds(10));
  ASSERT_TRUE(state.RegisterTask(1, 1, absl::Now()).ok());
  ASSERT_TRUE(state.ShutdownTask(1).ok());
  const absl::Time start = absl::Now();
  absl::Status s =
      state.Barrier(0, "b", {}, absl::Seconds(5), absl::Now(), Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(CoordinationStateTest, ShutdownWakesWaiters) {
  CoordinationState state("j", 2, absl::Seconds(10));
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    state.Shutdown();
  });
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsCancelled(state.Get(0, "k", Soon()).status()));
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsCancelled(
      state.Barrier(0, "b", {}, absl::Seconds(5), absl::Now(), Soon())));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
