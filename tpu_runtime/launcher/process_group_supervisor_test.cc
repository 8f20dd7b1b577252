// Supervisor tests with small /bin/sh ranks. Every job has a timeout, so a
// supervisor bug makes a test fail, not hang.
#include "tpu_runtime/launcher/process_group_supervisor.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/launcher/line_prefixer.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An in-memory file for captured output.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("launcher_test", MFD_CLOEXEC)) {}
  ~MemFile() { close(fd_); }
  int fd() const { return fd_; }
  std::string Contents() const {
    std::string out;
    char buf[4096];
    for (off_t off = 0;;) {
      ssize_t n = pread(fd_, buf, sizeof(buf), off);
      if (n <= 0) break;
      out.append(buf, n);
      off += n;
    }
    return out;
  }

 private:
  int fd_;
};

struct JobResult {
  absl::StatusOr<ExitReport> report;
  std::string out, err;
  absl::Duration elapsed;
  std::vector<int> planned_restarts;  // restart_count of each planner call
};

// Runs `world` ranks, rank r running `sh -c script(r)` with RANK=r set.
JobResult RunJob(int world, const std::function<std::string(int)>& script,
                 SupervisorOptions options = {}) {
  MemFile out, err;
  options.stdout_fd = out.fd();
  options.stderr_fd = err.fd();
  if (options.timeout == absl::InfiniteDuration()) options.timeout = absl::Seconds(60);
  JobResult result;
  LaunchPlanner planner = [&](int restart) -> absl::StatusOr<std::vector<ProcessSpec>> {
    result.planned_restarts.push_back(restart);
    std::vector<ProcessSpec> specs;
    for (int r = 0; r < world; ++r) {
      specs.push_back(ProcessSpec{r,
                                  absl::StrCat("rank ", r),
                                  RankLabel(r, world),
                                  {"/bin/sh", "-c", script(r)},
                                  {{"RANK", absl::StrCat(r)}}});
    }
    return specs;
  };
  absl::Time start = absl::Now();
  result.report = SuperviseProcessGroup(planner, options);
  result.elapsed = absl::Now() - start;
  result.out = out.Contents();
  result.err = err.Contents();
  return result;
}

TEST(SupervisorTest, AllRanksSucceedAndOutputIsPrefixed) {
  JobResult job = RunJob(4, [](int r) { return "echo hello $RANK; echo oops $RANK >&2"; });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_TRUE(job.report->success());
  EXPECT_EQ(job.report->ExitCode(), 0);
  EXPECT_EQ(job.report->exits.size(), 4u);
  EXPECT_THAT(job.report->Summary(), HasSubstr("all 4 ranks succeeded"));
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(job.out, HasSubstr(absl::StrCat("[rank ", r, "] hello ", r, "\n")));
    EXPECT_THAT(job.err, HasSubstr(absl::StrCat("[rank ", r, "] oops ", r, "\n")));
  }
  // Nothing but whole prefixed lines.
  std::vector<std::string> lines = absl::StrSplit(job.out, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 4u);
  for (const std::string& line : lines) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

TEST(SupervisorTest, PartialLinesAreJoinedAndFlushedAtExit) {
  JobResult job =
      RunJob(2, [](int r) { return "printf 'abc'; sleep 0.2; printf 'def\\n'; printf 'tail'"; });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(job.out, HasSubstr(absl::StrCat("[rank ", r, "] abcdef\n")));
    EXPECT_THAT(job.out, HasSubstr(absl::StrCat("[rank ", r, "] tail\n")));
  }
}

TEST(SupervisorTest, FailingRankIsNamedAndOthersAreStoppedQuickly) {
  JobResult job = RunJob(
      4, [](int r) { return r == 2 ? std::string("sleep 0.3; exit 3") : std::string("sleep 30"); });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  const ExitReport& report = *job.report;
  EXPECT_EQ(report.outcome, ExitReport::Outcome::kRankFailed);
  ASSERT_TRUE(report.first_failure.has_value());
  EXPECT_EQ(report.first_failure->rank, 2);
  EXPECT_EQ(report.first_failure->status, ExitStatus::Exited(3));
  EXPECT_EQ(report.ExitCode(), 3);
  EXPECT_EQ(report.Summary(), "rank 2 failed: exit status 3");
  for (int r : {0, 1, 3}) EXPECT_EQ(report.exits[r], ExitStatus::Signaled(SIGTERM)) << r;
  EXPECT_LT(job.elapsed, absl::Seconds(4));  // SIGTERM, not the 30 s sleep
  EXPECT_THAT(job.err, HasSubstr("rank 2 failed: exit status 3"));
}

