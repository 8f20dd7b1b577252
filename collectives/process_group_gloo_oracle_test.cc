// tpu_dist through the torch 2.x c10d::ProcessGroup front end (the one-call
// factory, ops dispatched to the backend by device), checked against torch's
// own Gloo built the same way (NewGlooProcessGroup) on the same inputs.
//
// These are the ops torch 2.x's Gloo gained since 1.13 and that were compared
// only to single-process oracles before: reduce_scatter (list and tensor
// forms), allgather into one tensor, uneven alltoall_base, alltoall of lists,
// and bf16 reductions done natively by Gloo (no widening to fp32 first);
// and the coalesced forms torch 2.x's functional collectives call.
// Both groups use one HashStore; Gloo rounds bf16 after every add and we
// round once, so bf16 sums are compared within a few ulps of the result.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>
#include <tuple>
#include <vector>

#include "collectives/process_group_factory.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

using test_support::RunRankThreads;
using test_support::SmallOptions;
using test_support::UniqueJob;

// Deterministic per-(rank, salt) input: randn for floats, ints in [-50, 50).
// [n]
at::Tensor Input(int rank, int64_t n, at::ScalarType type, uint64_t salt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7919 * salt + rank);
  if (at::isFloatingType(type)) {
    return at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(type);
  }
  return at::randint(-50, 50, {n}, gen, at::TensorOptions().dtype(at::kLong)).to(type);
}

// Exact for integers; float sums within the reduction-order tolerance.
void ExpectSame(const at::Tensor& ours, const at::Tensor& gloo, int world,
                const std::string& what) {
  ASSERT_EQ(ours.scalar_type(), gloo.scalar_type()) << what;
  ASSERT_EQ(ours.sizes(), gloo.sizes()) << what;
  if (!at::isFloatingType(ours.scalar_type())) {
    EXPECT_TRUE(at::equal(ours, gloo)) << what;
    return;
  }
  double rtol = 1e-5, atol = 1e-5 * world;
  if (ours.scalar_type() == at::kBFloat16) rtol = 1.6e-2, atol = 2e-2 * world;
  const at::Tensor a = ours.to(at::kDouble), b = gloo.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, b, rtol, atol))
      << what << ": max diff " << (a - b).abs().max().item<double>();
}

// (world, element count, next to a foreign load): the last runs the shm
// paths taken next to a busy load (phases that run ahead, 8 slots).
class GlooOracleTest : public ::testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

