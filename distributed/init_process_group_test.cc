// InitProcessGroup / MakeGroupFactory end to end: ranks as threads of this
// process, over a given store and over the TCPStore that MASTER_ADDR /
// MASTER_PORT name, with tpu_dist and with Gloo (the oracle).
#include "distributed/init_process_group.h"

#include <unistd.h>

#include <cstdlib>
#include <thread>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "collectives/flight_recorder_dump.h"
#include "collectives/process_group_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/free_port.h"
#include "testing/rank_threads.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::distributed {
namespace {

namespace tr = ::tpudist::tpu_runtime;

// allreduce SUM of (rank + 1) * [1, 2, 3] over `pg`.
at::Tensor SumOf(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int rank) {
  std::vector<at::Tensor> t = {at::arange(1, 4, at::kFloat) * (rank + 1)};  // [3]
  pg->allreduce(t)->wait();
  return t[0];
}

// The world group's CPU backend is ProcessGroupTpuDist (else Gloo's).
bool IsTpuDist(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  return collectives::TpuDistBackendOf(pg) != nullptr;
}

TEST(MakeGroupFactoryTest, TpuDistAndGlooAgreeOnSubgroups) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int world = 4;
  ::tpudist::test_support::RunRankThreads(world, [&](int rank) {
    // Pairs {0,2} and {1,3}: one strided subgroup per rank.
    const std::vector<int> ranks = {rank % 2, rank % 2 + 2};
    const int group_rank = rank / 2;
    for (const char* backend : {"tpu_dist", "gloo"}) {
      GroupInitOptions o;
      o.backend = backend;
      o.group_name = "factory_test";
      o.job_id = absl::StrCat("dist_test_", getpid());
      o.timeout = absl::Seconds(30);
      o.gloo_threads = 1;
      absl::StatusOr<GroupConfig> c = ResolveGroupConfig(nullptr, {}, o);
      ASSERT_TRUE(c.ok()) << c.status();
      const GroupFactory factory = MakeGroupFactory(*c);
      auto sub = c10::make_intrusive<c10d::PrefixStore>(
          absl::StrCat(backend, "/", GroupNameFor("factory_test", ranks)), store);
      absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = factory(sub, group_rank, ranks);
      ASSERT_TRUE(pg.ok()) << pg.status();
      EXPECT_EQ(IsTpuDist(*pg), std::string(backend) == "tpu_dist");
      EXPECT_EQ((*pg)->getSize(), 2);
      const float scale = (ranks[0] + 1) + (ranks[1] + 1);
      EXPECT_TRUE(at::equal(SumOf(*pg, rank), at::arange(1, 4, at::kFloat) * scale))
          << backend << " rank " << rank;
    }
  });
}

// Subgroups made over the job's one store, as Job::NewGroup does (no prefix
// added by the caller): each group namespaces its own keys, for Gloo too
// (two equal-size Gloo groups once read each other's addresses and hung),
// and the flight recorder files a subgroup's ops under its global ranks.
TEST(NewGroupTest, SubgroupsOverOneStoreAndFlightRecorderByGlobalRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int world = 4;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> ours(world);
  ::tpudist::test_support::RunRankThreads(world, [&](int rank) {
    const std::vector<int> ranks = {rank % 2, rank % 2 + 2};  // {0,2} or {1,3}
    for (const char* backend : {"gloo", "tpu_dist", "gloo"}) {
      GroupInitOptions o;
      o.backend = backend;
      o.group_name = "pairs";
      o.job_id = absl::StrCat("dist_pairs_", getpid());
      o.timeout = absl::Seconds(20);
      o.gloo_threads = 1;
      absl::StatusOr<GroupConfig> c = ResolveGroupConfig(nullptr, {}, o);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg =
          NewGroup(*c, store, rank / 2, ranks);
      ASSERT_TRUE(pg.ok()) << pg.status();
      const float scale = (ranks[0] + 1) + (ranks[1] + 1);
      EXPECT_TRUE(at::equal(SumOf(*pg, rank), at::arange(1, 4, at::kFloat) * scale))
          << backend << " rank " << rank;
      if (IsTpuDist(*pg)) ours[rank] = *pg;
    }
  });
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/pairs_fr_", getpid(), "_");
  absl::StatusOr<std::vector<std::string>> paths =
      collectives::DumpFlightRecorders(prefix, "test", /*quiet=*/true);
  ASSERT_TRUE(paths.ok()) << paths.status();
  std::vector<std::string> expected;
  for (int r = 0; r < world; ++r) expected.push_back(absl::StrCat(prefix, r));
  EXPECT_THAT(*paths, ::testing::UnorderedElementsAreArray(expected));
  for (const std::string& p : *paths) unlink(p.c_str());
}

