// Locality per group from its members' (slice, host) placement, and the
// slice-hierarchical reductions (slice_backend.h) against ProcessGroupGloo
// over the same ranks: fp32 and bf16, counts that do not divide by the
// ranks per slice, slices of one or several hosts, interleaved placements.
// Emulated placement: every rank is a thread with its own host id / slice id.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/host_layout.h"
#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

using ::testing::IsEmpty;
using test_support::MakeGloo;
using test_support::RunRankThreads;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;

// Rank r: slice slices[r] - '0', host id "h<hosts[r]>".
ProcessGroupTpuDist::Options Placed(const std::string& job, const std::string& group,
                                    const std::string& slices, const std::string& hosts,
                                    int global_rank) {
  auto o = SmallOptions(job);
  o.group_name = group;
  o.host_id = std::string("h") + hosts[global_rank];
  o.slice_id = slices[global_rank] - '0';
  o.bind_address = "127.0.0.1";
  o.multi_rail_min_bytes = 0;
  return o;
}

// Small integers (exact in bf16 sums over <= 8 ranks).
at::Tensor Input(int rank, int64_t n, at::ScalarType type, int salt = 0) {
  return ((at::arange(n, at::kLong) * 7 + rank * 13 + salt) % 11 - 5).to(type);
}

// 2 slices x 2 hosts x 2 ranks. Host ids repeat across slices ("h0" is a
// host of slice 0 and another of slice 1): the slice id keeps them apart.
// Each subgroup is made only by its members, from what they publish.
TEST(LocalityTest, EachSubgroupPicksItsLinkFromItsMembersPlacement) {
  const std::string slices = "00001111", hosts = "00110011";
  struct Sub {
    std::vector<int> ranks;
    Locality want;
    int hosts, slices;
  };
  const std::vector<Sub> subs = {
      {{0, 1}, Locality::kShm, 1, 1},         // one host
      {{4, 6}, Locality::kIntraSlice, 2, 1},  // two hosts of slice 1
      {{1, 5}, Locality::kDcn, 2, 2},         // the same host id in two slices
      {{0, 1, 2, 3, 4, 5, 6, 7}, Locality::kDcn, 4, 2},
  };
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("loc");
  RunRankThreads(8, [&](int rank) {
    for (size_t g = 0; g < subs.size(); ++g) {
      const auto& ranks = subs[g].ranks;
      const auto it = std::find(ranks.begin(), ranks.end(), rank);
      if (it == ranks.end()) continue;
      const int sub_rank = static_cast<int>(it - ranks.begin());
      const int n = static_cast<int>(ranks.size());
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(
          c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("g", g), store), sub_rank, n,
          Placed(job, absl::StrCat("sub", g), slices, hosts, rank));
      EXPECT_EQ(LocalityOf(pg->host_layout()), subs[g].want)
          << "group " << g << " rank " << rank << ": "
          << LocalityName(LocalityOf(pg->host_layout()));
      EXPECT_EQ(pg->host_layout().num_hosts(), subs[g].hosts) << "group " << g;
      EXPECT_EQ(pg->host_layout().num_slices(), subs[g].slices) << "group " << g;
      // And the group works: sum of the members' global ranks.
      std::vector<at::Tensor> t = {at::full({5}, rank, at::kFloat)};
      pg->allreduce(t)->wait();
      int want = 0;
      for (int r : ranks) want += r;
      EXPECT_TRUE(at::equal(t[0], at::full({5}, want, at::kFloat))) << "group " << g;
    }
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// (slices, hosts, count): rank r's slice / host digit.
class SliceTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, int64_t>> {};

TEST_P(SliceTest, ReductionsMatchGloo) {
  const auto [slices, hosts, count] = GetParam();
  const int world = static_cast<int>(slices.size());
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("slice");
  RunRankThreads(world, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(
        c10::make_intrusive<c10d::PrefixStore>("td", store), rank, world,
        Placed(job, "world", slices, hosts, rank));
    ASSERT_EQ(LocalityOf(pg->host_layout()), Locality::kDcn);
    auto gloo = MakeGloo(store, rank, world);
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      const std::string tn = c10::toString(type);
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::MAX}) {
        at::Tensor in = Input(rank, count, type);
        std::vector<at::Tensor> a = {in.clone()}, b = {in.clone()};
        c10d::AllreduceOptions ao, go;
        ao.reduceOp = op;
        go.reduceOp = op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
        pg->allreduce(a, ao)->wait();
        gloo->allreduce(b, go)->wait();
        at::Tensor expect = op == c10d::ReduceOp::AVG ? (b[0].to(at::kFloat) / world).to(type)
                                                      : b[0];
        EXPECT_TRUE(at::equal(a[0], expect))
            << "allreduce " << tn << " op " << int(op) << " rank " << rank;
      }
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX}) {
        at::Tensor full = Input(rank, world * count, type, 3);
        at::Tensor out = at::full({count}, 99, type);
        c10d::ReduceScatterOptions ro;
        ro.reduceOp = op;
        pg->_reduce_scatter_base(out, full, ro)->wait();
        std::vector<at::Tensor> b = {full.clone()};
        c10d::AllreduceOptions go;
        go.reduceOp = op;
        gloo->allreduce(b, go)->wait();
        EXPECT_TRUE(at::equal(out, b[0].narrow(0, rank * count, count)))
            << "reduce_scatter " << tn << " op " << int(op) << " rank " << rank;
      }
      {
        std::vector<at::Tensor> in = {Input(rank, count, type, 5)};
        std::vector<std::vector<at::Tensor>> oa(1), ob(1);
        for (int r = 0; r < world; ++r) {
          oa[0].push_back(at::full({count}, 99, type));
          ob[0].push_back(at::empty({count}, type));
        }
        pg->allgather(oa, in)->wait();
        gloo->allgather(ob, in)->wait();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(at::equal(oa[0][r], ob[0][r])) << "allgather " << tn << " from " << r;
        }
      }
      {  // an op the whole-group backend runs
        std::vector<at::Tensor> a = {Input(rank, count, type, 7)}, b = {a[0].clone()};
        c10d::BroadcastOptions bo;
        bo.rootRank = world - 1;
        pg->broadcast(a, bo)->wait();
        gloo->broadcast(b, bo)->wait();
        EXPECT_TRUE(at::equal(a[0], b[0])) << "broadcast " << tn;
      }
    }
    EXPECT_TRUE(pg->status().ok()) << pg->status();
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(
    Placements, SliceTest,
    ::testing::Values(
        // 2 slices x 2 hosts x 2 ranks, slice-major; 1001 does not divide by 4.
        std::make_tuple("00001111", "00110011", int64_t{1001}),
        std::make_tuple("00001111", "00110011", int64_t{3}),
        // 2 slices of one host each; slices interleaved over the ranks.
        std::make_tuple("0101", "0101", int64_t{257}),
        // 3 slices of one rank: DCN only.
        std::make_tuple("012", "012", int64_t{100})));

}  // namespace
}  // namespace tpudist::collectives
