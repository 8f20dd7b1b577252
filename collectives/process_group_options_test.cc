// A group's life over one store (issue 38 items 2-4), ranks as threads over a
// c10d::HashStore: re-made with the same name over the same store (each
// construction a new generation), setTimeout, split and getBackendOptions.
// Oracles: the values each rank can compute itself, and c10d's own contract
// (split returns null outside the listed ranks).
#include <ATen/ATen.h>

#include <chrono>
#include <string>
#include <vector>

#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

using test_support::ErrorOf;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;

// The group made again and again with the same name over the same store (as
// env://'s multi-tenant TCPStore outlives destroy_process_group): every
// generation works. Before generations, a rank could read the previous
// generation's shm nonce from the store and fail with "shm_open(open)
// /tpud_...: No such file or directory".
TEST(GroupGenerationTest, RemadeOverTheSameStoreWithTheSameName) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("gen");
  constexpr int kWorld = 3;
  constexpr int kCycles = 25;
  RunRankThreads(kWorld, [&](int rank) {
    for (int i = 0; i < kCycles; ++i) {
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, kWorld, SmallOptions(job));
      std::vector<at::Tensor> t = {at::full({4}, float(rank + i), at::kFloat)};
      pg->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t[0], at::full({4}, float(3 + 3 * i), at::kFloat))) << "cycle " << i;
      pg->barrier()->wait();  // nobody destroys a generation a peer still maps
    }
  });
  // Keys of generation k live under tpu_dist/default/g<k>/ (place/<rank>: each
  // member's slice and host, ExchangePlacement).
  EXPECT_TRUE(store->check({"tpu_dist/default/g25/place/0"}));
  EXPECT_TRUE(ShmEntries("tpud_" + job).empty());
}

// setTimeout changes the deadline of ops issued afterwards: an allreduce one
// rank never joins fails after the new timeout, not the 20 s it was made with.
TEST(SetTimeoutTest, OpsIssuedAfterwardsTimeOutAtTheNewValue) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("tmo");
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, SmallOptions(job));
    EXPECT_EQ(pg->timeout(), std::chrono::seconds(20));
    pg->setTimeout(std::chrono::milliseconds(700));
    EXPECT_EQ(pg->timeout(), std::chrono::milliseconds(700));
    EXPECT_EQ(pg->getBackendOptions()->timeout, std::chrono::milliseconds(700));
    if (rank == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<at::Tensor> t = {at::ones({1024}, at::kFloat)};
      c10d::AllreduceOptions o;
      o.asyncOp = true;
      const std::string error = ErrorOf(pg->allreduce(t, o));
      const double elapsed = SecondsSince(t0);
      EXPECT_NE(error, "");
      EXPECT_GE(elapsed, 0.6) << error;
      EXPECT_LT(elapsed, 5.0) << error;
      store->set("rank0_done", std::vector<uint8_t>{1});
    } else {
      store->wait({"rank0_done"}, std::chrono::seconds(60));
    }
    EXPECT_THROW(pg->setTimeout(std::chrono::milliseconds(0)), c10::Error);
  });
}

// split: members get a group of the listed parent ranks in list order, others
// null; the child takes the timeout and name it is given and the parent's knobs.
TEST(SplitTest, ChildrenFollowTheListAndTheGivenOptions) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("split");
  const std::vector<int> members = {3, 1, 0};  // rank 2 is in no split
  RunRankThreads(4, [&](int rank) {
    ProcessGroupTpuDist::Options o = SmallOptions(job);
    o.group_name = "parent";
    o.shm_num_slots = 3;
    auto parent = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4, o);
    EXPECT_TRUE(parent->supportsSplitting());
    auto opts = parent->getBackendOptions()->clone();  // what torch's splitGroup does
    opts->group_name = "child";
    opts->timeout = std::chrono::seconds(42);
    auto child_store = c10::make_intrusive<c10d::PrefixStore>("child/", store);
    c10::intrusive_ptr<c10d::Backend> child = parent->split(child_store, members, opts);
    if (rank == 2) {
      EXPECT_FALSE(child);
      return;
    }
    ASSERT_TRUE(child);
    EXPECT_EQ(child->getSize(), 3);
    EXPECT_EQ(child->getRank(), rank == 3 ? 0 : rank == 1 ? 1 : 2);
    auto child_opts = c10::dynamic_intrusive_pointer_cast<ProcessGroupTpuDist::BackendOptions>(
        child->getBackendOptions());
    ASSERT_TRUE(child_opts);
    EXPECT_EQ(child_opts->group_name, "child");
    EXPECT_EQ(child_opts->timeout, std::chrono::seconds(42));
    EXPECT_EQ(child_opts->tpu_dist.shm_num_slots, 3);
    EXPECT_EQ(child_opts->tpu_dist.job_id, job);
    std::vector<at::Tensor> in = {at::full({2}, float(rank), at::kFloat)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < 3; ++r) out[0].push_back(at::empty({2}, at::kFloat));
    child->allgather(out, in)->wait();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal(out[0][r], at::full({2}, float(members[r]), at::kFloat))) << r;
    }
    // The parent is untouched.
    EXPECT_EQ(parent->getBackendOptions()->group_name, "parent");
    child->barrier()->wait();
  });
}

}  // namespace
}  // namespace tpudist::collectives
