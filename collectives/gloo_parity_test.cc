// Differential tests against ProcessGroupGloo (the oracle): both groups run
// over the same HashStore (Gloo under its own prefix) on the same random
// inputs; results must match exactly for integers and MIN/MAX, within a tight
// tolerance for float sums (the two reduce in different orders), and within
// bf16/fp16 rounding for 16-bit floats (Gloo rounds after every add, we
// round once).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <tuple>

#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using test_support::MakeGloo;
using test_support::RunRankThreads;
using test_support::SmallOptions;
using test_support::UniqueJob;

// Random input for `rank`, identical for both groups. [n]
at::Tensor RandomInput(int rank, int64_t n, at::ScalarType type, uint64_t salt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + rank);
  if (at::isFloatingType(type)) {
    return at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(type);
  }
  const int64_t hi = type == at::kByte ? 256 : type == at::kChar ? 128 : 1000;
  const int64_t lo = type == at::kByte ? 0 : type == at::kChar ? -128 : -1000;
  return at::randint(lo, hi, {n}, gen, at::TensorOptions().dtype(at::kLong)).to(type);
}

void ExpectMatch(const at::Tensor& ours, const at::Tensor& gloo, bool exact,
                 int world, const std::string& what) {
  ASSERT_EQ(ours.scalar_type(), gloo.scalar_type()) << what;
  if (exact || !at::isFloatingType(ours.scalar_type())) {
    EXPECT_TRUE(at::equal(ours, gloo)) << what;
    return;
  }
  double rtol = 1e-5, atol = 1e-5 * world;
  if (ours.scalar_type() == at::kBFloat16) rtol = 1.6e-2, atol = 2e-2 * world;
  if (ours.scalar_type() == at::kHalf) rtol = 2e-3, atol = 4e-3 * world;
  if (ours.scalar_type() == at::kDouble) rtol = 1e-12, atol = 1e-12 * world;
  EXPECT_TRUE(at::allclose(ours.to(at::kDouble), gloo.to(at::kDouble), rtol, atol))
      << what << " max diff "
      << (ours.to(at::kDouble) - gloo.to(at::kDouble)).abs().max().item<double>();
}

class GlooParityTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(GlooParityTest, SameResultsAsGloo) {
  const auto [world, count] = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("gp");
  RunRankThreads(world, [&, world = world, count = count](int rank) {
    auto ours = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world,
                                                         SmallOptions(job));
    auto gloo = MakeGloo(store, rank, world);
    uint64_t salt = 0;
    // allreduce over dtypes x ops.
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                at::kInt, at::kLong, at::kByte, at::kChar}) {
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN}) {
        ++salt;
        std::vector<at::Tensor> a = {RandomInput(rank, count, type, salt)};
        // bf16: the oracle here is Gloo's fp32 reduction of the widened
        // inputs, rounded once (our contract); Gloo's own bf16 kernels are
        // compared in process_group_gloo_oracle_test.cc.
        const bool widen = type == at::kBFloat16;
        std::vector<at::Tensor> b = {widen ? a[0].to(at::kFloat) : a[0].clone()};
        c10d::AllreduceOptions o;
        o.reduceOp = op;
        ours->allreduce(a, o)->wait();
        gloo->allreduce(b, o)->wait();
        if (widen) b[0] = b[0].to(type);
        ExpectMatch(a[0], b[0], op != c10d::ReduceOp::SUM, world,
                    "allreduce " + std::string(c10::toString(type)) + " op " +
                        std::to_string(int(op)));
      }
    }
    // allgather (float32 and bf16). Gloo's allgather divides by the element
    // count (SIGFPE on empty tensors), so it is the oracle only for count > 0.
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      if (count == 0) break;
      std::vector<at::Tensor> in = {RandomInput(rank, count, type, ++salt)};
      std::vector<std::vector<at::Tensor>> oa(1), ob(1);
      // Gloo moves bf16 as its 16-bit pattern (viewed as float16).
      const at::ScalarType gtype = type == at::kBFloat16 ? at::kHalf : type;
      for (int r = 0; r < world; ++r) {
        oa[0].push_back(at::empty({count}, type));
        ob[0].push_back(at::empty({count}, gtype));
      }
      ours->allgather(oa, in)->wait();
      std::vector<at::Tensor> in2 = {in[0].clone().view(gtype)};
      gloo->allgather(ob, in2)->wait();
      for (auto& t : ob[0]) t = t.view(type);
      for (int r = 0; r < world; ++r) ExpectMatch(oa[0][r], ob[0][r], true, world, "allgather");
    }
    // broadcast, reduce, gather, scatter with root world-1.
    const int root = world - 1;
    {
      std::vector<at::Tensor> a = {RandomInput(rank, count, at::kLong, ++salt)};
      std::vector<at::Tensor> b = {a[0].clone()};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      ours->broadcast(a, o)->wait();
      gloo->broadcast(b, o)->wait();
      ExpectMatch(a[0], b[0], true, world, "broadcast");
    }
    {
      std::vector<at::Tensor> a = {RandomInput(rank, count, at::kFloat, ++salt)};
      std::vector<at::Tensor> b = {a[0].clone()};
      c10d::ReduceOptions o;
      o.rootRank = root;
      ours->reduce(a, o)->wait();
      gloo->reduce(b, o)->wait();
      if (rank == root) ExpectMatch(a[0], b[0], false, world, "reduce");
    }
    {
      std::vector<at::Tensor> in = {RandomInput(rank, count, at::kInt, ++salt)};
      std::vector<std::vector<at::Tensor>> oa(rank == root), ob(rank == root);
      if (rank == root) {
        for (int r = 0; r < world; ++r) {
          oa[0].push_back(at::empty({count}, at::kInt));
          ob[0].push_back(at::empty({count}, at::kInt));
        }
      }
      c10d::GatherOptions o;
      o.rootRank = root;
      ours->gather(oa, in, o)->wait();
      std::vector<at::Tensor> in2 = {in[0].clone()};
      gloo->gather(ob, in2, o)->wait();
      if (rank == root) {
        for (int r = 0; r < world; ++r) ExpectMatch(oa[0][r], ob[0][r], true, world, "gather");
      }
    }
    {
      std::vector<std::vector<at::Tensor>> in(rank == root);
      if (rank == root) {
        for (int r = 0; r < world; ++r) in[0].push_back(RandomInput(r, count, at::kDouble, ++salt));
      }
      std::vector<at::Tensor> a = {at::empty({count}, at::kDouble)};
      std::vector<at::Tensor> b = {at::empty({count}, at::kDouble)};
      c10d::ScatterOptions o;
      o.rootRank = root;
      ours->scatter(a, in, o)->wait();
      gloo->scatter(b, in, o)->wait();
      ExpectMatch(a[0], b[0], true, world, "scatter");
    }
    // alltoall_base with even splits (Gloo 1.13 supports it on CPU).
    {
      at::Tensor in = RandomInput(rank, world * count, at::kFloat, 77);
      at::Tensor a = at::empty({world * count}, at::kFloat);
      at::Tensor b = at::empty({world * count}, at::kFloat);
      std::vector<int64_t> none;
      ours->alltoall_base(a, in, none, none)->wait();
      at::Tensor in2 = in.clone();
      gloo->alltoall_base(b, in2, none, none)->wait();
      ExpectMatch(a, b, true, world, "alltoall_base");
    }
    // barrier and send/recv.
    ours->barrier()->wait();
    gloo->barrier()->wait();
    if (world > 1) {
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      std::vector<at::Tensor> s = {RandomInput(rank, count, at::kFloat, 99)};
      std::vector<at::Tensor> ra = {at::empty({count}, at::kFloat)};
      std::vector<at::Tensor> rb = {at::empty({count}, at::kFloat)};
      auto w1 = ours->send(s, next, 3);
      ours->recv(ra, prev, 3)->wait();
      w1->wait();
      auto w2 = gloo->send(s, next, 3);
      gloo->recv(rb, prev, 3)->wait();
      w2->wait();
      ExpectMatch(ra[0], rb[0], true, world, "send/recv");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    WorldByCount, GlooParityTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values<int64_t>(0, 1, 37, 2500)),
    [](const auto& info) {
      return "w" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

// 16 ranks: allreduce only (Gloo with 16 threads on 2 cores is slow).
TEST(GlooParity16Test, AllreduceSum) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("gp16");
  RunRankThreads(16, [&](int rank) {
    auto ours = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 16, SmallOptions(job));
    auto gloo = MakeGloo(store, rank, 16);
    for (at::ScalarType type : {at::kFloat, at::kLong}) {
      std::vector<at::Tensor> a = {RandomInput(rank, 2500, type, 5)};
      std::vector<at::Tensor> b = {a[0].clone()};
      ours->allreduce(a)->wait();
      gloo->allreduce(b)->wait();
      ExpectMatch(a[0], b[0], false, 16, "allreduce16");
    }
  });
}

}  // namespace
}  // namespace tpudist::collectives
