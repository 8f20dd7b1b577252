// CoordinationStore as a c10d::Store: semantics, timeouts, and a Gloo
// rendezvous through it, with ranks as threads and as forked processes.
// Also hosts the child-process roles used by the multi-process tests.
#include "tpu_runtime/coordination/coordination_store.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/coordination_service.h"
#include "testing/coordination_child.h"

namespace tpudist::tpu_runtime::coordination {

// Child role "serve" (service_faults_test.cc): hosts a CoordinationService
// configured from the environment until killed.
int RunServeChild();

namespace {

using test_support::EnvOr;
using ::testing::HasSubstr;
using test_support::SpawnChild;
using test_support::WaitChild;

constexpr char kJob[] = "store-test";

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::shared_ptr<CoordinationClient> ConnectRegistered(
    const std::string& address, const std::string& job, int task) {
  ClientOptions options;
  options.connect_timeout = absl::Seconds(30);
  auto client = CoordinationClient::Connect(address, job, task, options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return nullptr;
  }
  if (absl::Status s = (*client)->Register(); !s.ok()) {
    std::fprintf(stderr, "register: %s\n", s.ToString().c_str());
    return nullptr;
  }
  return std::shared_ptr<CoordinationClient>(std::move(*client));
}

// One rank of the Gloo check: rendezvous through the store, allreduce
// [rank+1]*n floats (oracle: world*(world+1)/2), barrier. Returns "" or the
// failure.
std::string RunGlooRank(const std::shared_ptr<CoordinationClient>& client,
                        int rank, int world) {
  try {
    auto store = c10::make_intrusive<CoordinationStore>(
        client, std::chrono::seconds(30));
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    options->timeout = std::chrono::seconds(30);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world,
                                                          options);
    std::vector<at::Tensor> tensors = {
        at::full({7}, static_cast<float>(rank + 1), at::kFloat)};  // [7]
    pg->allreduce(tensors)->wait(std::chrono::seconds(30));
    const float expected = world * (world + 1) / 2.0f;
    if (!at::equal(tensors[0], at::full({7}, expected, at::kFloat))) {
      return absl::StrCat("rank ", rank, ": allreduce gave ",
                          tensors[0][0].item<float>(), ", want ", expected);
    }
    pg->barrier()->wait(std::chrono::seconds(30));
  } catch (const c10::Error& e) {
    return absl::StrCat("rank ", rank, ": ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::StrCat("rank ", rank, ": ", e.what());
  }
  return "";
}

// ---- child roles (run only when re-executed by SpawnChild) -----------------

// A rank of a multi-host job: StartOrConnect (rank 0 hosts the service on
// the master address), then Gloo over the runtime's store, bound to this
// host's address.
int RunRuntimeGlooRank() {
  RankInfo info;
  if (!absl::SimpleAtoi(EnvOr("TPUDIST_COORD_TASK", ""), &info.rank) ||
      !absl::SimpleAtoi(EnvOr("TPUDIST_COORD_WORLD", ""), &info.world_size) ||
      !absl::SimpleAtoi(EnvOr("TPUDIST_COORD_PORT", ""), &info.master_port)) {
    return 2;
  }
  info.master_addr = EnvOr("TPUDIST_COORD_MASTER", "");
  info.job_id = EnvOr("TPUDIST_COORD_JOB", "");
  const std::string host_ip = EnvOr("TPUDIST_COORD_HOST_IP", "127.0.0.1");
  RuntimeOptions options;
  options.client.connect_timeout = absl::Seconds(30);
  options.startup_barrier_timeout = absl::Seconds(60);
  options.store_timeout = std::chrono::seconds(30);
  auto runtime = StartOrConnect(info, options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", info.rank,
                 runtime.status().ToString().c_str());
    return 3;
  }
  try {
    auto gloo = c10d::ProcessGroupGloo::Options::create();
    gloo->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(host_ip));
    gloo->timeout = std::chrono::seconds(30);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        (*runtime)->store(), info.rank, info.world_size, gloo);
    std::vector<at::Tensor> tensors = {
        at::full({5}, static_cast<float>(info.rank + 1), at::kFloat)};  // [5]
    pg->allreduce(tensors)->wait(std::chrono::seconds(30));
    const float expected = info.world_size * (info.world_size + 1) / 2.0f;
    if (!at::equal(tensors[0], at::full({5}, expected, at::kFloat))) {
      std::fprintf(stderr, "rank %d: allreduce gave %f, want %f\n", info.rank,
                   tensors[0][0].item<float>(), expected);
      return 1;
    }
    pg->barrier()->wait(std::chrono::seconds(30));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", info.rank,
                 e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", info.rank, e.what());
    return 1;
  }
  (*runtime)->Shutdown(absl::Seconds(20));
  return 0;
}