TEST(MakeGroupFactoryTest, BadGroupRankIsAnError) {
  absl::StatusOr<GroupConfig> c = ResolveGroupConfig(nullptr, {}, GroupInitOptions{});
  ASSERT_TRUE(c.ok());
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg =
      NewGroup(*c, c10::make_intrusive<c10d::HashStore>(), 2, {0, 1});
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kInvalidArgument);
}

// The group's host layout follows each rank's RankInfo::host_index, not
// the TPU_* variables of its environment: here every rank's environment says
// TPU_WORKER_ID=0 (stale), its RankInfo says host `rank` -> two hosts (shm
// inside none, TCP between). Without a RankInfo, per-rank TPU_WORKER_IDs
// place nothing: one host (the old rule read them and made two).
TEST(InitProcessGroupTest, HostLayoutFollowsTheRankInfo) {
  const int world = 2;
  for (const bool with_info : {true, false}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    ::tpudist::test_support::RunRankThreads(world, [&](int rank) {
      tr::RankInfo info;
      info.rank = rank;
      info.world_size = world;
      info.host_index = rank;
      info.num_hosts = world;
      info.hostnames = {"127.0.0.1", "127.0.0.1"};
      const tr::EnvMap env = {
          {"TPU_WORKER_ID", with_info ? "0" : std::to_string(rank)},
          {"TPU_WORKER_HOSTNAMES", "127.0.0.1,127.0.0.1"}};
      GroupInitOptions o;
      o.group_name = with_info ? "placed" : "unplaced";
      o.job_id = absl::StrCat("dist_place_", getpid());
      o.timeout = absl::Seconds(30);
      absl::StatusOr<GroupConfig> c = ResolveGroupConfig(with_info ? &info : nullptr, env, o);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg =
          NewGroup(*c, store, rank, {0, 1});
      ASSERT_TRUE(pg.ok()) << pg.status();
      const c10::intrusive_ptr<collectives::ProcessGroupTpuDist> backend =
          collectives::TpuDistBackendOf(*pg);
      ASSERT_TRUE(backend);
      EXPECT_EQ(backend->host_layout().num_hosts(), with_info ? 2 : 1) << "rank " << rank;
      EXPECT_TRUE(at::equal(SumOf(*pg, rank), at::arange(1, 4, at::kFloat) * 3));
      (*pg)->barrier()->wait();
    });
  }
}

// The store comes from MASTER_ADDR / MASTER_PORT (rank 0 hosts it), as
// torch's env:// does.
TEST(InitProcessGroupTest, WorldGroupOverTheMasterTcpStore) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  const int world = 2;
  for (const char* backend : {"tpu_dist", "gloo"}) {
    const std::string port = std::to_string(::tpudist::test_support::FreePort());
    setenv("MASTER_PORT", port.c_str(), 1);
    ::tpudist::test_support::RunRankThreads(world, [&](int rank) {
      tr::RankInfo info;
      info.rank = rank;
      info.world_size = world;
      info.job_id = absl::StrCat("dist_init_", getpid());
      GroupInitOptions o;
      o.backend = backend;
      o.group_name = absl::StrCat("init_", backend);
      o.timeout = absl::Seconds(30);
      absl::StatusOr<InitializedGroup> g = InitProcessGroup(info, o);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->config.tcp_store.master_port, std::stoi(port));
      EXPECT_EQ(g->config.tpu_dist.host_id, "slice_host_0");
      EXPECT_EQ(IsTpuDist(g->group), std::string(backend) == "tpu_dist");
      EXPECT_TRUE(at::equal(SumOf(g->group, rank), at::arange(1, 4, at::kFloat) * 3)) << backend;
      g->group->barrier()->wait();  // rank 0's store outlives the others' use
    });
  }
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
}

TEST(InitProcessGroupTest, BadMasterPortNamesTheVariable) {
  setenv("MASTER_PORT", "not-a-port", 1);
  tr::RankInfo info;
  absl::StatusOr<InitializedGroup> g = InitProcessGroup(info, GroupInitOptions{});
  unsetenv("MASTER_PORT");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr("MASTER_PORT"));
}

}  // namespace
}  // namespace tpudist::distributed
