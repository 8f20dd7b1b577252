// Job and RunRankMain: exit codes and error lines of a rank's main() (OK, a
// startup failure of the rank's own, a c10::Error escaping its work, a peer's
// failure: 75, tpurun's "follower" code), and the job's groups aborted on a
// job error. Ranks that start a coordination runtime are forked processes
// (testing/forked_ranks.h): this process never starts gRPC, so forking stays
// safe. Job without coordination (a given store) runs ranks as threads.
#include "distributed/job.h"

#include <c10/util/Exception.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/rank_main.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/forked_ranks.h"
#include "testing/free_port.h"
#include "testing/rank_threads.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "tpu_runtime/exit_codes.h"

namespace tpudist::distributed {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace tr = ::tpudist::tpu_runtime;
namespace tt = ::tpudist::test_support;

// Runs RunRankMain(name, body, options) with this rank's launcher variables
// set (torchrun's: RANK, WORLD_SIZE, MASTER_ADDR/PORT); *report gets what it
// printed on stderr. For forked children only: it rewires fd 2.
int RankMainCapturingStderr(int rank, int world, int port,
                            const std::function<absl::Status(const tr::RankInfo&)>& body,
                            std::string* report, RankMainOptions options = {}) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("TPU_DIST_JOB_ID", absl::StrCat("job_test_", getppid(), "_", port).c_str(), 1);
  FILE* err = tmpfile();
  if (err == nullptr) return 90;
  const int saved = dup(2);
  dup2(fileno(err), 2);
  const int code = RunRankMain("job_test", body, options);
  fflush(stderr);
  dup2(saved, 2);
  rewind(err);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), err)) > 0) report->append(buf, n);
  fclose(err);
  return code;
}

RankMainOptions ErrorLine() {
  RankMainOptions o;
  o.failure_line = FailureLine::kError;
  return o;
}

tt::ForkOptions Deadline(absl::Duration d) {
  tt::ForkOptions o;
  o.deadline = d;
  return o;
}

JobOptions Options(absl::Duration timeout = absl::Seconds(30)) {
  JobOptions o;
  o.name = "job_test";
  o.group.group_name = "job_test";
  o.group.timeout = timeout;
  return o;
}

TEST(ExitCodeTest, TravelsWithTheStatusAndItsContext) {
  EXPECT_EQ(ExitCodeOf(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeOf(absl::InternalError("own")), 1);
  const absl::Status peer = WithExitCode(absl::UnavailableError("peer"), tr::kPeerFailureExitCode);
  EXPECT_EQ(ExitCodeOf(peer), 75);
  const absl::Status annotated = WithContext(peer, "rank 3: coordination");
  EXPECT_EQ(annotated.message(), "rank 3: coordination: peer");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ExitCodeOf(annotated), 75);
  EXPECT_EQ(WithoutExitCode(annotated).ToString(), "UNAVAILABLE: rank 3: coordination: peer");
  EXPECT_TRUE(WithContext(absl::OkStatus(), "x").ok());
}

TEST(UsageExitCodeTest, FirstFailedCheckIsExitTwo) {
  EXPECT_EQ(UsageExitCode("job_test", {absl::OkStatus(), absl::OkStatus()}), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(UsageExitCode("job_test", {absl::OkStatus(), absl::InvalidArgumentError("--a=x"),
                                       absl::InvalidArgumentError("--b=y")}),
            2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "job_test: usage error: --a=x\n");
}

// One rank, its coordination service and its world group: exit 0, no error line.
TEST(RunRankMainTest, OkIsExitZero) {
  const int port = tt::FreePort();
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(1, [&](int rank, std::string* report) {
    return RankMainCapturingStderr(rank, 1, port, [](const tr::RankInfo& info) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, Options());
      if (!job.ok()) return job.status();
      return (*job)->Run([&]() -> absl::Status {
        absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = (*job)->WorldGroup();
        if (!pg.ok()) return pg.status();
        std::vector<at::Tensor> t = {at::ones({4})};  // [4]
        (*pg)->allreduce(t)->wait();
        return absl::OkStatus();
      });
    }, report);
  }, Deadline(absl::Seconds(60)));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(tt::ExitStatusCode(r[0]), 0) << r[0].report;
  EXPECT_THAT(r[0].report, Not(HasSubstr("job_test:")));  // no error line
}

