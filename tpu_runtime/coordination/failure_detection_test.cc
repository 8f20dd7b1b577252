// Failure detection that acts: the error watcher delivers the job error at
// once, a killed client is failed by its closed connection (before the
// heartbeat timeout), a hung (SIGSTOPped) one by the heartbeat, a rank with
// another world size fails the job naming both sizes, a clean shutdown is not
// a failure, and ReportFailure tells the root cause from the followers.
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/coordination_service.h"
#include "testing/coordination_child.h"
#include "tpu_runtime/coordination/failure_report.h"
#include "tpu_runtime/exit_codes.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using test_support::SpawnChild;
using test_support::WaitChild;
using test_support::WaitFor;

constexpr char kJob[] = "detect-test";

std::unique_ptr<CoordinationService> StartService(int num_tasks, absl::Duration heartbeat,
                                                  int num_slices = 0) {
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = num_tasks;
  options.num_slices = num_slices;
  options.heartbeat_timeout = heartbeat;
  auto service = CoordinationService::Start(options);
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? *std::move(service) : nullptr;
}

std::unique_ptr<CoordinationClient> Connect(const CoordinationService& service, int task,
                                            ClientOptions options = {}) {
  options.connect_timeout = absl::Seconds(10);
  auto client = CoordinationClient::Connect(service.address(), kJob, task, std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

pid_t SpawnRegisteredChild(CoordinationService& service, int task) {
  const pid_t child = SpawnChild("register_and_sleep", {{"TPUDIST_COORD_ADDRESS", service.address()},
                                                        {"TPUDIST_COORD_JOB", kJob},
                                                        {"TPUDIST_COORD_TASK", absl::StrCat(task)}});
  if (child <= 0) return child;
  if (!WaitFor([&] { return service.state().task_state(task) == TaskState::kConnected; },
               absl::Seconds(30))) {
    kill(child, SIGKILL);
    WaitChild(child, absl::Seconds(5));
    return -1;
  }
  absl::SleepFor(absl::Milliseconds(300));  // its watcher's poll is in flight
  return child;
}

TEST(FailureDetectionTest, WatcherDeliversAReportedErrorAtOnce) {
  // Heartbeats every 10 s: only the watcher can deliver within the bound.
  auto service = StartService(2, absl::Seconds(30));
  ASSERT_NE(service, nullptr);
  std::atomic<int> calls{0};
  absl::Notification called;
  ClientOptions watched;
  watched.error_callback = [&](const absl::Status&) {
    if (calls.fetch_add(1) == 0) called.Notify();
  };
  auto c0 = Connect(*service, 0);
  auto c1 = Connect(*service, 1, watched);
  ASSERT_TRUE(c0 && c1);
  ASSERT_TRUE(c0->Register().ok());
  ASSERT_TRUE(c1->Register().ok());
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c0->ReportError(absl::InternalError("disk on fire")).ok());
  EXPECT_EQ(c0->job_error_task(), 0);  // the report's answer names us
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(2)));
  const absl::Duration took = absl::Now() - t0;
  std::printf("[measure] ReportError -> other task's error callback %s\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_THAT(c1->health().message(), HasSubstr("disk on fire"));
  EXPECT_EQ(c1->job_error_task(), 0);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(calls.load(), 1);
}

TEST(FailureDetectionTest, KilledClientFailsTheJobBeforeItsHeartbeatTimeout) {
  auto service = StartService(3, absl::Seconds(30));
  ASSERT_NE(service, nullptr);
  auto c0 = Connect(*service, 0);
  ASSERT_TRUE(c0 && c0->Register().ok());
  const pid_t child = SpawnRegisteredChild(*service, 2);
  ASSERT_GT(child, 0);
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_EQ(WaitChild(child, absl::Seconds(5)), 128 + SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(5)));
  const absl::Duration took = absl::Now() - killed;
  std::printf("[measure] SIGKILL -> job error at a survivor %s (heartbeat timeout 30s)\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_THAT(c0->health().message(), HasSubstr("task 2"));
  EXPECT_THAT(c0->health().message(), HasSubstr("lost its connection"));
  EXPECT_EQ(c0->job_error_task(), 2);
}

TEST(FailureDetectionTest, HungClientFailsTheJobAfterTheHeartbeatTimeout) {
  constexpr absl::Duration kHeartbeat = absl::Seconds(2);
  auto service = StartService(2, kHeartbeat);
  ASSERT_NE(service, nullptr);
  auto c0 = Connect(*service, 0);
  ASSERT_TRUE(c0 && c0->Register().ok());
  const pid_t child = SpawnRegisteredChild(*service, 1);
  ASSERT_GT(child, 0);
  const absl::Time stopped = absl::Now();
  ASSERT_EQ(kill(child, SIGSTOP), 0);  // alive, connection open, silent
  const bool detected = WaitFor([&] { return !c0->health().ok(); }, kHeartbeat + absl::Seconds(5));
  const absl::Duration took = absl::Now() - stopped;
  kill(child, SIGKILL);
  EXPECT_EQ(WaitChild(child, absl::Seconds(5)), 128 + SIGKILL);
  ASSERT_TRUE(detected);
  std::printf("[measure] SIGSTOP -> job error at a survivor %s (heartbeat timeout %s)\n",
              absl::FormatDuration(took).c_str(), absl::FormatDuration(kHeartbeat).c_str());
  EXPECT_GE(took, kHeartbeat - absl::Seconds(1));
  EXPECT_LT(took, kHeartbeat + absl::Seconds(2));
  EXPECT_THAT(c0->health().message(), HasSubstr("task 1"));
  EXPECT_THAT(c0->health().message(), HasSubstr("missed its heartbeat deadline"));
}