int RunChildRole(const std::string& role) {
  if (role == "runtime_gloo") return RunRuntimeGlooRank();
  if (role == "serve") return RunServeChild();
  const std::string address = EnvOr("TPUDIST_COORD_ADDRESS", "");
  const std::string job = EnvOr("TPUDIST_COORD_JOB", "");
  int task = -1, world = 0;
  if (!absl::SimpleAtoi(EnvOr("TPUDIST_COORD_TASK", ""), &task)) return 2;
  auto client = ConnectRegistered(address, job, task);
  if (client == nullptr) return 3;
  if (role == "register_and_sleep") {
    absl::SleepFor(absl::Seconds(60));  // the parent SIGKILLs us first
    return 4;
  }
  if (role == "gloo") {
    if (!absl::SimpleAtoi(EnvOr("TPUDIST_COORD_WORLD", ""), &world)) return 2;
    const std::string failure = RunGlooRank(client, task, world);
    // A survivor of a killed rank must fail, with an error that names it.
    const std::string expect = EnvOr("TPUDIST_COORD_EXPECT_ERROR", "");
    if (!expect.empty()) {
      std::fprintf(stderr, "rank %d failed as expected? %s\n", task,
                   failure.c_str());
      return failure.find(expect) != std::string::npos ? 0 : 1;
    }
    if (!failure.empty()) {
      std::fprintf(stderr, "%s\n", failure.c_str());
      return 1;
    }
    return client->Shutdown().ok() ? 0 : 5;
  }
  return 6;
}

TEST(CoordinationChild, Main) {
  const char* role = std::getenv(test_support::kRoleEnv);
  if (role == nullptr) GTEST_SKIP() << "runs only as a child process";
  const int rc = RunChildRole(role);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);  // skip gtest / gRPC / Gloo teardown in the child
}

// ---- store semantics -------------------------------------------------------

class CoordinationStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceOptions options;
    options.job_id = kJob;
    options.num_tasks = 2;
    auto service = CoordinationService::Start(options);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    client_ = ConnectRegistered(service_->address(), kJob, 0);
    ASSERT_NE(client_, nullptr);
    store_ = c10::make_intrusive<CoordinationStore>(
        client_, std::chrono::milliseconds(300));
  }

  std::unique_ptr<CoordinationService> service_;
  std::shared_ptr<CoordinationClient> client_;
  c10::intrusive_ptr<CoordinationStore> store_;
};

TEST_F(CoordinationStoreTest, SetGetAddCompareSetDeleteCheckNumKeys) {
  store_->set("k", Bytes("v1"));
  store_->set("k", Bytes("v2"));  // c10d set overwrites
  EXPECT_EQ(store_->get("k"), Bytes("v2"));
  EXPECT_EQ(store_->add("n", 2), 2);
  EXPECT_EQ(store_->add("n", 40), 42);
  EXPECT_EQ(store_->get("n"), Bytes("42"));
  EXPECT_EQ(store_->compareSet("c", Bytes(""), Bytes("a")), Bytes("a"));
  EXPECT_EQ(store_->compareSet("c", Bytes("b"), Bytes("z")), Bytes("a"));
  EXPECT_EQ(store_->compareSet("c", Bytes("a"), Bytes("z")), Bytes("z"));
  EXPECT_EQ(store_->getNumKeys(), 3);
  // Keys live under the prefix; the runtime's own keys are not counted.
  ASSERT_TRUE(client_->Set("runtime/own", "x").ok());
  EXPECT_EQ(store_->getNumKeys(), 3);
  EXPECT_EQ(*client_->TryGet("c10d/k"), "v2");
  EXPECT_TRUE(store_->check({"k", "n"}));
  EXPECT_FALSE(store_->check({"k", "absent"}));
  EXPECT_TRUE(store_->deleteKey("k"));
  EXPECT_FALSE(store_->deleteKey("k"));
  EXPECT_EQ(store_->getNumKeys(), 2);
}

