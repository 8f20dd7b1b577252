// CoordinationService + CoordinationClient over loopback gRPC: KV ops,
// blocking get, barriers, job id refusal, and failure detection of a
// SIGKILLed child process.
#include "tpu_runtime/coordination/coordination_service.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "testing/coordination_child.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

using ::testing::HasSubstr;
using test_support::SpawnChild;
using test_support::WaitChild;
using test_support::WaitFor;

constexpr char kJob[] = "svc-test";

std::unique_ptr<CoordinationService> StartService(
    int num_tasks, absl::Duration heartbeat = absl::Seconds(10)) {
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = num_tasks;
  options.heartbeat_timeout = heartbeat;
  auto service = CoordinationService::Start(options);
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? *std::move(service) : nullptr;
}

std::unique_ptr<CoordinationClient> ConnectTask(
    const CoordinationService& service, int task, ClientOptions options = {}) {
  options.connect_timeout = absl::Seconds(10);
  auto client = CoordinationClient::Connect(service.address(), kJob, task,
                                            std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EXPECT_TRUE((*client)->Register().ok());
  return *std::move(client);
}

TEST(CoordinationServiceTest, StartReportsBoundPortAndRefusesBadOptions) {
  auto service = StartService(1);
  ASSERT_NE(service, nullptr);
  EXPECT_GT(service->port(), 0);
  EXPECT_EQ(service->address(), absl::StrCat("127.0.0.1:", service->port()));
  // The port is taken: a second service on it must fail, not share it.
  ServiceOptions same;
  same.job_id = "other";
  same.port = service->port();
  EXPECT_FALSE(CoordinationService::Start(same).ok());
  ServiceOptions no_job;
  EXPECT_TRUE(
      absl::IsInvalidArgument(CoordinationService::Start(no_job).status()));
}

TEST(CoordinationServiceTest, KeyValueOpsOverRpc) {
  auto service = StartService(2);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  auto c1 = ConnectTask(*service, 1);
  ASSERT_TRUE(c0 && c1);
  ASSERT_TRUE(c0->Set("a", "1", /*allow_overwrite=*/false).ok());
  absl::Status again = c1->Set("a", "2", /*allow_overwrite=*/false);
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_THAT(again.message(), HasSubstr("task 1"));
  EXPECT_EQ(*c1->TryGet("a"), "1");
  EXPECT_TRUE(absl::IsNotFound(c1->TryGet("zz").status()));
  EXPECT_EQ(*c0->Add("cnt", 3), 3);
  EXPECT_EQ(*c1->Add("cnt", 4), 7);
  EXPECT_EQ(*c0->Get("cnt", absl::Seconds(1)), "7");
  EXPECT_EQ(*c0->CompareSet("cas", "", "x"), "x");
  EXPECT_EQ(*c1->CompareSet("cas", "y", "z"), "x");
  EXPECT_EQ(*c1->CompareSet("cas", "x", "z"), "z");
  EXPECT_EQ(*c0->NumKeys(), 3);
  EXPECT_EQ(*c0->NumKeys("c"), 2);
  EXPECT_TRUE(*c0->Check({"a", "cas"}));
  EXPECT_FALSE(*c0->Check({"a", "nope"}));
  EXPECT_TRUE(*c1->Delete("a"));
  EXPECT_FALSE(*c1->Delete("a"));
  EXPECT_EQ(*c0->NumKeys(), 2);
}

TEST(CoordinationServiceTest, BlockingGetCompletesWhenAnotherThreadSets) {
  auto service = StartService(2);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  auto c1 = ConnectTask(*service, 1);
  ASSERT_TRUE(c0 && c1);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(c1->Set("late", "value").ok());
  });
  const absl::Time start = absl::Now();
  auto value = c0->Get("late", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "value");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(CoordinationServiceTest, GetDeadlineExceededNamesKey) {
  auto service = StartService(1);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  ASSERT_NE(c0, nullptr);
  const absl::Time start = absl::Now();
  auto value = c0->Get("missing-key", absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
  EXPECT_THAT(value.status().message(), HasSubstr("missing-key"));
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST(CoordinationServiceTest, BarrierAllAndSubset) {
  constexpr int kTasks = 4;
  auto service = StartService(kTasks);
  ASSERT_NE(service, nullptr);
  std::vector<std::unique_ptr<CoordinationClient>> clients;
  for (int t = 0; t < kTasks; ++t) clients.push_back(ConnectTask(*service, t));
  std::vector<absl::Status> all(kTasks), subset(kTasks);
  std::vector<std::thread> threads;
  for (int t = 0; t < kTasks; ++t) {
    threads.emplace_back([&, t] {
      all[t] = clients[t]->Barrier("all", absl::Seconds(10));
      if (t % 2 == 1) {
        subset[t] = clients[t]->Barrier("odd", absl::Seconds(10), {1, 3});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kTasks; ++t) {
    EXPECT_TRUE(all[t].ok()) << all[t];
    EXPECT_TRUE(subset[t].ok()) << subset[t];
  }
}

// 16 tasks on 2 cores: every task adds its id+1 to a counter, meets at a
// barrier, then reads the total (oracle: 16*17/2) and meets again.
TEST(CoordinationServiceTest, SixteenTasksAddAndBarrier) {
  constexpr int kTasks = 16;
  auto service = StartService(kTasks);
  ASSERT_NE(service, nullptr);
  std::vector<std::unique_ptr<CoordinationClient>> clients;
  for (int t = 0; t < kTasks; ++t) clients.push_back(ConnectTask(*service, t));
  std::vector<std::string> errors(kTasks);
  std::vector<std::thread> threads;
  for (int t = 0; t < kTasks; ++t) {
    threads.emplace_back([&, t] {
      CoordinationClient& c = *clients[t];
      absl::Status s = c.Add("sum", t + 1).status();
      if (s.ok()) s = c.Barrier("added", absl::Seconds(30));
      absl::StatusOr<std::string> total = c.Get("sum", absl::Seconds(5));
      if (s.ok()) s = total.status();
      if (s.ok() && *total != absl::StrCat(kTasks * (kTasks + 1) / 2)) {
        s = absl::InternalError(absl::StrCat("total ", *total));
      }
      if (s.ok()) s = c.Barrier("read", absl::Seconds(30));
      errors[t] = s.ToString();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kTasks; ++t) EXPECT_EQ(errors[t], "OK") << "task " << t;
}

TEST(CoordinationServiceTest, BarrierTimeoutNamesMissingTasks) {
  auto service = StartService(3);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  auto c1 = ConnectTask(*service, 1);
  ASSERT_TRUE(c0 && c1);
  absl::Status s1;
  std::thread t1([&] { s1 = c1->Barrier("b", absl::Milliseconds(400)); });
  const absl::Time start = absl::Now();
  absl::Status s0 = c0->Barrier("b", absl::Milliseconds(400));
  t1.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s0)) << s0;
  EXPECT_THAT(s0.message(), HasSubstr("missing tasks {2}"));
  EXPECT_THAT(s1.message(), HasSubstr("missing tasks {2}"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(CoordinationServiceTest, RefusesClientOfAnotherJob) {
  auto service = StartService(1);
  ASSERT_NE(service, nullptr);
  auto client = CoordinationClient::Connect(service->address(), "intruder", 0);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->Register();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("intruder"));
  EXPECT_THAT(s.message(), HasSubstr(kJob));
}

TEST(CoordinationServiceTest, ConnectTimesOutWithoutService) {
  // Take a port, then free it, so nothing listens there.
  int port = 0;
  {
    auto service = StartService(1);
    ASSERT_NE(service, nullptr);
    port = service->port();
  }
  ClientOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto client = CoordinationClient::Connect(absl::StrCat("127.0.0.1:", port),
                                            kJob, 0, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(CoordinationServiceTest, ConnectRetriesUntilServiceStarts) {
  int port = 0;
  {
    auto probe = StartService(1);
    ASSERT_NE(probe, nullptr);
    port = probe->port();
  }
  std::unique_ptr<CoordinationService> late;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ServiceOptions options;
    options.job_id = kJob;
    options.port = port;
    auto s = CoordinationService::Start(options);
    if (s.ok()) late = *std::move(s);
  });
  ClientOptions options;
  options.connect_timeout = absl::Seconds(10);
  auto client = CoordinationClient::Connect(absl::StrCat("127.0.0.1:", port),
                                            kJob, 0, options);
  starter.join();
  if (late == nullptr)
    GTEST_SKIP() << "port " << port << " was taken meanwhile";
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Register().ok());
}

TEST(CoordinationServiceTest, ShutdownUnblocksWaiters) {
  auto service = StartService(2);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  ASSERT_NE(c0, nullptr);
  absl::StatusOr<std::string> value;
  std::thread waiter([&] { value = c0->Get("never", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  service->Shutdown();
  waiter.join();
  EXPECT_FALSE(value.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(CoordinationServiceTest, ReportedErrorReachesPollAndHealth) {
  auto service = StartService(2);
  ASSERT_NE(service, nullptr);
  std::atomic<int> callbacks{0};
  ClientOptions options;
  options.heartbeat_interval = absl::Milliseconds(50);
  options.error_callback = [&](const absl::Status&) { ++callbacks; };
  auto c0 = ConnectTask(*service, 0, options);
  auto c1 = ConnectTask(*service, 1);
  ASSERT_TRUE(c0 && c1);
  EXPECT_TRUE(c0->PollForError(absl::Milliseconds(100)).ok());
  absl::Status polled;
  std::thread poller([&] { polled = c0->PollForError(absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(c1->ReportError(absl::InternalError("disk on fire")).ok());
  poller.join();
  EXPECT_TRUE(absl::IsInternal(polled)) << polled;
  EXPECT_THAT(polled.message(), HasSubstr("disk on fire"));
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(5)));
  EXPECT_THAT(c0->health().message(), HasSubstr("task 1"));
  EXPECT_EQ(callbacks.load(), 1);
}

TEST(CoordinationServiceTest, LostServiceMakesClientUnhealthy) {
  auto service = StartService(1, absl::Milliseconds(600));
  ASSERT_NE(service, nullptr);
  std::atomic<int> callbacks{0};
  ClientOptions options;
  options.error_callback = [&](const absl::Status& s) {
    if (absl::IsUnavailable(s)) ++callbacks;
  };
  auto c0 = ConnectTask(*service, 0, options);
  ASSERT_NE(c0, nullptr);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(c0->health().ok()) << c0->health();
  const absl::Time stopped = absl::Now();
  service->Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(5)));
  const absl::Duration took = absl::Now() - stopped;
  std::printf(
      "[measure] service gone -> client unhealthy after %s "
      "(heartbeat timeout 600ms)\n",
      absl::FormatDuration(took).c_str());
  EXPECT_TRUE(absl::IsUnavailable(c0->health())) << c0->health();
  EXPECT_THAT(c0->health().message(), HasSubstr("no contact"));
  EXPECT_LT(took, absl::Milliseconds(600) + absl::Seconds(2));
  EXPECT_EQ(callbacks.load(), 1);
  // Calls now fail fast instead of hanging.
  const absl::Time start = absl::Now();
  EXPECT_FALSE(c0->Set("k", "v").ok());
  EXPECT_FALSE(c0->Get("k", absl::Seconds(10)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Round-trip cost of the non-blocking ops over loopback, for the record;
// the bound only catches pathologies (e.g. a per-call reconnect).
TEST(CoordinationServiceTest, RoundTripLatency) {
  auto service = StartService(1);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  ASSERT_NE(c0, nullptr);
  constexpr int kOps = 500;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(c0->Set(absl::StrCat("k", i % 8), "v").ok());
    ASSERT_TRUE(c0->Get(absl::StrCat("k", i % 8), absl::Seconds(1)).ok());
  }
  const absl::Duration per_op = (absl::Now() - start) / (2 * kOps);
  std::printf("[measure] loopback Set/Get round trip: %s per op\n",
              absl::FormatDuration(per_op).c_str());
  EXPECT_LT(per_op, absl::Milliseconds(20));
}

// A child process registers as task 2 and is SIGKILLed; the staleness checker
// must fail the job within the heartbeat timeout (+ slack) and every blocked
// call of the others must return an error naming task 2.
TEST(CoordinationServiceTest, KilledClientDetectedAndPropagated) {
  constexpr absl::Duration kHeartbeat = absl::Seconds(1);
  auto service = StartService(3, kHeartbeat);
  ASSERT_NE(service, nullptr);
  auto c0 = ConnectTask(*service, 0);
  auto c1 = ConnectTask(*service, 1);
  ASSERT_TRUE(c0 && c1);
  const pid_t child = SpawnChild("register_and_sleep",
                                 {{"TPUDIST_COORD_ADDRESS", service->address()},
                                  {"TPUDIST_COORD_JOB", kJob},
                                  {"TPUDIST_COORD_TASK", "2"}});
  ASSERT_GT(child, 0);
  ASSERT_TRUE(WaitFor(
      [&] { return service->state().task_state(2) == TaskState::kConnected; },
      absl::Seconds(30)))
      << "child never registered";
  absl::SleepFor(absl::Milliseconds(300));  // a few heartbeats
  ASSERT_EQ(service->state().task_state(2), TaskState::kConnected);

  absl::StatusOr<std::string> get;
  absl::Status barrier, polled;
  absl::Duration get_took, poll_took;
  absl::Time killed;
  absl::Notification go;
  std::thread getter([&] {
    go.WaitForNotification();
    get = c0->Get("never-set", absl::Seconds(20));
    get_took = absl::Now() - killed;
  });
  std::thread poller([&] {
    go.WaitForNotification();
    polled = c1->PollForError(absl::Seconds(20));
    poll_took = absl::Now() - killed;
    barrier = c1->Barrier("after-kill", absl::Seconds(20));
  });
  killed = absl::Now();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  go.Notify();
  getter.join();
  poller.join();
  EXPECT_EQ(WaitChild(child, absl::Seconds(5)), 128 + SIGKILL);

  std::printf(
      "[measure] SIGKILL -> PollForError %s, -> blocked Get %s "
      "(heartbeat timeout %s)\n",
      absl::FormatDuration(poll_took).c_str(),
      absl::FormatDuration(get_took).c_str(),
      absl::FormatDuration(kHeartbeat).c_str());
  EXPECT_TRUE(absl::IsUnavailable(polled)) << polled;
  EXPECT_THAT(polled.message(), HasSubstr("task 2"));
  EXPECT_THAT(get.status().message(), HasSubstr("task 2"));
  EXPECT_THAT(barrier.message(), HasSubstr("task 2"));
  EXPECT_LT(poll_took, kHeartbeat + absl::Seconds(2));
  EXPECT_LT(get_took, kHeartbeat + absl::Seconds(2));
  EXPECT_EQ(service->state().JobErrorTask(), 2);
  ASSERT_TRUE(WaitFor([&] { return !c0->health().ok(); }, absl::Seconds(3)));
  EXPECT_THAT(c0->health().message(), HasSubstr("task 2"));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