TEST(FailureDetectionTest, CleanShutdownIsNotAFailure) {
  auto service = StartService(2, absl::Seconds(30));
  ASSERT_NE(service, nullptr);
  auto c0 = Connect(*service, 0);
  auto c1 = Connect(*service, 1);
  ASSERT_TRUE(c0 && c1 && c0->Register().ok() && c1->Register().ok());
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(c1->Shutdown().ok());
  c1.reset();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(service->state().JobError().ok()) << service->state().JobError();
  EXPECT_TRUE(c0->health().ok());
  EXPECT_EQ(service->state().task_state(1), TaskState::kDisconnected);
}

TEST(FailureDetectionTest, WorldSizeMismatchFailsTheJobNamingBothSizes) {
  auto service = StartService(2, absl::Seconds(30));
  ASSERT_NE(service, nullptr);
  ClientOptions two, three;
  two.num_tasks = 2;
  three.num_tasks = 3;
  auto c0 = Connect(*service, 0, two);
  auto c1 = Connect(*service, 1, three);
  ASSERT_TRUE(c0 && c1);
  ASSERT_TRUE(c0->Register().ok());
  const absl::Status refused = c1->Register();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("world size 3"));
  EXPECT_THAT(refused.message(), HasSubstr("world size 2"));
  // Rank 0 learns it in well under a heartbeat.
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(2)));
  EXPECT_THAT(c0->health().message(), HasSubstr("world size 3"));
}

// A restart whose rank announces a stale slice count (3 slices for a job the
// service runs as 2, e.g. after a slice was replaced) is refused at
// registration in well under a second, naming both counts, and the job fails
// instead of waiting for a third slice's ranks.
TEST(FailureDetectionTest, StaleSliceCountIsRefusedAtRegistrationNamingBothCounts) {
  auto service = StartService(4, absl::Seconds(30), /*num_slices=*/2);
  ASSERT_NE(service, nullptr);
  ClientOptions live, stale;
  live.num_tasks = stale.num_tasks = 4;
  live.num_slices = 2;
  stale.num_slices = 3;
  auto c0 = Connect(*service, 0, live);
  auto c2 = Connect(*service, 2, stale);
  ASSERT_TRUE(c0 && c2);
  ASSERT_TRUE(c0->Register().ok());
  const absl::Time start = absl::Now();
  const absl::Status refused = c2->Register();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("started for 3 slices (MEGASCALE_NUM_SLICES=3)"));
  EXPECT_THAT(refused.message(), HasSubstr("started for 2 slices"));
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(2)));
  EXPECT_THAT(c0->health().message(), HasSubstr("3 slices"));
  // A task that does not say (0) is not checked.
  ClientOptions silent;
  silent.num_tasks = 4;
  auto service2 = StartService(2, absl::Seconds(30), /*num_slices=*/2);
  ASSERT_NE(service2, nullptr);
  auto c = Connect(*service2, 1, silent);
  ASSERT_TRUE(c);
  const absl::Status other = c->Register();  // refused for its world size only
  EXPECT_THAT(other.message(), Not(HasSubstr("slices"))) << other;
}

// Two ranks fail one after the other: the first is the root cause (exit 1),
// the second a follower (exit 75); exceptions count as failures too.
TEST(FailureDetectionTest, ReportFailureTellsRootCauseFromFollowers) {
  RankInfo base;
  base.world_size = 2;
  base.master_addr = "localhost";
  base.master_port = 0;
  base.job_id = "report-failure-test";
  RuntimeOptions first;
  first.startup_barrier_timeout = absl::ZeroDuration();
  auto rank0 = StartOrConnect(base, first);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  RankInfo info1 = base;
  info1.rank = 1;
  info1.master_port = (*rank0)->service()->port();
  auto rank1 = StartOrConnect(info1, first);
  ASSERT_TRUE(rank1.ok()) << rank1.status();

  int code1 = -1, code0 = -1;
  const absl::Status s1 = RunReportingFailure(
      **rank1, []() -> absl::Status { throw std::runtime_error("CUDA out of cheese"); }, &code1);
  EXPECT_THAT(s1.message(), HasSubstr("out of cheese"));
  EXPECT_EQ(code1, 1);
  ASSERT_TRUE(WaitFor([&] { return !(*rank0)->client()->health().ok(); }, absl::Seconds(2)));
  const absl::Status s0 = RunReportingFailure(
      **rank0, [] { return absl::AbortedError("allreduce aborted: job failed"); }, &code0);
  EXPECT_EQ(code0, kPeerFailureExitCode);
  int ok_code = -1;
  EXPECT_TRUE(RunReportingFailure(**rank0, [] { return absl::OkStatus(); }, &ok_code).ok());
  EXPECT_EQ(ok_code, 0);
  (*rank1)->Shutdown();
  (*rank0)->Shutdown();
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