// A bad option of the rank's own before any rendezvous: exit 1, one line.
TEST(RunRankMainTest, InvalidArgumentAtStartIsExitOne) {
  const int port = tt::FreePort();
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(1, [&](int rank, std::string* report) {
    return RankMainCapturingStderr(rank, 1, port, [](const tr::RankInfo& info) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Job>> job =
          Job::Start(info, Options(absl::InfiniteDuration()));
      return job.status();
    }, report);
  }, Deadline(absl::Seconds(60)));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(tt::ExitStatusCode(r[0]), 1) << r[0].report;
  EXPECT_THAT(r[0].report, HasSubstr("job_test: rank 0 failed: INVALID_ARGUMENT: job timeout=inf"));
}

// Discovery that fails: exit 1 before any body runs.
TEST(RunRankMainTest, DiscoveryFailureIsExitOne) {
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(1, [&](int rank, std::string* report) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "two", 1);
    FILE* err = tmpfile();
    dup2(fileno(err), 2);
    bool ran = false;
    const int code = RunRankMain("job_test", [&](const tr::RankInfo&) {
      ran = true;
      return absl::OkStatus();
    });
    fflush(stderr);
    rewind(err);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), err)) > 0) report->append(buf, n);
    return ran ? 91 : code;
  }, Deadline(absl::Seconds(60)));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(tt::ExitStatusCode(r[0]), 1) << r[0].report;
  EXPECT_THAT(r[0].report, HasSubstr("job_test: discovery failed: INVALID_ARGUMENT: "));
  EXPECT_THAT(r[0].report, HasSubstr("WORLD_SIZE"));
}

// torch's checks throw c10::Error: inside Job::Run and escaping the body
// alike, the message without the C++ backtrace, exit 1.
TEST(RunRankMainTest, C10ErrorInTheBodyIsExitOneWithoutBacktrace) {
  const int port = tt::FreePort();
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(2, [&](int rank, std::string* report) {
    if (rank == 0) {  // inside the job (a world of one: its own port)
      return RankMainCapturingStderr(0, 1, port, [](const tr::RankInfo& info) -> absl::Status {
        absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, Options());
        if (!job.ok()) return job.status();
        return (*job)->Run([]() -> absl::Status {
          TORCH_CHECK(false, "shape mismatch in job");
          return absl::OkStatus();
        });
      }, report);
    }
    // Escaping the body, with the kError line: the rank goes in front.
    return RankMainCapturingStderr(0, 1, port, [](const tr::RankInfo&) -> absl::Status {
      TORCH_CHECK(false, "shape mismatch outside");
      return absl::OkStatus();
    }, report, ErrorLine());
  }, Deadline(absl::Seconds(60)));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(tt::ExitStatusCode(r[0]), 1) << r[0].report;
  EXPECT_THAT(r[0].report, HasSubstr("job_test: rank 0 failed: INTERNAL: shape mismatch in job"));
  EXPECT_EQ(tt::ExitStatusCode(r[1]), 1) << r[1].report;
  EXPECT_THAT(r[1].report, HasSubstr("job_test: error: INTERNAL: rank 0: shape mismatch outside"));
  for (const tt::ChildResult& c : r) {
    EXPECT_THAT(c.report, Not(HasSubstr("Exception raised from")));  // c10's backtrace header
    EXPECT_THAT(c.report, Not(HasSubstr("ExitCode")));                 // the payload stays unseen
  }
}