TEST_P(GlooOracleTest, ProcessGroupOpsMatchGloo) {
  const auto [world, count, load] = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("pgo");
  RunRankThreads(world, [&, world = world, count = count, load = load](int rank) {
    ProcessGroupTpuDist::Options opts = SmallOptions(job);
    opts.group_name = "oracle";
    if (load) {
      opts.shm_assume_foreign_load = true;
      opts.shm_num_slots = 8;
    }
    c10::intrusive_ptr<c10d::ProcessGroup> ours =
        NewTpuDistProcessGroup(store, rank, world, opts);
    c10::intrusive_ptr<c10d::ProcessGroup> gloo = NewGlooProcessGroup(
        c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, world, "127.0.0.1",
        std::chrono::seconds(60), "oracle_gloo", /*threads=*/1);
    ASSERT_EQ(ours->getRank(), rank);
    ASSERT_EQ(ours->getSize(), world);
    ASSERT_TRUE(TpuDistBackendOf(ours));
    ASSERT_FALSE(TpuDistBackendOf(gloo));
    uint64_t salt = 0;

    // allreduce SUM natively in bf16 on both sides, and fp32/int64.
    for (at::ScalarType type : {at::kBFloat16, at::kFloat, at::kLong}) {
      std::vector<at::Tensor> a = {Input(rank, count, type, ++salt)};
      std::vector<at::Tensor> b = {a[0].clone()};
      ours->allreduce(a)->wait();
      gloo->allreduce(b)->wait();
      ExpectSame(a[0], b[0], world, std::string("allreduce ") + c10::toString(type));
    }
    // allgather into one tensor (all_gather_into_tensor), fp32 and bf16.
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      at::Tensor in = Input(rank, count, type, ++salt);  // [count]
      at::Tensor oa = at::empty({world * count}, type);  // [world * count]
      at::Tensor ob = at::empty({world * count}, type);
      at::Tensor in2 = in.clone();
      ours->_allgather_base(oa, in)->wait();
      gloo->_allgather_base(ob, in2)->wait();
      ExpectSame(oa, ob, world, std::string("allgather_into_tensor ") + c10::toString(type));
    }
    // reduce_scatter, list form and tensor form (reduce_scatter_tensor).
    for (at::ScalarType type : {at::kFloat, at::kLong}) {
      std::vector<std::vector<at::Tensor>> ins(1);
      for (int r = 0; r < world; ++r) ins[0].push_back(Input(rank, count, type, 100 * salt + r));
      std::vector<std::vector<at::Tensor>> ins2(1);
      for (auto& t : ins[0]) ins2[0].push_back(t.clone());
      std::vector<at::Tensor> oa = {at::empty({count}, type)};  // [count]
      std::vector<at::Tensor> ob = {at::empty({count}, type)};
      ours->reduce_scatter(oa, ins)->wait();
      gloo->reduce_scatter(ob, ins2)->wait();
      ExpectSame(oa[0], ob[0], world, std::string("reduce_scatter ") + c10::toString(type));

      at::Tensor flat = Input(rank, world * count, type, ++salt);  // [world * count]
      at::Tensor flat2 = flat.clone();
      at::Tensor ta = at::empty({count}, type), tb = at::empty({count}, type);
      ours->_reduce_scatter_base(ta, flat)->wait();
      gloo->_reduce_scatter_base(tb, flat2)->wait();
      ExpectSame(ta, tb, world, std::string("reduce_scatter_tensor ") + c10::toString(type));
    }
    // alltoall_base with uneven splits: rank r sends (r + p) % 3 + count rows
    // to peer p. [rows, 3]
    {
      std::vector<int64_t> in_split(world), out_split(world);
      int64_t in_rows = 0, out_rows = 0;
      for (int p = 0; p < world; ++p) {
        in_split[p] = (rank + p) % 3 + count;
        out_split[p] = (p + rank) % 3 + count;
        in_rows += in_split[p];
        out_rows += out_split[p];
      }
      at::Tensor in = Input(rank, in_rows * 3, at::kFloat, ++salt).view({in_rows, 3});
      at::Tensor in2 = in.clone();
      at::Tensor a = at::empty({out_rows, 3}), b = at::empty({out_rows, 3});
      std::vector<int64_t> os = out_split, is = in_split, os2 = out_split, is2 = in_split;
      ours->alltoall_base(a, in, os, is)->wait();
      gloo->alltoall_base(b, in2, os2, is2)->wait();
      ExpectSame(a, b, world, "alltoall_base uneven");
    }
    // alltoall of tensor lists (Gloo's needs equal sizes). [count] to each peer
    {
      std::vector<at::Tensor> in, in2, oa, ob;
      for (int p = 0; p < world; ++p) {
        in.push_back(Input(rank, count, at::kInt, 1000 + p));
        in2.push_back(in.back().clone());
        oa.push_back(at::empty({count}, at::kInt));
        ob.push_back(at::empty({count}, at::kInt));
      }
      ours->alltoall(oa, in)->wait();
      gloo->alltoall(ob, in2)->wait();
      for (int p = 0; p < world; ++p) ExpectSame(oa[p], ob[p], world, "alltoall");
    }
    // Coalesced forms (functional collectives, DTensor, FSDP2): two members
    // of different sizes each, one Work.
    {
      std::vector<at::Tensor> a = {Input(rank, count, at::kFloat, 300),
                                   Input(rank, count + 3, at::kFloat, 301)};
      std::vector<at::Tensor> b = {a[0].clone(), a[1].clone()};
      ours->allreduce_coalesced(a)->wait();
      gloo->allreduce_coalesced(b)->wait();
      for (int i = 0; i < 2; ++i) ExpectSame(a[i], b[i], world, "allreduce_coalesced");

      std::vector<at::Tensor> in = {Input(rank, count, at::kFloat, 302),
                                    Input(rank, count + 1, at::kFloat, 303)};
      std::vector<at::Tensor> in2 = {in[0].clone(), in[1].clone()};
      std::vector<at::Tensor> oa = {at::empty({world * count}), at::empty({world * (count + 1)})};
      std::vector<at::Tensor> ob = {at::empty({world * count}), at::empty({world * (count + 1)})};
      auto work = ours->allgather_into_tensor_coalesced(oa, in);
      work->wait();
      gloo->allgather_into_tensor_coalesced(ob, in2)->wait();
      for (int i = 0; i < 2; ++i) ExpectSame(oa[i], ob[i], world, "allgather_into_tensor_coalesced");
      EXPECT_EQ(work->result().size(), 2u);

      std::vector<at::Tensor> flat = {Input(rank, world * count, at::kFloat, 304),
                                      Input(rank, world * (count + 2), at::kFloat, 305)};
      std::vector<at::Tensor> ra = {at::empty({count}), at::empty({count + 2})};
      ours->reduce_scatter_tensor_coalesced(ra, flat)->wait();
      for (int i = 0; i < 2; ++i) {
        std::vector<at::Tensor> single = {at::empty_like(ra[i])};
        at::Tensor f = flat[i].clone();
        gloo->_reduce_scatter_base(single[0], f)->wait();
        ExpectSame(ra[i], single[0], world, "reduce_scatter_tensor_coalesced");
      }
    }
    ours->barrier()->wait();
    gloo->barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(
    WorldByCount, GlooOracleTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values<int64_t>(1, 37, 2500), ::testing::Values(false)),
    [](const auto& info) {
      return "w" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param));
    });
INSTANTIATE_TEST_SUITE_P(
    NextToABusyLoad, GlooOracleTest,
    ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values<int64_t>(2500),
                       ::testing::Values(true)),
    [](const auto& info) { return "w" + std::to_string(std::get<0>(info.param)) + "_n2500_load"; });

// The factory's group is a real c10d::ProcessGroup: the backend's errors
// reach the caller through it. As for any third-party backend, the front end
// reports the backend type "custom"; its CPU backend is ours.
TEST(ProcessGroupFactoryTest, NamesBackendAndPropagatesErrors) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("pgf");
  RunRankThreads(2, [&](int rank) {
    ProcessGroupTpuDist::Options opts = SmallOptions(job);
    opts.group_name = "factory";
    auto pg = NewTpuDistProcessGroup(store, rank, 2, opts);
    EXPECT_EQ(pg->getBackendName(), "custom");
    EXPECT_EQ(pg->getBackend(c10::DeviceType::CPU)->getBackendName(), "tpu_dist");
    EXPECT_EQ(pg->getGroupName(), "factory");
    std::vector<at::Tensor> bad = {at::ones({2}, at::kComplexFloat)};
    EXPECT_THROW(pg->allreduce(bad), c10::Error);
    std::vector<at::Tensor> t = {at::full({3}, rank + 1.0)};
    pg->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t[0], at::full({3}, 3.0)));
  });
}

}  // namespace
}  // namespace tpudist::collectives
