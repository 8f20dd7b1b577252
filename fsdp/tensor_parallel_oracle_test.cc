// Our tensor-parallel styles against torch's parallelize_module
// (torch.distributed.tensor.parallel, Gloo, one process per rank):
// tests/oracles/dtensor_oracle.py parallelized small modules with torch's
// styles and stored, per world size and rank, the local output, the input
// gradient and every parameter's local gradient after
//   loss = sum((y_local - target_local)^2) / target.numel(); backward
// (tests/oracles/fixtures/dtensor/tensor_parallel.{json,safetensors}). Here
// the same full weights go into the same modules built from nn::Linear /
// nn::Embedding / nn::LayerNorm (hookable twins of torch's),
// our equivalent plan is applied, and the same step runs over the test
// backend. Models (tensor_parallel.json) and the plans on both sides:
//   ffn12  Linear(6,12) -> SiLU -> Linear(12,5), biases: w1 Colwise, w2 Rowwise
//   ffn10  the same with hidden 10 (uneven on 3, 4 ranks); torch needs
//          ColwiseParallel(use_local_output=False) for uneven, ours has no
//          such option and needs none
//   sp     LayerNorm(4) SequenceParallel, w1 Colwise(input S(1)), w2
//          Rowwise(output S(1)), x [1, 12, 4] sharded on the sequence
//   emb_rowwise  Embedding(11, 4) Rowwise, ids replicated: torch's
//          RowwiseParallel(input_layouts=Replicate()), ours' default
//   emb_rowwise_ids_sharded  torch's default RowwiseParallel() on an
//          Embedding, which declares the ids Shard(-1) and all-gathers them;
//          ours with input_layout = Shard(-1)
//   emb_colwise  Embedding(11, 6) Colwise (6 columns on 4 ranks: 2, 2, 2, 0)
// Bound: max|ours - torch| <= kTpRel * max|torch| per tensor (the local
// matmuls and reductions may round differently: torch adds the Rowwise bias
// as bias / n on every rank before the all_reduce, ours after it). torch
// leaves SequenceParallel's norm gradients Partial; the fixture holds them
// reduced, as ours all-reduces them in backward.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "fsdp/parallelize_module.h"
#include "testing/oracle_fixture.h"
#include "testing/device_mesh_ranks.h"
#include "gtest/gtest.h"
#include "nn/layers.h"