TEST_F(CoordinationStoreTest, GetAndWaitHonourTimeoutAndThrow) {
  const absl::Time start = absl::Now();
  try {
    store_->get("absent");
    ADD_FAILURE() << "get of an absent key returned";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("absent"));
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  store_->set("a", Bytes("1"));
  EXPECT_THROW(store_->wait({"a", "b"}, std::chrono::milliseconds(200)),
               c10::Error);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store_->set("b", Bytes("2"));
  });
  store_->setTimeout(std::chrono::seconds(5));
  EXPECT_NO_THROW(store_->wait({"a", "b"}));
  setter.join();
  EXPECT_EQ(store_->getTimeout(), std::chrono::milliseconds(5000));
}

// ---- Gloo rendezvous -------------------------------------------------------

class GlooOverStoreTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooOverStoreTest, Threads) {
  const int world = GetParam();
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = world;
  auto service = CoordinationService::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  std::vector<std::string> failures(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto client = ConnectRegistered((*service)->address(), kJob, r);
      failures[r] =
          client == nullptr ? "connect failed" : RunGlooRank(client, r, world);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  EXPECT_TRUE((*service)->state().JobError().ok());
}

TEST_P(GlooOverStoreTest, Processes) {
  const int world = GetParam();
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = world;
  auto service = CoordinationService::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pids.push_back(
        SpawnChild("gloo", {{"TPUDIST_COORD_ADDRESS", (*service)->address()},
                            {"TPUDIST_COORD_JOB", kJob},
                            {"TPUDIST_COORD_TASK", absl::StrCat(r)},
                            {"TPUDIST_COORD_WORLD", absl::StrCat(world)}}));
    ASSERT_GT(pids.back(), 0);
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(WaitChild(pids[r], absl::Seconds(90)), 0) << "rank " << r;
  }
  EXPECT_TRUE((*service)->state().JobError().ok())
      << (*service)->state().JobError();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ((*service)->state().task_state(r), TaskState::kDisconnected);
  }
}

// Rank 2 registers and is SIGKILLed before it publishes its Gloo address;
// ranks 0 and 1, blocked in Gloo's rendezvous (store wait with a 30 s
// timeout), must fail within the 1 s heartbeat timeout (+ slack) with an
// error naming task 2, instead of waiting out the store timeout.
TEST(GlooKilledRankTest, SurvivorsFailFastNamingTheDeadRank) {
  constexpr int kWorld = 3;
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = kWorld;
  options.heartbeat_timeout = absl::Seconds(1);
  auto service = CoordinationService::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  const std::string address = (*service)->address();
  const pid_t victim =
      SpawnChild("register_and_sleep", {{"TPUDIST_COORD_ADDRESS", address},
                                        {"TPUDIST_COORD_JOB", kJob},
                                        {"TPUDIST_COORD_TASK", "2"}});
  ASSERT_GT(victim, 0);
  std::vector<pid_t> survivors;
  for (int r = 0; r < 2; ++r) {
    survivors.push_back(
        SpawnChild("gloo", {{"TPUDIST_COORD_ADDRESS", address},
                            {"TPUDIST_COORD_JOB", kJob},
                            {"TPUDIST_COORD_TASK", absl::StrCat(r)},
                            {"TPUDIST_COORD_WORLD", absl::StrCat(kWorld)},
                            {"TPUDIST_COORD_EXPECT_ERROR", "task 2"}}));
    ASSERT_GT(survivors.back(), 0);
  }
  CoordinationState& state = (*service)->state();
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        for (int t = 0; t < kWorld; ++t) {
          if (state.task_state(t) != TaskState::kConnected) return false;
        }
        return true;
      },
      absl::Seconds(60)));
  // Give the survivors time to enter Gloo's rendezvous wait.
  ASSERT_TRUE(test_support::WaitFor([&] { return state.NumKeys("c10d/") >= 2; },
                               absl::Seconds(60)));
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(WaitChild(survivors[r], absl::Seconds(30)), 0) << "rank " << r;
  }
  const absl::Duration took = absl::Now() - killed;
  std::printf(
      "[measure] SIGKILL of rank 2 -> both Gloo survivors exited "
      "after %s (heartbeat timeout 1s, store timeout 30s)\n",
      absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(1) + absl::Seconds(4));
  EXPECT_EQ(WaitChild(victim, absl::Seconds(5)), 128 + SIGKILL);
  EXPECT_EQ(state.JobErrorTask(), 2);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooOverStoreTest,
                         ::testing::Values(2, 3, 4));

