// Our Redistribute against torch's own DTensor (torch.distributed.tensor,
// Gloo, one process per rank): tests/oracles/dtensor_oracle.py ran every case
// of tests/oracles/fixtures/dtensor/redistribute.json and stored each rank's
// to_local(). Here the same source is built on our side (DistributeTensor of
// the same global tensor, or FromLocal of the same per-rank Partial inputs),
// redistributed over the test backend (tpu_dist unless
// TPU_DIST_TEST_BACKEND says otherwise), and every rank's local piece is
// compared with torch's:
//   shape   identical (torch.chunk pieces, empty ones included);
//   values  bit-identical (max abs 0) when the source has no Partial: pure
//           data movement, plus the local zero-fill / division of a
//           transition to Partial;
//           max|ours - torch| <= kReductionRel * max|torch| when the source
//           is Partial: the all_reduce / reduce_scatter may add the ranks'
//           terms in another order than Gloo.
// A transition torch refuses (the manifest's torch_error) is listed, and
// ours is checked to keep the logical value (FullTensor before and after).
// A transition ours refuses fails the test, named in the summary.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fsdp/dtensor.h"
#include "fsdp/mesh_math.h"
#include "testing/oracle_fixture.h"
#include "testing/device_mesh_ranks.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using test_support::OracleFixture;
using test_support::RankContext;

constexpr double kReductionRel = 1e-6;