// Rank 1 fails on its own after the rendezvous while rank 0 waits for it in
// an all_reduce: the job error aborts rank 0's group at once (not after the
// 60 s timeout), rank 1 exits 1 and rank 0 exits 75, naming itself a follower.
TEST(RunRankMainTest, PeerFailureIsExit75AndAbortsTheWaitingCollective) {
  const int port = tt::FreePort();
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(2, [&](int rank, std::string* report) {
    return RankMainCapturingStderr(rank, 2, port, [&](const tr::RankInfo& info) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, Options(absl::Seconds(60)));
      if (!job.ok()) return job.status();
      return (*job)->Run([&]() -> absl::Status {
        absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = (*job)->WorldGroup();
        if (!pg.ok()) return pg.status();
        if (info.rank == 1) return absl::FailedPreconditionError("rank 1: a failure of its own");
        const absl::Time t0 = absl::Now();
        std::vector<at::Tensor> t = {at::ones({4})};  // [4]
        try {
          (*pg)->allreduce(t)->wait();
        } catch (const std::exception&) {
          // Aborted by the job error, well before the 60 s timeout.
          absl::StrAppend(report, absl::Now() - t0 < absl::Seconds(20) ? "aborted early\n" : "late\n");
          throw;
        }
        return absl::OkStatus();
      });
    }, report);
  }, Deadline(absl::Seconds(90)));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(tt::ExitStatusCode(r[1]), 1) << r[1].report;
  EXPECT_THAT(r[1].report,
              HasSubstr("job_test: rank 1 failed: FAILED_PRECONDITION: rank 1: a failure of its own"));
  EXPECT_EQ(tt::ExitStatusCode(r[0]), tr::kPeerFailureExitCode) << r[0].report;
  EXPECT_THAT(r[0].report, HasSubstr("job_test: rank 0 stopping, another rank failed: "));
  // What ends rank 0's all_reduce is a race: the job error (the coordination
  // callback aborts the group: "job failed: ...") or rank 1's closed TCP
  // connection, whichever arrives first (the connection won 3 of 3 runs on an
  // idle box, the job error on a loaded one). Either way it ends early, and
  // the exit code comes from the service's verdict, not from that race.
  EXPECT_THAT(r[0].report, AnyOf(HasSubstr("job failed: "),
                                 HasSubstr("peer rank 1 closed the connection")));
  EXPECT_THAT(r[0].report, HasSubstr("aborted early"));
}

// A rank that never registers: the others' startup fails naming it, exit 75
// (coordination::StartupFailureExitCode), so tpurun blames the missing rank.
TEST(RunRankMainTest, PeerNeverRegisteringIsExit75AtStartup) {
  const int port = tt::FreePort();
  std::vector<tt::ChildResult> r = tt::RunForkedRanks(1, [&](int rank, std::string* report) {  // rank 0 of 2
    setenv("TPU_DIST_REGISTRATION_TIMEOUT", "1s", 1);
    return RankMainCapturingStderr(rank, 2, port, [](const tr::RankInfo& info) -> absl::Status {
      absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, Options());
      return job.status();
    }, report);
  }, Deadline(absl::Seconds(60)));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(tt::ExitStatusCode(r[0]), tr::kPeerFailureExitCode) << r[0].report;
  EXPECT_THAT(r[0].report, HasSubstr("job_test: rank 0 stopping, another rank failed: "));
  EXPECT_THAT(r[0].report, HasSubstr("rank 1 never registered"));
}

// Without coordination (a given store): the job's groups are its own to
// abort, and Shutdown() leaves them alone.
TEST(JobTest, AbortGroupsEndsAnOpWaitingOnAPeerAndShutdownForgetsThem) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<Job>> jobs(2);
  std::atomic<int> ready{0};
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (ready.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(200));  // rank 0 is in its all_reduce
    EXPECT_EQ(jobs[0]->AbortGroups(absl::AbortedError("test abort")), 1);
    aborted = true;
  });
  tt::RunRankThreads(2, [&](int rank) {
    tr::RankInfo info;
    info.rank = rank;
    info.world_size = 2;
    JobOptions o = Options();
    o.group.store = store;
    o.group.job_id = absl::StrCat("job_test_threads_", getpid());
    absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, o);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ((*job)->runtime(), nullptr);
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = (*job)->WorldGroup();
    ASSERT_TRUE(pg.ok()) << pg.status();
    jobs[rank] = *std::move(job);
    ++ready;
    if (rank == 0) {
      std::vector<at::Tensor> t = {at::ones({4})};  // [4]
      try {
        (*pg)->allreduce(t)->wait();
        ADD_FAILURE() << "the all_reduce without rank 1 returned";
      } catch (const std::exception& e) {
        EXPECT_THAT(e.what(), HasSubstr("test abort"));
      }
      EXPECT_TRUE(aborted.load());
    } else {
      while (!aborted.load()) absl::SleepFor(absl::Milliseconds(5));
    }
  }, absl::Seconds(60));
  aborter.join();
  for (auto& job : jobs) {
    job->Shutdown();
    EXPECT_EQ(job->AbortGroups(absl::AbortedError("late")), 0);
  }
}

// A failure in Run without coordination: nobody to tell, exit code 1.
TEST(JobTest, RunWithoutCoordinationFailsWithExitOne) {
  tr::RankInfo info;
  JobOptions o = Options();
  o.group.store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, o);
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Status s = (*job)->Run([]() -> absl::Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "boom");
  EXPECT_EQ(ExitCodeOf(s), 1);
}

}  // namespace
}  // namespace tpudist::distributed
