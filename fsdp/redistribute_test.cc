// Every redistribute transition on 1-D meshes (world 1..4) and a 2x2 mesh,
// even and uneven sizes, forward against the full tensor and backward
// against the single-process gradient. The oracle slices with ATen's
// torch.chunk, independently of fsdp/shard_math.
#include <atomic>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fsdp/dtensor.h"
#include "fsdp/mesh_math.h"
#include "fsdp/redistribute_plan.h"
#include "testing/device_mesh_ranks.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using test_support::RankContext;
using test_support::RunMeshRanks;

at::Tensor Random(std::vector<int64_t> shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

// Weight of coordinate c among n summands of a Partial: (c+1) / (n(n+1)/2);
// uneven on purpose so that "take rank 0" or "average" bugs show.
double PartialWeight(int64_t c, int64_t n) { return (c + 1) / (n * (n + 1) / 2.0); }

// This coordinate's piece of `full` placed as `placements`, by torch.chunk.
at::Tensor OracleLocal(const at::Tensor& full, const std::vector<int64_t>& mesh_shape,
                       const std::vector<int64_t>& coord, const Placements& placements) {
  at::Tensor t = full;
  for (size_t m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (p.is_shard()) {
      std::vector<at::Tensor> pieces = t.chunk(mesh_shape[m], p.dim());
      if (coord[m] < static_cast<int64_t>(pieces.size())) {
        t = pieces[coord[m]];
      } else {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[p.dim()] = 0;
        t = at::zeros(shape, t.options());
      }
    } else if (p.is_partial()) {
      t = t * PartialWeight(coord[m], mesh_shape[m]);
    }
  }
  return t.contiguous();
}

std::vector<Placements> AllPlacements(int mesh_ndim) {
  const Placements one = {Placement::Shard(0), Placement::Shard(1), Placement::Replicate(),
                          Placement::Partial()};
  std::vector<Placements> out = {{}};
  for (int m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const Placements& prefix : out) {
      for (const Placement& p : one) {
        Placements q = prefix;
        q.push_back(p);
        next.push_back(q);
      }
    }
    out = next;
  }
  return out;
}

bool UsesReduceScatter(const Placements& src, const Placements& dst) {
  for (const RedistributeStep& s : PlanRedistribute(src, dst)) {
    if (s.kind == StepKind::kReduceScatter) return true;
  }
  return false;
}

struct MeshCase {
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> tensor_shape;
};

std::string CaseName(const ::testing::TestParamInfo<MeshCase>& info) {
  return absl::StrCat("mesh", absl::StrJoin(info.param.mesh_shape, "x"), "_tensor",
                      absl::StrJoin(info.param.tensor_shape, "x"));
}

class RedistributeTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(RedistributeTest, EveryTransitionForwardAndBackward) {
  const MeshCase c = GetParam();
  const int world = static_cast<int>(MeshNumel(c.mesh_shape));
  const bool has_rs = test_support::BackendHasReduceScatter(test_support::TestBackend());
  std::atomic<int> skipped{0};
  std::atomic<int> checked{0};
  RunMeshRanks(world, [&](const RankContext& ctx) {
    std::vector<std::string> names;
    for (size_t i = 0; i < c.mesh_shape.size(); ++i) names.push_back(absl::StrCat("d", i));
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", c.mesh_shape, names, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    const at::Tensor x = Random(c.tensor_shape, 1);  // the logical tensor
    const at::Tensor w = Random(c.tensor_shape, 2);  // loss = sum(x * w): dL/dx = w
    const std::vector<Placements> all = AllPlacements(mesh->ndim());
    for (const Placements& src : all) {
      for (const Placements& dst : all) {
        const std::string what = absl::StrCat("rank ", ctx.rank, " ", PlacementsToString(src),
                                              " -> ", PlacementsToString(dst));
        if (!has_rs && UsesReduceScatter(src, dst)) {
          if (ctx.rank == 0) ++skipped;
          continue;
        }
        at::Tensor leaf =
            OracleLocal(x, mesh->shape(), mesh->coordinate(), src).detach().requires_grad_(true);
        absl::StatusOr<DTensor> d = FromLocal(leaf, *mesh, src, c.tensor_shape);
        ASSERT_TRUE(d.ok()) << what << ": " << d.status();
        absl::StatusOr<DTensor> e = Redistribute(*d, dst);
        ASSERT_TRUE(e.ok()) << what << ": " << e.status();
        EXPECT_EQ(e->placements(), dst) << what;
        bool dst_partial = false;
        for (const Placement& p : dst) dst_partial |= p.is_partial();
        if (!dst_partial) {
          const at::Tensor expected = OracleLocal(x, mesh->shape(), mesh->coordinate(), dst);
          ASSERT_EQ(e->local().sizes(), expected.sizes()) << what;
          EXPECT_TRUE(at::allclose(e->local(), expected, 1e-5, 1e-5)) << what;
        }
        // Backward: gradient of sum(x * w) through the transition.
        const at::Tensor w_dst =
            OracleLocal(w, mesh->shape(), mesh->coordinate(), DefaultGradPlacements(dst));
        (e->local() * w_dst).sum().backward();
        const at::Tensor w_src =
            OracleLocal(w, mesh->shape(), mesh->coordinate(), DefaultGradPlacements(src));
        ASSERT_TRUE(leaf.grad().defined()) << what;
        ASSERT_EQ(leaf.grad().sizes(), w_src.sizes()) << what;
        EXPECT_TRUE(at::allclose(leaf.grad(), w_src, 1e-5, 1e-5)) << what;
        // Forward value through the (tested-above) all-reduce/all-gather path.
        if (dst_partial) {
          absl::StatusOr<at::Tensor> full = FullTensor(*e);
          ASSERT_TRUE(full.ok()) << what << ": " << full.status();
          EXPECT_TRUE(at::allclose(*full, x, 1e-5, 1e-5)) << what;
        }
        if (ctx.rank == 0) ++checked;
      }
    }
  });
  std::printf("checked %d transitions, skipped %d needing reduce_scatter on %s\n", checked.load(),
              skipped.load(), test_support::TestBackend().c_str());
  EXPECT_GT(checked.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, RedistributeTest,
    ::testing::Values(MeshCase{{1}, {4, 6}}, MeshCase{{2}, {4, 6}}, MeshCase{{2}, {5, 3}},
                      MeshCase{{3}, {6, 9}}, MeshCase{{3}, {7, 2}}, MeshCase{{4}, {8, 4}},
                      MeshCase{{4}, {5, 3}}, MeshCase{{2, 2}, {4, 8}}, MeshCase{{2, 2}, {5, 3}}),
    CaseName);

TEST(DTensorTest, DistributeAndFullTensorRoundTrip) {
  RunMeshRanks(3, [](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {3}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    // Rank 1 and 2 pass garbage: src_data_rank 0 broadcasts rank 0's tensor.
    const at::Tensor x = Random({7, 2}, 5);
    const at::Tensor mine = ctx.rank == 0 ? x : at::zeros({7, 2});
    absl::StatusOr<DTensor> d = DistributeTensor(mine, *mesh, {Placement::Shard(0)});
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->local().size(0), ctx.rank < 2 ? 3 : 1);
    absl::StatusOr<at::Tensor> full = FullTensor(*d);
    ASSERT_TRUE(full.ok());
    EXPECT_TRUE(at::equal(*full, x));
    EXPECT_FALSE(DistributeTensor(x, *mesh, {Placement::Partial()}).ok());
    EXPECT_FALSE(DistributeTensor(x, *mesh, {Placement::Shard(2)}).ok());
    EXPECT_FALSE(FromLocal(at::zeros({2, 2}), *mesh, {Placement::Shard(0)}, {{7, 2}}).ok());
  });
}

TEST(DTensorTest, ReplicateToPartialSumDividesLikePyTorch) {
  RunMeshRanks(4, [](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {4}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    const at::Tensor x = Random({3}, 7);
    auto d = FromLocal(x, *mesh, {Placement::Replicate()});
    auto p = Redistribute(*d, {Placement::Partial()});
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(at::allclose(p->local(), x / 4));
    auto m = Redistribute(*d, {Placement::Partial(ReduceOp::kMax)});
    EXPECT_TRUE(at::equal(m->local(), x));
    // Partial(max) -> Replicate is a max all-reduce.
    auto pm = FromLocal(at::full({2}, static_cast<float>(ctx.rank)), *mesh,
                        {Placement::Partial(ReduceOp::kMax)});
    EXPECT_TRUE(at::equal(*FullTensor(*pm), at::full({2}, 3.0f)));
    auto pa = FromLocal(at::full({2}, static_cast<float>(ctx.rank)), *mesh,
                        {Placement::Partial(ReduceOp::kAvg)});
    EXPECT_TRUE(at::allclose(*FullTensor(*pa), at::full({2}, 1.5f)));
  });
}

TEST(DTensorTest, ToLocalWithPartialGradAllReducesInBackward) {
  RunMeshRanks(3, [](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {3}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    at::Tensor x = Random({4}, 3).requires_grad_(true);
    auto d = FromLocal(x, *mesh, {Placement::Replicate()});
    absl::StatusOr<at::Tensor> local = ToLocal(*d, {Placement::Partial()});
    ASSERT_TRUE(local.ok()) << local.status();
    // Each rank's local loss uses a different weight: the true gradient of
    // the summed loss is the sum of the weights.
    (*local * Random({4}, 10 + ctx.rank)).sum().backward();
    const at::Tensor expected = Random({4}, 10) + Random({4}, 11) + Random({4}, 12);
    EXPECT_TRUE(at::allclose(x.grad(), expected, 1e-5, 1e-5));
  });
}

}  // namespace
}  // namespace tpudist::fsdp