// ---- two emulated hosts in network namespaces ------------------------------
//
// Namespaces <p>a and <p>b joined by a veth pair, 10.251.7.1 and 10.251.7.2
// (private to the pair, so parallel runs do not collide; names carry the pid).
// Two ranks per host; rank 0 hosts the service on 10.251.7.1 via
// StartOrConnect, every rank runs Gloo bound to its host's address.
class TwoHostNetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || access("/usr/sbin/ip", X_OK) != 0) {
      GTEST_SKIP() << "needs root and /usr/sbin/ip for network namespaces";
    }
    prefix_ = absl::StrCat("tdc", getpid());
    const std::string a = prefix_ + "a", b = prefix_ + "b";
    const std::vector<std::string> commands = {
        "ip netns add " + a,
        "ip netns add " + b,
        absl::StrCat("ip link add ", prefix_, "x type veth peer name ", prefix_,
                     "y"),
        absl::StrCat("ip link set ", prefix_, "x netns ", a),
        absl::StrCat("ip link set ", prefix_, "y netns ", b),
        absl::StrCat("ip -n ", a, " addr add 10.251.7.1/24 dev ", prefix_, "x"),
        absl::StrCat("ip -n ", b, " addr add 10.251.7.2/24 dev ", prefix_, "y"),
        absl::StrCat("ip -n ", a, " link set ", prefix_, "x up"),
        absl::StrCat("ip -n ", b, " link set ", prefix_, "y up"),
        "ip -n " + a + " link set lo up",
        "ip -n " + b + " link set lo up",
    };
    for (const std::string& command : commands) {
      if (std::system((command + " 2>/dev/null").c_str()) != 0) {
        GTEST_SKIP() << "cannot set up network namespaces: " << command;
      }
    }
  }
  void TearDown() override {
    if (prefix_.empty()) return;
    // Deleting a namespace also removes its end of the veth pair.
    std::system(("ip netns del " + prefix_ + "a 2>/dev/null").c_str());
    std::system(("ip netns del " + prefix_ + "b 2>/dev/null").c_str());
  }
  std::string prefix_;
};

TEST_F(TwoHostNetnsTest, StartOrConnectAndGlooAcrossHosts) {
  constexpr int kWorld = 4;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const bool host_a = r < 2;
    pids.push_back(SpawnChild(
        "runtime_gloo",
        {{"TPUDIST_COORD_TASK", absl::StrCat(r)},
         {"TPUDIST_COORD_WORLD", absl::StrCat(kWorld)},
         {"TPUDIST_COORD_MASTER", "10.251.7.1"},
         {"TPUDIST_COORD_PORT", "29517"},  // private to the namespace
         {"TPUDIST_COORD_JOB", "netns-job"},
         {"TPUDIST_COORD_HOST_IP", host_a ? "10.251.7.1" : "10.251.7.2"}},
        {"/usr/sbin/ip", "netns", "exec", prefix_ + (host_a ? "a" : "b")}));
    ASSERT_GT(pids.back(), 0);
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(WaitChild(pids[r], absl::Seconds(90)), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