absl::StatusOr<Placement> ParsePlacement(const std::string& s) {
  if (s == "R") return Placement::Replicate();
  if (s.size() > 3 && s.rfind("S(", 0) == 0) return Placement::Shard(std::stoll(s.substr(2)));
  const std::vector<std::pair<std::string, ReduceOp>> ops = {
      {"P(sum)", ReduceOp::kSum}, {"P(avg)", ReduceOp::kAvg}, {"P(max)", ReduceOp::kMax},
      {"P(min)", ReduceOp::kMin}};
  for (const auto& [name, op] : ops) {
    if (s == name) return Placement::Partial(op);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown placement '", s, "'"));
}

Placements ParsePlacements(const nlohmann::json& list) {
  Placements out;
  for (const auto& s : list) {
    absl::StatusOr<Placement> p = ParsePlacement(s.get<std::string>());
    EXPECT_TRUE(p.ok()) << p.status();
    out.push_back(p.ok() ? *p : Placement::Replicate());
  }
  return out;
}

struct OracleCase {
  std::string id, input, out, torch_error;
  std::vector<int64_t> mesh, shape;
  Placements src, dst;
  bool partial_source = false;
  std::string Describe() const {
    return absl::StrCat(id, " mesh (", absl::StrJoin(mesh, "x"), ") global (",
                        absl::StrJoin(shape, ", "), ") ", PlacementsToString(src), " -> ",
                        PlacementsToString(dst));
  }
};

std::vector<OracleCase> CasesOnMesh(const OracleFixture& f, const std::vector<int64_t>& mesh) {
  std::vector<OracleCase> out;
  for (const auto& c : f.manifest()["cases"]) {
    if (c["mesh"].get<std::vector<int64_t>>() != mesh) continue;
    OracleCase k;
    k.id = c["id"];
    k.input = c["input"];
    k.out = c.value("out", "");
    k.torch_error = c.value("torch_error", "");
    k.mesh = mesh;
    k.shape = c["shape"].get<std::vector<int64_t>>();
    k.src = ParsePlacements(c["src"]);
    k.dst = ParsePlacements(c["dst"]);
    for (const Placement& p : k.src) k.partial_source |= p.is_partial();
    out.push_back(std::move(k));
  }
  return out;
}

double MaxAbs(const at::Tensor& t) {
  return t.numel() == 0 ? 0.0 : t.abs().max().item<double>();
}

// What the rank threads found, for the summary (guarded by mu).
struct Report {
  std::mutex mu;
  int exact = 0, reductions = 0;
  double worst_reduction_rel = 0;
  std::vector<std::string> torch_refuses, ours_refuses;
};

// One case on this rank. Every rank runs the same collectives whatever the
// outcome (no early return between collectives), so a mismatch cannot hang.
void RunCase(const OracleFixture& f, const OracleCase& c, const DeviceMesh& mesh, int rank,
             Report& report) {
  const std::string what = absl::StrCat(c.Describe(), " rank ", rank);
  absl::StatusOr<DTensor> src;
  if (c.partial_source) {
    absl::StatusOr<std::vector<at::Tensor>> inputs = f.Pieces(c.input);
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    src = FromLocal((*inputs)[rank], mesh, c.src, c.shape);
  } else {
    absl::StatusOr<at::Tensor> global = f.Get(c.input);
    ASSERT_TRUE(global.ok()) << global.status();
    src = DistributeTensor(*global, mesh, c.src, /*src_data_rank=*/std::nullopt);
  }
  ASSERT_TRUE(src.ok()) << what << ": " << src.status();
  absl::StatusOr<DTensor> dst = Redistribute(*src, c.dst);
  if (!dst.ok()) {
    std::lock_guard<std::mutex> l(report.mu);
    if (rank == 0) {
      report.ours_refuses.push_back(absl::StrCat(c.Describe(), ": ", dst.status().message()));
    }
    return;
  }
  if (!c.torch_error.empty()) {
    absl::StatusOr<at::Tensor> before = FullTensor(*src);
    absl::StatusOr<at::Tensor> after = FullTensor(*dst);
    ASSERT_TRUE(before.ok() && after.ok()) << what;
    EXPECT_LE(MaxAbs(*after - *before), kReductionRel * MaxAbs(*before))
        << what << ": value changed";
    std::lock_guard<std::mutex> l(report.mu);
    if (rank == 0) report.torch_refuses.push_back(c.Describe());
    return;
  }
  absl::StatusOr<std::vector<at::Tensor>> torch_out = f.Pieces(c.out);
  ASSERT_TRUE(torch_out.ok()) << torch_out.status();
  const at::Tensor& want = (*torch_out)[rank];
  const at::Tensor& got = dst->local();
  ASSERT_EQ(got.sizes(), want.sizes()) << what << ": local shape differs from torch's";
  const double diff = MaxAbs(got - want);
  std::lock_guard<std::mutex> l(report.mu);
  if (c.partial_source) {
    const double rel = diff / std::max(MaxAbs(want), 1e-30);
    EXPECT_LE(rel, kReductionRel) << what << ": max abs diff " << diff;
    report.worst_reduction_rel = std::max(report.worst_reduction_rel, rel);
    if (rank == 0) ++report.reductions;
  } else {
    EXPECT_EQ(diff, 0.0) << what << ": not bit-identical to torch";
    if (rank == 0) ++report.exact;
  }
}

class DTensorOracleTest : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(DTensorOracleTest, RedistributeMatchesTorchLocalShards) {
  const std::vector<int64_t> mesh_shape = GetParam();
  auto fixture = OracleFixture::Load(test_support::OracleFixtureDir("dtensor"), "redistribute");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const OracleFixture& f = **fixture;
  const std::vector<OracleCase> cases = CasesOnMesh(f, mesh_shape);
  ASSERT_FALSE(cases.empty()) << "no cases for mesh " << absl::StrJoin(mesh_shape, "x");
  Report report;
  test_support::RunMeshRanks(static_cast<int>(MeshNumel(mesh_shape)), [&](const RankContext& ctx) {
    std::vector<std::string> names;
    for (size_t i = 0; i < mesh_shape.size(); ++i) names.push_back(absl::StrCat("d", i));
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", mesh_shape, names, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    for (const OracleCase& c : cases) RunCase(f, c, *mesh, ctx.rank, report);
  });
  std::printf(
      "mesh %s on %s: %zu cases from torch %s: %d bit-identical, %d from Partial (worst "
      "max|ours - torch| / max|torch| = %.3g, bound %.0e)\n",
      absl::StrJoin(mesh_shape, "x").c_str(), test_support::TestBackend().c_str(), cases.size(),
      f.manifest()["torch"].get<std::string>().c_str(), report.exact, report.reductions,
      report.worst_reduction_rel, kReductionRel);
  std::printf("  torch refuses, ours runs (logical value kept): %zu\n",
              report.torch_refuses.size());
  for (const std::string& s : report.torch_refuses) std::printf("    %s\n", s.c_str());
  EXPECT_TRUE(report.ours_refuses.empty())
      << "transitions torch supports and ours refuses:\n  "
      << absl::StrJoin(report.ours_refuses, "\n  ");
  EXPECT_EQ(report.exact + report.reductions + report.torch_refuses.size() +
                report.ours_refuses.size(),
            cases.size());
}

std::string MeshName(const ::testing::TestParamInfo<std::vector<int64_t>>& info) {
  return absl::StrCat("mesh", absl::StrJoin(info.param, "x"));
}

INSTANTIATE_TEST_SUITE_P(Meshes, DTensorOracleTest,
                         ::testing::Values(std::vector<int64_t>{2}, std::vector<int64_t>{3},
                                           std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}),
                         MeshName);

}  // namespace
}  // namespace tpudist::fsdp
