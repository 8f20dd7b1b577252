// GenerationStore (the per-construction namespace of a group's rendezvous
// keys) and the groups built on it: several Gloo and tpu_dist groups over one
// store, as a job makes them (world, then subgroups of disjoint members, then
// the world re-made), each reaches its own members. Without the namespaces,
// Gloo subgroups read each other's (and the world's) "rank_<r>" addresses
// and hung: slice_check --gloo-parity under tpurun --num-slices 2 hung in
// about one run of three, in Gloo's connect or first all_reduce.
#include "collectives/generation_store.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "collectives/process_group_factory.h"
#include "gtest/gtest.h"
#include "testing/collectives_util.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives {
namespace {

using test_support::RunRankThreads;
using test_support::SmallOptions;
using test_support::UniqueJob;

std::string Read(c10d::Store& store, const std::string& key) {
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

TEST(GenerationStoreTest, EachConstructionHasItsOwnPrefix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto first = GenerationStore(store, "gloo", "dp_0_2", /*rank=*/0);
  auto second = GenerationStore(store, "gloo", "dp_0_2", /*rank=*/0);
  auto other_rank = GenerationStore(store, "gloo", "dp_0_2", /*rank=*/2);
  auto other_backend = GenerationStore(store, "tpu_dist", "dp_0_2", /*rank=*/0);
  first->set("k", std::vector<uint8_t>{'1'});
  second->set("k", std::vector<uint8_t>{'2'});
  other_rank->set("k", std::vector<uint8_t>{'3'});
  other_backend->set("k", std::vector<uint8_t>{'4'});
  // Rank 2's first construction meets rank 0's first (both g1).
  EXPECT_EQ(Read(*store, "gloo/dp_0_2/g1/k"), "3");
  EXPECT_EQ(Read(*store, "gloo/dp_0_2/g2/k"), "2");
  EXPECT_EQ(Read(*store, "tpu_dist/dp_0_2/g1/k"), "4");
  EXPECT_EQ(Read(*store, "gloo/dp_0_2/generation/0"), "2");
  EXPECT_FALSE(store->check({"k"}));
}

// 4 ranks over one store: world, {0,2} and {1,3} (same size: their group
// rank 0s would share every key), the world again; Gloo and tpu_dist side by
// side. Every all_reduce sums exactly its own members' ranks.
TEST(GenerationStoreTest, GlooAndTpuDistSubgroupsOverOneStoreReachTheirOwnMembers) {
  constexpr int kWorld = 4;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("gen");
  RunRankThreads(kWorld, [&](int rank) {
    const std::vector<int> mine = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    const std::string pair = absl::StrCat("pair_", mine[0], "_", mine[1]);
    struct Case {
      std::string what;
      c10::intrusive_ptr<c10d::ProcessGroup> pg;
      double expected;
    };
    std::vector<Case> cases;
    for (int round = 0; round < 2; ++round) {
      cases.push_back({"gloo world", NewGlooProcessGroup(store, rank, kWorld, "127.0.0.1",
                                                         std::chrono::seconds(10), "world"),
                       6.0});
      cases.push_back({"gloo " + pair, NewGlooProcessGroup(store, rank / 2, 2, "127.0.0.1",
                                                           std::chrono::seconds(10), pair),
                       double(mine[0] + mine[1])});
      ProcessGroupTpuDist::Options o = SmallOptions(job);
      o.timeout = std::chrono::seconds(10);
      o.group_name = pair;
      cases.push_back({"tpu_dist " + pair, NewTpuDistProcessGroup(store, rank / 2, 2, o),
                       double(mine[0] + mine[1])});
    }
    for (Case& c : cases) {
      std::vector<at::Tensor> t = {at::full({3}, double(rank), at::kDouble)};
      ASSERT_EQ(test_support::ErrorOf(c.pg->allreduce(t), std::chrono::seconds(15)), "")
          << "rank " << rank << ": " << c.what;
      EXPECT_TRUE(at::all(t[0] == c.expected).item<bool>())
          << "rank " << rank << ": " << c.what << " gave " << t[0][0].item<double>()
          << ", expected " << c.expected;
    }
  });
}

}  // namespace
}  // namespace tpudist::collectives