namespace tpudist::fsdp {
namespace {

using test_support::OracleFixture;
using test_support::RankContext;

constexpr double kTpRel = 1e-6;

// [norm] -> w1 -> SiLU -> w2 (tests/oracles/dtensor_oracle.py FeedForward).
struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(const std::vector<int64_t>& dims, bool with_norm) {
    if (with_norm) norm = register_module("norm", nn::LayerNorm(dims[0]));
    w1 = register_module("w1", nn::Linear(dims[0], dims[1]));
    w2 = register_module("w2", nn::Linear(dims[1], dims[2]));
  }
  // x: [..., in] -> [..., out]
  at::Tensor forward(at::Tensor x) {
    if (!norm.is_empty()) x = norm(x);
    return w2(at::silu(w1(x)));
  }
  nn::LayerNorm norm{nullptr};
  nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(FeedForward);

struct EmbedImpl : torch::nn::Module {
  explicit EmbedImpl(const std::vector<int64_t>& dims)
      : emb(register_module("emb", nn::Embedding(dims[0], dims[1]))) {}
  at::Tensor forward(const at::Tensor& ids) { return emb(ids); }  // [B, S] -> [B, S, dim]
  nn::Embedding emb{nullptr};
};
TORCH_MODULE(Embed);

// Our plan for the oracle's plan name (see the file comment).
ParallelizePlan OurPlan(const std::string& plan) {
  if (plan == "colwise_rowwise" || plan == "colwise_dtensor_rowwise") {
    return {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel()}};
  }
  if (plan == "sequence_colwise_rowwise") {
    ColwiseParallelOptions col;
    col.input_layout = Placement::Shard(1);
    RowwiseParallelOptions row;
    row.output_layout = Placement::Shard(1);
    return {{"norm", SequenceParallel(1)},
            {"w1", ColwiseParallel(col)},
            {"w2", RowwiseParallel(row)}};
  }
  if (plan == "rowwise") return {{"emb", RowwiseParallel()}};
  if (plan == "rowwise_default") {
    RowwiseParallelOptions row;
    row.input_layout = Placement::Shard(-1);
    return {{"emb", RowwiseParallel(row)}};
  }
  if (plan == "colwise") return {{"emb", ColwiseParallel()}};
  ADD_FAILURE() << "unknown plan " << plan;
  return {};
}

// torch.chunk(t, n, dim)[i], empty past the last piece.
at::Tensor Piece(const at::Tensor& t, int64_t n, int64_t dim, int64_t i) {
  std::vector<at::Tensor> pieces = t.chunk(n, dim);
  return i < static_cast<int64_t>(pieces.size()) ? pieces[i] : t.narrow(dim, 0, 0);
}

double MaxAbs(const at::Tensor& t) {
  return t.numel() == 0 ? 0.0 : t.abs().max().item<double>();
}

struct TpCase {
  std::string model;
  int world = 0;
};

class TensorParallelOracleTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelOracleTest, OutputAndGradsMatchTorch) {
  const TpCase tc = GetParam();
  auto fixture = OracleFixture::Load(test_support::OracleFixtureDir("dtensor"), "tensor_parallel");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const OracleFixture& f = **fixture;
  ASSERT_TRUE(f.manifest()["models"].contains(tc.model)) << tc.model;
  const nlohmann::json& spec = f.manifest()["models"][tc.model];
  const std::string kind = spec["kind"], plan = spec["plan"];
  const auto dims = spec["dims"].get<std::vector<int64_t>>();
  // Which dim of the input / output is sharded over the ranks (nullopt: none).
  const bool seq = kind == "sp";
  std::optional<int64_t> in_dim, out_dim;
  if (seq) in_dim = out_dim = 1;
  if (plan == "rowwise_default") in_dim = -1;
  if (plan == "colwise") out_dim = -1;
  const std::string prefix = absl::StrCat(tc.model, ".w", tc.world);
  std::mutex mu;
  double worst = 0;
  std::string worst_what;
  test_support::RunMeshRanks(tc.world, [&](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {tc.world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    std::shared_ptr<torch::nn::Module> model;
    std::function<at::Tensor(const at::Tensor&)> forward;
    if (kind == "emb") {
      Embed m(dims);
      model = m.ptr();
      forward = [m](const at::Tensor& x) mutable { return m(x); };
    } else {
      FeedForward m(dims, seq);
      model = m.ptr();
      forward = [m](const at::Tensor& x) mutable { return m(x); };
    }
    {
      at::NoGradGuard no_grad;
      for (auto& p : model->named_parameters()) {
        absl::StatusOr<at::Tensor> w = f.Get(absl::StrCat(tc.model, ".", p.key()));
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_EQ(p.value().sizes(), w->sizes()) << p.key();
        p.value().copy_(*w);
      }
    }
    absl::Status s = ParallelizeModule(model, *mesh, OurPlan(plan));
    ASSERT_TRUE(s.ok()) << s;
    const at::Tensor x = f.Get(tc.model + ".x").value();
    const at::Tensor target = f.Get(tc.model + ".target").value();
    at::Tensor x_local = (in_dim ? Piece(x, tc.world, *in_dim, ctx.rank) : x).clone();
    if (x_local.is_floating_point()) x_local.requires_grad_(true);
    const at::Tensor y = forward(x_local);
    const at::Tensor t_local = out_dim ? Piece(target, tc.world, *out_dim, ctx.rank) : target;
    ((y - t_local).pow(2).sum() / static_cast<double>(target.numel())).backward();

    std::vector<std::pair<std::string, at::Tensor>> ours = {{"y", y.detach()}};
    if (x_local.requires_grad()) ours.emplace_back("x_grad", x_local.grad());
    for (auto& p : model->named_parameters()) {
      ours.emplace_back("grad." + p.key(), p.value().grad());
    }
    for (const auto& [name, got] : ours) {
      const std::string what = absl::StrCat(prefix, " rank ", ctx.rank, " ", name);
      absl::StatusOr<std::vector<at::Tensor>> pieces = f.Pieces(prefix + "." + name);
      ASSERT_TRUE(pieces.ok()) << pieces.status();
      const at::Tensor& want = (*pieces)[ctx.rank];
      ASSERT_TRUE(got.defined()) << what << ": no gradient";
      ASSERT_EQ(got.sizes(), want.sizes()) << what;
      const double rel = MaxAbs(got - want) / std::max(MaxAbs(want), 1e-30);
      EXPECT_LE(rel, kTpRel) << what << ": max abs diff " << MaxAbs(got - want);
      std::lock_guard<std::mutex> l(mu);
      if (rel >= worst) std::tie(worst, worst_what) = std::make_tuple(rel, what);
    }
  });
  std::printf("%s: worst max|ours - torch| / max|torch| = %.3g (%s), bound %.0e\n", prefix.c_str(),
              worst, worst_what.c_str(), kTpRel);
}

std::vector<TpCase> AllCases() {
  std::vector<TpCase> out;
  for (const char* model :
       {"ffn12", "ffn10", "sp", "emb_rowwise", "emb_rowwise_ids_sharded", "emb_colwise"}) {
    for (int world : {2, 3, 4}) out.push_back({model, world});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelOracleTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<TpCase>& info) {
                           return absl::StrCat(info.param.model, "_world", info.param.world);
                         });

}  // namespace
}  // namespace tpudist::fsdp