TEST(SupervisorTest, RankKilledBySignalIsReportedBySignalName) {
  JobResult job = RunJob(3, [](int r) {
    return r == 1 ? std::string("sleep 0.2; kill -KILL $$") : std::string("sleep 30");
  });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  ASSERT_TRUE(job.report->first_failure.has_value());
  EXPECT_EQ(job.report->first_failure->rank, 1);
  EXPECT_EQ(job.report->first_failure->status, ExitStatus::Signaled(SIGKILL));
  EXPECT_THAT(job.report->Summary(), HasSubstr("rank 1 failed: killed by signal SIGKILL"));
  EXPECT_EQ(job.report->ExitCode(), 128 + SIGKILL);
  EXPECT_LT(job.elapsed, absl::Seconds(4));
}

TEST(SupervisorTest, RankIgnoringSigtermIsKilledAfterGracePeriod) {
  SupervisorOptions options;
  options.grace_period = absl::Milliseconds(700);
  JobResult job = RunJob(
      2,
      [](int r) {
        return r == 0 ? std::string("sleep 0.5; exit 1") : std::string("trap '' TERM; sleep 30");
      },
      options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->first_failure->rank, 0);
  EXPECT_EQ(job.report->exits[1], ExitStatus::Signaled(SIGKILL));
  EXPECT_GE(job.elapsed, absl::Milliseconds(500 + 700));  // waited the grace period
  EXPECT_LT(job.elapsed, absl::Seconds(5));
  EXPECT_THAT(job.err, HasSubstr("grace period over"));
}

TEST(SupervisorTest, RestartsUntilSuccessWithinMaxRestarts) {
  const char* kScript =
      "echo attempt $TORCHELASTIC_RESTART_COUNT $TPU_DIST_RESTART_COUNT "
      "max $TORCHELASTIC_MAX_RESTARTS; "
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ $RANK = 1 ]; then exit 5; fi; sleep 0.3";
  SupervisorOptions options;
  options.max_restarts = 1;
  JobResult job = RunJob(
      2, [&](int) { return kScript; }, options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_TRUE(job.report->success()) << job.report->Summary();
  EXPECT_EQ(job.report->restarts, 1);
  EXPECT_EQ(job.planned_restarts, (std::vector<int>{0, 1}));
  EXPECT_THAT(job.out, HasSubstr("[rank 1] attempt 0 0 max 1"));
  EXPECT_THAT(job.out, HasSubstr("[rank 1] attempt 1 1 max 1"));
  EXPECT_THAT(job.err, HasSubstr("restarting all ranks (restart 1 of 1)"));
}

TEST(SupervisorTest, GivesUpAfterMaxRestarts) {
  const char* kScript =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ $RANK = 1 ]; then exit 5; fi";
  JobResult job = RunJob(2, [&](int) { return kScript; });  // max_restarts 0
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->outcome, ExitReport::Outcome::kRankFailed);
  EXPECT_EQ(job.report->first_failure->rank, 1);
  EXPECT_EQ(job.report->ExitCode(), 5);
  EXPECT_EQ(job.planned_restarts, (std::vector<int>{0}));

  SupervisorOptions options;
  options.max_restarts = 2;
  JobResult always = RunJob(
      2, [](int r) { return r == 0 ? "exit 9" : "true"; }, options);
  ASSERT_TRUE(always.report.ok()) << always.report.status();
  EXPECT_EQ(always.report->outcome, ExitReport::Outcome::kRankFailed);
  EXPECT_EQ(always.report->restarts, 2);
  EXPECT_EQ(always.planned_restarts, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(always.report->Summary(), "rank 0 failed: exit status 9 (after 2 restarts)");
}

TEST(SupervisorTest, JobTimeoutStopsAllRanks) {
  SupervisorOptions options;
  options.timeout = absl::Milliseconds(500);
  JobResult job = RunJob(
      3, [](int) { return "sleep 30"; }, options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->outcome, ExitReport::Outcome::kTimedOut);
  EXPECT_EQ(job.report->ExitCode(), 124);
  EXPECT_GE(job.elapsed, absl::Milliseconds(500));
  EXPECT_LT(job.elapsed, absl::Seconds(4));
}

