// StartOrConnect and its pure helpers.
#include "tpu_runtime/coordination/coordination_runtime.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

TEST(CoordinationRuntimeHelpersTest, Loopback) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackAddress("localhost"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("host-127"));
  EXPECT_EQ(ServiceBindAddress("localhost"), "127.0.0.1");
  EXPECT_EQ(ServiceBindAddress(""), "127.0.0.1");
  EXPECT_EQ(ServiceBindAddress("10.1.2.3"), "10.1.2.3");
}

TEST(CoordinationRuntimeHelpersTest, JoinHostPortAndJobId) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", 29500), "10.0.0.1:29500");
  EXPECT_EQ(JoinHostPort("fe80::1", 80), "[fe80::1]:80");
  EXPECT_EQ(JoinHostPort("[fe80::1]", 80), "[fe80::1]:80");
  RankInfo info;
  info.master_addr = "h0";
  info.master_port = 1234;
  EXPECT_EQ(EffectiveJobId(info), "tpudist-h0:1234");
  info.job_id = "run-7";
  EXPECT_EQ(EffectiveJobId(info), "run-7");
}

TEST(CoordinationRuntimeTest, RejectsBadRank) {
  RankInfo info;
  info.rank = 2;
  info.world_size = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(StartOrConnect(info).status()));
}

// Rank 0 starts on port 0 (no startup barrier, so it can publish the port),
// the other ranks connect to it; all then meet at a barrier and use the store.
TEST(CoordinationRuntimeTest, ThreeRanksRendezvous) {
  constexpr int kWorld = 3;
  RankInfo base;
  base.world_size = kWorld;
  base.master_addr = "localhost";
  base.master_port = 0;
  base.job_id = "runtime-test";
  RuntimeOptions first;
  first.startup_barrier_timeout = absl::ZeroDuration();
  auto rank0 = StartOrConnect(base, first);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_NE((*rank0)->service(), nullptr);
  const int port = (*rank0)->service()->port();
  EXPECT_EQ((*rank0)->service()->options().bind_address, "127.0.0.1");

  std::vector<std::unique_ptr<CoordinationRuntime>> others(kWorld);
  std::vector<absl::Status> results(kWorld);
  std::vector<std::thread> threads;
  for (int r = 1; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RankInfo info = base;
      info.rank = r;
      info.master_port = port;
      RuntimeOptions options;
      options.startup_barrier_timeout = absl::Seconds(20);
      auto rt = StartOrConnect(info, options);
      results[r] = rt.status();
      if (rt.ok()) others[r] = *std::move(rt);
    });
  }
  ASSERT_TRUE(
      (*rank0)->client()->Barrier("tpudist/startup", absl::Seconds(20)).ok());
  for (auto& t : threads) t.join();
  for (int r = 1; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r];
    EXPECT_EQ(others[r]->service(), nullptr);
    EXPECT_EQ(others[r]->client()->task_id(), r);
  }
  (*rank0)->store()->set("hello", {'h', 'i'});
  EXPECT_EQ(others[2]->store()->get("hello"), (std::vector<uint8_t>{'h', 'i'}));
  EXPECT_EQ(others[1]->store()->add("count", 5), 5);
  for (int r = 1; r < kWorld; ++r) others[r]->Shutdown();
  const absl::Time start = absl::Now();
  (*rank0)->Shutdown();  // others left: no drain wait
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(others[1]->client()->health().ok());
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
