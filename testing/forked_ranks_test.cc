#include "testing/forked_ranks.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::test_support {
namespace {

TEST(ForkedRanksTest, ExitCodesAndReportsComeBackPerRank) {
  const pid_t parent = getpid();
  const std::vector<ChildResult> results =
      RunForkedRanks({0, 2, 5}, [&](int rank, std::string* report) {
        *report = "rank " + std::to_string(rank) + (getpid() == parent ? " parent" : " child");
        return rank * 10;
      });
  ASSERT_EQ(results.size(), 3u);
  const int want_rank[] = {0, 2, 5};
  for (int i = 0; i < 3; ++i) {
    const ChildResult& r = results[i];
    EXPECT_EQ(r.rank, want_rank[i]);
    EXPECT_TRUE(r.exited);
    EXPECT_EQ(r.exit_code, want_rank[i] * 10);
    EXPECT_EQ(ExitStatusCode(r), want_rank[i] * 10);
    EXPECT_EQ(r.report, "rank " + std::to_string(want_rank[i]) + " child");
    EXPECT_NE(r.pid, parent);
  }
}

TEST(ForkedRanksTest, ExceptionAndSignalAreReported) {
  const std::vector<ChildResult> results = RunForkedRanks(2, [](int rank, std::string*) -> int {
    if (rank == 0) throw std::runtime_error("child failure");
    raise(SIGKILL);
    return 0;
  });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].exited);
  EXPECT_EQ(results[0].exit_code, 98);
  EXPECT_FALSE(results[1].exited);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_FALSE(results[1].killed_at_deadline);
  EXPECT_EQ(ExitStatusCode(results[1]), 128 + SIGKILL);
}

// A child that never ends is killed at the deadline and reaped: the call
// returns in about the deadline and the process is gone.
TEST(ForkedRanksTest, StragglersAreKilledAtTheDeadline) {
  const absl::Time start = absl::Now();
  ForkOptions options;
  options.deadline = absl::Milliseconds(300);
  const std::vector<ChildResult> results = RunForkedRanks(
      2,
      [](int rank, std::string*) {
        if (rank == 1) {
          for (;;) pause();
        }
        return 0;
      },
      options);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].exited);
  EXPECT_EQ(results[0].exit_code, 0);
  EXPECT_FALSE(results[0].killed_at_deadline);
  EXPECT_TRUE(results[1].killed_at_deadline);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(ExitStatusCode(results[1]), -1);
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(30)) << "bounded by the deadline, not by the child";
  EXPECT_NE(kill(results[1].pid, 0), 0) << "the killed child was reaped";
}

TEST(ForkedRanksTest, OnStartedSeesEveryPidAndMayKillOne) {
  std::vector<pid_t> seen;
  ForkOptions options;
  options.on_started = [&](const std::vector<pid_t>& pids) {
    seen = pids;
    kill(pids[0], SIGTERM);
  };
  const std::vector<ChildResult> results = RunForkedRanks(
      2,
      [](int rank, std::string*) {
        if (rank == 0) {
          for (;;) pause();
        }
        return 7;
      },
      options);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], results[0].pid);
  EXPECT_EQ(seen[1], results[1].pid);
  EXPECT_EQ(results[0].signal, SIGTERM);
  EXPECT_EQ(results[1].exit_code, 7);
}

// ForkRanks / WaitForRanks (the bench/ programs' way): the caller goes on as
// rank 0; non-zero exits and stragglers are named, stragglers killed.
TEST(ForkedRanksTest, ForkRanksReportsExitCodesAndKillsHangs) {
  ForkedRanks ok = ForkRanks(3);
  if (ok.rank != 0) _exit(0);
  EXPECT_EQ(ok.children.size(), 2u);
  EXPECT_TRUE(WaitForRanks(ok, absl::Seconds(10)).ok());

  ForkedRanks bad = ForkRanks(3);
  if (bad.rank == 1) _exit(3);
  if (bad.rank == 2) {
    sleep(30);  // killed by the deadline below
    _exit(0);
  }
  const absl::Status s = WaitForRanks(bad, absl::Milliseconds(300));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("rank 1 exited 3"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("rank 2 still running"));
}

}  // namespace
}  // namespace tpudist::test_support