TEST(SupervisorTest, MissingBinaryIsAnErrorNamingIt) {
  LaunchPlanner planner = [](int) -> absl::StatusOr<std::vector<ProcessSpec>> {
    return std::vector<ProcessSpec>{{0, "rank 0", "[rank 0] ", {"/bin/sh", "-c", "sleep 30"}, {}},
                                    {1, "rank 1", "[rank 1] ", {"/nonexistent/tpu_binary"}, {}}};
  };
  SupervisorOptions options;
  options.timeout = absl::Seconds(20);
  absl::Time start = absl::Now();
  absl::StatusOr<ExitReport> report = SuperviseProcessGroup(planner, options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("/nonexistent/tpu_binary"));
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("rank 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // rank 0 was SIGKILLed
}

TEST(SupervisorTest, SigtermToLauncherIsForwardedToAllRanks) {
  // Block the watched signals before any thread exists, so the process-
  // directed SIGTERM below can only land in the supervisor's signalfd.
  sigset_t set, old;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  char dir_template[] = "/tmp/launcher_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const int kWorld = 3;
  std::thread killer([&] {
    // Wait (bounded) until every rank has installed its trap.
    absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (absl::Now() < give_up) {
      int ready = 0;
      for (int r = 0; r < kWorld; ++r) {
        ready += access(absl::StrCat(dir, "/ready", r).c_str(), F_OK) == 0;
      }
      if (ready == kWorld) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    kill(getpid(), SIGTERM);
  });
  JobResult job = RunJob(kWorld, [&](int r) {
    return absl::StrCat("trap 'echo got-term; exit 7' TERM; touch ", dir, "/ready$RANK; ",
                        "sleep 30 & wait");
  });
  killer.join();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->outcome, ExitReport::Outcome::kInterrupted);
  EXPECT_EQ(job.report->signal, SIGTERM);
  EXPECT_EQ(job.report->ExitCode(), 128 + SIGTERM);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(job.out, HasSubstr(absl::StrCat("[rank ", r, "] got-term")));
    EXPECT_EQ(job.report->exits[r], ExitStatus::Exited(7));
  }
  EXPECT_LT(job.elapsed, absl::Seconds(25));
  for (int r = 0; r < kWorld; ++r) unlink(absl::StrCat(dir, "/ready", r).c_str());
  rmdir(dir.c_str());
}

TEST(SupervisorTest, SecondSigintEscalatesToSigkill) {
  sigset_t set, old;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  char dir_template[] = "/tmp/launcher_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::thread interrupter([&] {
    absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (absl::Now() < give_up && (access((dir + "/ready0").c_str(), F_OK) != 0 ||
                                     access((dir + "/ready1").c_str(), F_OK) != 0)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    kill(getpid(), SIGINT);  // ignored by the ranks
    absl::SleepFor(absl::Milliseconds(300));
    kill(getpid(), SIGINT);  // "I mean it": SIGKILL now, not after the grace period
  });
  SupervisorOptions options;
  options.grace_period = absl::Seconds(30);
  JobResult job = RunJob(
      2, [&](int) { return absl::StrCat("trap '' INT; touch ", dir, "/ready$RANK; sleep 30"); },
      options);
  interrupter.join();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->outcome, ExitReport::Outcome::kInterrupted);
  EXPECT_EQ(job.report->signal, SIGINT);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(job.report->exits[r], ExitStatus::Signaled(SIGKILL));
  EXPECT_LT(job.elapsed, absl::Seconds(15));  // well before the 30 s grace period
  EXPECT_THAT(job.err, HasSubstr("received SIGINT again, sending SIGKILL"));
  for (int r = 0; r < 2; ++r) unlink(absl::StrCat(dir, "/ready", r).c_str());
  rmdir(dir.c_str());
}

// Followers exit 75 (a peer failed) before the rank that failed for a
// reason of its own: that rank is the root cause, named with its followers.
TEST(SupervisorTest, RootCauseIsTheFirstRankThatFailedOnItsOwn) {
  JobResult job = RunJob(4, [](int r) -> std::string {
    if (r == 2) return "sleep 0.5; echo 'disk full' >&2; exit 3";
    return "sleep 0.1; exit 75";
  });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  ASSERT_TRUE(job.report->first_failure.has_value());
  EXPECT_EQ(job.report->first_failure->rank, 2);
  EXPECT_FALSE(job.report->first_failure->peer_failure);
  EXPECT_EQ(job.report->ExitCode(), 3);
  EXPECT_THAT(job.report->first_failure->followed_by, ::testing::ElementsAre(0, 1, 3));
  EXPECT_THAT(job.report->Summary(),
              HasSubstr("rank 2 failed: exit status 3; ranks 0, 1, 3 stopped because of it"));
  EXPECT_THAT(job.err, HasSubstr("rank 2 failed: exit status 3; ranks 0, 1, 3 stopped"));
}

// Everyone who exits says "a peer failed" and one rank never exits (hung):
// after root_cause_wait the job stops, naming the rank still running.
TEST(SupervisorTest, OnlyFollowersExitedNamesTheRanksStillRunning) {
  SupervisorOptions options;
  options.root_cause_wait = absl::Milliseconds(500);
  options.grace_period = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  JobResult job = RunJob(
      3,
      [](int r) -> std::string {
        if (r == 1) return "trap '' TERM; sleep 30";  // hung: ignores SIGTERM
        return "exit 75";
      },
      options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  ASSERT_TRUE(job.report->first_failure.has_value());
  EXPECT_TRUE(job.report->first_failure->peer_failure);
  EXPECT_EQ(job.report->ExitCode(), 75);
  EXPECT_THAT(job.report->first_failure->still_running, ::testing::ElementsAre(1));
  EXPECT_THAT(job.report->Summary(), HasSubstr("still running when stopped (hung?): ranks 1"));
  EXPECT_THAT(job.err, HasSubstr("no rank failed for a reason of its own within 500ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A rank killed by a signal is a root cause even if followers exited first.
TEST(SupervisorTest, SignalledRankIsARootCause) {
  JobResult job = RunJob(2, [](int r) -> std::string {
    return r == 0 ? "exit 75" : "sleep 0.3; kill -9 $$";
  });
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  ASSERT_TRUE(job.report->first_failure.has_value());
  EXPECT_EQ(job.report->first_failure->rank, 1);
  EXPECT_EQ(job.report->ExitCode(), 128 + SIGKILL);
}

// One tpurun per host: the rank that failed is on another host, and every
// rank here exits 75 ("a peer failed") well before root_cause_wait runs out.
// That is a failure (exit 75), never "all ranks succeeded", and the report
// says where to look and what the rank was told.
TEST(SupervisorTest, AllRanksExitingBecauseAPeerFailedIsAFailure) {
  SupervisorOptions options;
  options.max_restarts = 0;
  options.peer_failure_hint = "the rank that failed is on another host";
  JobResult job = RunJob(4, [](int r) -> std::string {
    return absl::StrCat("echo 'rank ", r, " told: task 5 lost its connection' >&2; exit 75");
  }, options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  const ExitReport& report = *job.report;
  EXPECT_FALSE(report.success());
  EXPECT_EQ(report.outcome, ExitReport::Outcome::kRankFailed);
  EXPECT_EQ(report.ExitCode(), 75);
  ASSERT_TRUE(report.first_failure.has_value());
  EXPECT_TRUE(report.first_failure->peer_failure);
  EXPECT_THAT(report.first_failure->followed_by, ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(report.Summary(), Not(HasSubstr("succeeded")));
  EXPECT_THAT(report.Summary(), HasSubstr("stopped because another rank failed (exit 75)"));
  EXPECT_THAT(report.Summary(), HasSubstr("; the rank that failed is on another host"));
  EXPECT_THAT(report.Summary(),
              ::testing::MatchesRegex(".*its last stderr line: rank [0-3] told: task 5 lost its "
                                      "connection$"));
  EXPECT_THAT(job.err, HasSubstr("ranks 0, 1, 2, 3 stopped because another rank failed (exit 75); "
                                 "none of this tpurun's ranks failed for a reason of its own; the "
                                 "rank that failed is on another host"));
  // Reported as soon as the ranks are gone, not after root_cause_wait.
  EXPECT_LT(job.elapsed, options.root_cause_wait);
}

// The same with restarts allowed: a failure restarts, as any other.
TEST(SupervisorTest, AllRanksExitingBecauseAPeerFailedIsRestarted) {
  SupervisorOptions options;
  options.max_restarts = 1;
  JobResult job = RunJob(2, [](int) -> std::string {
    return "[ \"$TPU_DIST_RESTART_COUNT\" = 1 ] || exit 75";
  }, options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_TRUE(job.report->success());
  EXPECT_EQ(job.report->restarts, 1);
  EXPECT_THAT(job.planned_restarts, ::testing::ElementsAre(0, 1));
}

// tpurun's flight-recorder hook: before the stop, the ranks still running
// that ranks_to_wait_for names get before_stop_signal and a bounded wait.
TEST(SupervisorTest, RanksAskedBeforeTheStopGetTheSignalAndTheWait) {
  const std::string marker = absl::StrCat(::testing::TempDir(), "/sup_dump_", getpid());
  unlink(marker.c_str());
  SupervisorOptions options;
  options.before_stop_signal = SIGUSR1;
  options.before_stop_wait = absl::Seconds(5);
  std::vector<std::vector<int>> asked;
  options.ranks_to_wait_for = [&](const std::vector<int>& running) {
    asked.push_back(running);
    return access(marker.c_str(), F_OK) == 0 ? std::vector<int>{} : running;
  };
  std::vector<int> hook_calls;
  options.after_failed_attempt = [&](int restart) { hook_calls.push_back(restart); };
  JobResult job = RunJob(
      2,
      [&](int r) {
        return r == 0 ? std::string("sleep 0.3; exit 3")
                      : absl::StrCat("trap 'echo dumped; touch ", marker,
                                     "; sleep 30' USR1; while :; do sleep 0.05; done");
      },
      options);
  unlink(marker.c_str());
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->first_failure->rank, 0);
  EXPECT_EQ(job.report->ExitCode(), 3);
  EXPECT_THAT(job.err, HasSubstr("waiting up to 5s for rank 1 to write flight-recorder dumps "
                                 "(sent SIGUSR1) before stopping them"));
  EXPECT_THAT(job.out, HasSubstr("[rank 1] dumped"));
  EXPECT_EQ(job.report->exits[1], ExitStatus::Signaled(SIGTERM));  // stopped once it dumped
  EXPECT_LT(job.elapsed, absl::Seconds(4));
  ASSERT_FALSE(asked.empty());
  EXPECT_THAT(asked[0], ::testing::ElementsAre(1));
  EXPECT_THAT(hook_calls, ::testing::ElementsAre(0));
}

TEST(SupervisorTest, ARankThatNeverAnswersIsStoppedAfterTheWait) {
  SupervisorOptions options;
  options.before_stop_signal = SIGUSR1;
  options.before_stop_wait = absl::Milliseconds(500);
  options.ranks_to_wait_for = [](const std::vector<int>& running) { return running; };
  JobResult job = RunJob(
      2, [](int r) { return r == 0 ? "sleep 0.2; exit 3" : "trap '' USR1; sleep 30"; }, options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  EXPECT_EQ(job.report->ExitCode(), 3);
  EXPECT_EQ(job.report->exits[1], ExitStatus::Signaled(SIGTERM));
  EXPECT_GE(job.elapsed, absl::Milliseconds(700));
  EXPECT_LT(job.elapsed, absl::Seconds(4));
}

// Losing a slice: ranks 2 and 3 SIGKILL themselves (a slice of 2 lost);
// ranks 0 and 1 are stopped by the supervisor's SIGTERM after
// failure_settle_time. Only 2 and 3 failed on their own (the second may die
// a little after the first), and describe_failed_ranks' lines are logged.
TEST(SupervisorTest, RanksThatFailedOnTheirOwnAreReportedAndDescribed) {
  SupervisorOptions options;
  options.failure_settle_time = absl::Milliseconds(500);
  std::vector<std::vector<int>> described;
  options.describe_failed_ranks = [&](const std::vector<int>& failed) {
    described.push_back(failed);
    return std::vector<std::string>{"slice 1 lost"};
  };
  JobResult job = RunJob(
      4, [](int r) { return r >= 2 ? std::string("sleep 0.3; kill -9 $$") : std::string("sleep 30"); },
      options);
  ASSERT_TRUE(job.report.ok()) << job.report.status();
  ASSERT_TRUE(job.report->first_failure.has_value());
  EXPECT_THAT(job.report->first_failure->failed_on_their_own, ::testing::ElementsAre(2, 3));
  EXPECT_THAT(described, ::testing::ElementsAre(::testing::ElementsAre(2, 3)));
  EXPECT_THAT(job.err, HasSubstr("tpurun: slice 1 lost\n"));
  EXPECT_EQ(job.report->exits[0], ExitStatus::Signaled(SIGTERM));
  EXPECT_LT(job.elapsed, absl::Seconds(4));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
