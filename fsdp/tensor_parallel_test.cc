// Tensor-parallel styles against the single-device computation: the
// feed-forward block x + w2(silu(w1(x))) (forward, input grad, w1/w2 grads),
// sequence parallel, embeddings, PrepareModuleInput, wrong styles, plans.
#include <atomic>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "fsdp/mesh_math.h"
#include "fsdp/parallelize_module.h"
#include "testing/device_mesh_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/layers.h"

namespace tpudist::fsdp {
namespace {

using ::testing::HasSubstr;
using test_support::RankContext;
using test_support::RunMeshRanks;

at::Tensor Random(std::vector<int64_t> shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

// FeedForward(hidden) = x + w2(SiLU(w1(x))), no bias.
// A HookableModule itself, so a plan can also put a style on the whole block.
struct FeedForwardImpl : nn::HookableModule {
  explicit FeedForwardImpl(int64_t hidden)
      : w1(register_module("w1", nn::Linear(hidden, 4 * hidden, /*bias=*/false))),
        w2(register_module("w2", nn::Linear(4 * hidden, hidden, /*bias=*/false))) {}
  at::Tensor forward(const at::Tensor& x) {  // [b, h]
    return RunForward(x, [&](const at::Tensor& in) { return in + w2(at::silu(w1(in))); });
  }
  nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(FeedForward);

// Deterministic weights independent of the global RNG (threads share it).
void InitWeights(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard g;
  for (auto& p : m.named_parameters()) p.value().copy_(Random(p.value().sizes().vec(), seed++) * 0.3);
}

at::Tensor Chunk(const at::Tensor& t, int64_t n, int64_t dim, int64_t i) {
  return t.chunk(n, dim)[i];
}

struct FfnResult {
  at::Tensor y, x_grad, w1_grad, w2_grad;
};

// Reference on one device: forward, loss = sum(y * g), backward.
FfnResult Reference(int64_t hidden, const at::Tensor& x_in, const at::Tensor& g) {
  FeedForward ffn(hidden);
  InitWeights(*ffn, 100);
  at::Tensor x = x_in.clone().requires_grad_(true);
  at::Tensor y = ffn(x);
  (y * g).sum().backward();
  return {y.detach(), x.grad(), ffn->w1->weight.grad(), ffn->w2->weight.grad()};
}

void ExpectClose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-5)) << what << " max_abs_diff " << diff;
}

class FeedForwardTpTest : public ::testing::TestWithParam<int> {};

TEST_P(FeedForwardTpTest, ColwiseRowwiseMatchesSingleDevice) {
  const int world = GetParam();
  const int64_t hidden = 6;  // 4h = 24: uneven over 3 and... even over 2, 4
  RunMeshRanks(world, [&](const RankContext& ctx) {
    const at::Tensor x0 = Random({5, hidden}, 1);
    const at::Tensor g = Random({5, hidden}, 2);
    const FfnResult ref = Reference(hidden, x0, g);

    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    FeedForward ffn(hidden);
    InitWeights(*ffn, 100);
    absl::Status s = ParallelizeModule(ffn.ptr(), *mesh,
                                       {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel()}});
    ASSERT_TRUE(s.ok()) << s;
    // Names unchanged, shapes are torch.chunk shards.
    auto params = ffn->named_parameters();
    ASSERT_TRUE(params.contains("w1.weight"));
    ASSERT_TRUE(params.contains("w2.weight"));
    EXPECT_EQ(params["w1.weight"].size(0), Chunk(at::zeros({4 * hidden}), world, 0, ctx.rank).size(0));

    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y = ffn(x);
    ExpectClose(y.detach(), ref.y, "forward");
    (y * g).sum().backward();
    ExpectClose(x.grad(), ref.x_grad, "x grad");
    ExpectClose(params["w1.weight"].grad(), Chunk(ref.w1_grad, world, 0, ctx.rank), "w1 grad");
    ExpectClose(params["w2.weight"].grad(), Chunk(ref.w2_grad, world, 1, ctx.rank), "w2 grad");
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, FeedForwardTpTest, ::testing::Values(1, 2, 3, 4));

// 2-D (dp, tp) mesh from a slice of 2 hosts x 2: TP runs on mesh["tp"]
// (inside a host); each dp replica computes its own batch.
TEST(TensorParallelTest, TwoDimMeshTpSliceMatchesSingleDevice) {
  const int64_t hidden = 4;
  tpu_runtime::SliceSpec slice;
  slice.accelerator_type = "v6e";
  slice.num_hosts = 2;
  slice.devices_per_host = 2;
  RunMeshRanks(4, [&](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMeshForSlice("tpu", slice, 2, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    absl::StatusOr<DeviceMesh> tp = mesh->Slice("tp");
    ASSERT_TRUE(tp.ok());
    EXPECT_EQ(tp->ranks()[0] / 2, ctx.rank / 2);  // same host
    // A 2-D mesh is refused by the TP entry point.
    FeedForward bad(hidden);
    EXPECT_EQ(ParallelizeModule(bad.ptr(), *mesh, {{"w1", ColwiseParallel()}}).code(),
              absl::StatusCode::kInvalidArgument);

    const int64_t dp = mesh->LocalRank(0);
    const at::Tensor x0 = Random({3, hidden}, 10 + dp);  // per-replica batch
    const at::Tensor g = Random({3, hidden}, 20 + dp);
    const FfnResult ref = Reference(hidden, x0, g);
    FeedForward ffn(hidden);
    InitWeights(*ffn, 100);
    ASSERT_TRUE(ParallelizeModule(ffn.ptr(), *tp,
                                  {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel()}})
                    .ok());
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y = ffn(x);
    ExpectClose(y.detach(), ref.y, "2-D forward");
    (y * g).sum().backward();
    ExpectClose(x.grad(), ref.x_grad, "2-D x grad");
    auto params = ffn->named_parameters();
    const int64_t t = tp->LocalRank(0);
    ExpectClose(params["w1.weight"].grad(), Chunk(ref.w1_grad, 2, 0, t), "2-D w1 grad");
    ExpectClose(params["w2.weight"].grad(), Chunk(ref.w2_grad, 2, 1, t), "2-D w2 grad");
  });
}

TEST(TensorParallelTest, WrongStyleIsDetected) {
  const int64_t hidden = 4;
  RunMeshRanks(2, [&](const RankContext& ctx) {
    const at::Tensor x0 = Random({3, hidden}, 1);
    const FfnResult ref = Reference(hidden, x0, at::ones({3, hidden}));
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    // Leaving w2's output Partial (no all-reduce) gives wrong numbers.
    FeedForward ffn(hidden);
    InitWeights(*ffn, 100);
    RowwiseParallelOptions partial_out;
    partial_out.output_layout = Placement::Partial();
    ASSERT_TRUE(ParallelizeModule(ffn.ptr(), *mesh,
                                  {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel(partial_out)}})
                    .ok());
    const double diff = (ffn(x0) - ref.y).abs().max().item<double>();
    EXPECT_GT(diff, 1e-3);
    // Swapped styles do not even fit: the layer reports it.
    FeedForward swapped(hidden);
    InitWeights(*swapped, 100);
    ASSERT_TRUE(ParallelizeModule(swapped.ptr(), *mesh,
                                  {{"w1", RowwiseParallel()}, {"w2", ColwiseParallel()}})
                    .ok());
    EXPECT_ANY_THROW(swapped(x0));
  });
}

TEST(TensorParallelTest, PlanErrors) {
  RunMeshRanks(2, [&](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    FeedForward ffn(4);
    EXPECT_EQ(ParallelizeModule(ffn.ptr(), *mesh, {{"w3", ColwiseParallel()}}).code(),
              absl::StatusCode::kNotFound);
    // A plain Linear child cannot take layout hooks.
    struct Plain : torch::nn::Module {
      Plain() { register_module("lin", torch::nn::Linear(2, 2)); }
    };
    auto plain = std::make_shared<Plain>();
    absl::Status s = ParallelizeModule(plain, *mesh, {{"lin", ColwiseParallel()}});
    EXPECT_THAT(std::string(s.message()), HasSubstr("not a HookableModule"));
    // A style on an unsupported module type.
    struct Holder : torch::nn::Module {
      Holder() {
        register_module("norm", nn::LayerNorm(4));
      }
    };
    auto holder = std::make_shared<Holder>();
    EXPECT_THAT(std::string(ParallelizeModule(holder, *mesh, {{"norm", ColwiseParallel()}}).message()),
                HasSubstr("supports nn::Linear"));
    ASSERT_TRUE(ParallelizeModule(ffn.ptr(), *mesh, {{"w*", ColwiseParallel()}}).ok());
    EXPECT_EQ(ParallelizeModule(ffn.ptr(), *mesh, {{"w1", ColwiseParallel()}}).code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

TEST(TensorParallelTest, FqnWildcards) {
  EXPECT_TRUE(FqnMatches("layers.*.w1", "layers.0.w1"));
  EXPECT_TRUE(FqnMatches("layers.*.w1", "layers.10.w1"));
  EXPECT_FALSE(FqnMatches("layers.*.w1", "layers.0.w2"));
  EXPECT_TRUE(FqnMatches("*", "a.b.c"));
  EXPECT_TRUE(FqnMatches("*.w2", "block.ffn.w2"));
  EXPECT_FALSE(FqnMatches("w1", "w11"));
  EXPECT_TRUE(FqnMatches("", ""));
}

// Embedding tables: rowwise (vocab shard, masked lookup, all-reduce) and
// colwise (embedding-dim shard), forward and weight grads vs one device.
TEST(TensorParallelTest, EmbeddingsMatchSingleDevice) {
  const int world = 3;
  RunMeshRanks(world, [&](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    const at::Tensor ids = at::tensor({0, 4, 9, 3, 9, 7}, at::kLong).reshape({2, 3});
    for (bool rowwise : {true, false}) {
      torch::nn::Embedding ref_emb(10, 5);  // the oracle: torch's own module
      InitWeights(*ref_emb, 7);
      at::Tensor g = Random({2, 3, 5}, 8);
      at::Tensor ref_y = ref_emb(ids);
      (ref_y * g).sum().backward();

      nn::Embedding emb(10, 5);
      InitWeights(*emb, 7);
      absl::Status s =
          ParallelizeModule(emb.ptr(), *mesh, {{"", rowwise ? RowwiseParallel() : ColwiseParallel()}});
      ASSERT_TRUE(s.ok()) << s;
      at::Tensor y = emb(ids);
      if (rowwise) {
        ExpectClose(y.detach(), ref_y.detach(), "rowwise embedding forward");
        (y * g).sum().backward();
        ExpectClose(emb->weight.grad(), Chunk(ref_emb->weight.grad(), world, 0, ctx.rank),
                    "rowwise embedding grad");
      } else {
        ExpectClose(y.detach(), Chunk(ref_y.detach(), world, -1, ctx.rank),
                    "colwise embedding forward");
        (y * Chunk(g, world, -1, ctx.rank)).sum().backward();
        ExpectClose(emb->weight.grad(), Chunk(ref_emb->weight.grad(), world, 1, ctx.rank),
                    "colwise embedding grad");
      }
    }
  });
}

// A block wrapped whole: PrepareModuleInput turns a batch-sharded input into
// a replicated one, inside it w1/w2 run colwise/rowwise ("*.w1" wildcards).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t h) : ffn(register_module("ffn", FeedForward(h))) {}
  at::Tensor forward(const at::Tensor& x) { return ffn(x); }
  FeedForward ffn{nullptr};
};
TORCH_MODULE(Block);

TEST(TensorParallelTest, PrepareModuleInputAndNestedPlan) {
  const int world = 2;
  const int64_t hidden = 4;
  RunMeshRanks(world, [&](const RankContext& ctx) {
    const at::Tensor x0 = Random({4, hidden}, 1);
    const at::Tensor g = Random({4, hidden}, 2);
    const FfnResult ref = Reference(hidden, x0, g);
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    Block block(hidden);
    InitWeights(*block, 100);
    absl::Status s = ParallelizeModule(
        block.ptr(), *mesh,
        {{"ffn", PrepareModuleInput(Placement::Shard(0), Placement::Replicate())},
         {"*.w1", ColwiseParallel()},
         {"*.w2", RowwiseParallel()}});
    ASSERT_TRUE(s.ok()) << s;
    auto params = block->named_parameters();
    ASSERT_TRUE(params.contains("ffn.w1.weight"));
    at::Tensor x = Chunk(x0, world, 0, ctx.rank).clone().requires_grad_(true);
    at::Tensor y = block(x);  // replicated [4, h]
    ExpectClose(y.detach(), ref.y, "block forward");
    (y * g).sum().backward();
    // The input was batch-sharded: its gradient is this rank's rows of the
    // full gradient, summed over the replicated uses.
    ExpectClose(x.grad(), Chunk(ref.x_grad, world, 0, ctx.rank), "block x grad");
    ExpectClose(params["ffn.w1.weight"].grad(), Chunk(ref.w1_grad, world, 0, ctx.rank), "w1 grad");
  });
}

// Sequence parallel: norm on the sequence shard, w1 colwise with a Shard(1)
// input (all-gather; reduce-scatter in backward), w2 rowwise back to
// Shard(1) (reduce-scatter). Needs reduce_scatter from the backend.
struct SpBlockImpl : torch::nn::Module {
  explicit SpBlockImpl(int64_t h)
      : norm(register_module("norm", nn::LayerNorm(h))),
        w1(register_module("w1", nn::Linear(h, 4 * h, /*bias=*/false))),
        w2(register_module("w2", nn::Linear(4 * h, h))) {}
  at::Tensor forward(const at::Tensor& x) { return x + w2(at::silu(w1(norm(x)))); }  // [b, s, h]
  nn::LayerNorm norm{nullptr};
  nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(SpBlock);

TEST(TensorParallelTest, SequenceParallelMatchesSingleDevice) {
  if (!test_support::BackendHasReduceScatter(test_support::TestBackend())) {
    GTEST_SKIP() << "backend " << test_support::TestBackend() << " has no reduce_scatter";
  }
  const int world = 2;
  const int64_t hidden = 4, seq = 6;
  RunMeshRanks(world, [&](const RankContext& ctx) {
    const at::Tensor x0 = Random({2, seq, hidden}, 1);
    const at::Tensor g = Random({2, seq, hidden}, 2);
    SpBlock ref(hidden);
    InitWeights(*ref, 50);
    at::Tensor rx = x0.clone().requires_grad_(true);
    at::Tensor ry = ref(rx);
    (ry * g).sum().backward();

    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    SpBlock sp(hidden);
    InitWeights(*sp, 50);
    ColwiseParallelOptions col;
    col.input_layout = Placement::Shard(1);
    RowwiseParallelOptions row;
    row.output_layout = Placement::Shard(1);
    absl::Status s = ParallelizeModule(sp.ptr(), *mesh,
                                       {{"norm", SequenceParallel()},
                                        {"w1", ColwiseParallel(col)},
                                        {"w2", RowwiseParallel(row)}});
    ASSERT_TRUE(s.ok()) << s;
    at::Tensor x = Chunk(x0, world, 1, ctx.rank).clone().requires_grad_(true);
    at::Tensor y = sp(x);
    ExpectClose(y.detach(), Chunk(ry.detach(), world, 1, ctx.rank), "sp forward");
    (y * Chunk(g, world, 1, ctx.rank)).sum().backward();
    ExpectClose(x.grad(), Chunk(rx.grad(), world, 1, ctx.rank), "sp x grad");
    auto p = sp->named_parameters();
    auto rp = ref->named_parameters();
    ExpectClose(p["norm.weight"].grad(), rp["norm.weight"].grad(), "norm weight grad");
    ExpectClose(p["w2.bias"].grad(), rp["w2.bias"].grad(), "w2 bias grad");
    ExpectClose(p["w1.weight"].grad(), Chunk(rp["w1.weight"].grad(), world, 0, ctx.rank), "w1");
    ExpectClose(p["w2.weight"].grad(), Chunk(rp["w2.weight"].grad(), world, 1, ctx.rank), "w2");
  });
}

// Multi-query attention in miniature: n query heads colwise (n/tp local), ONE
// key head replicated (ReplicateOutputWithPartialGrad: its output gradient is
// all-reduced), a per-head norm on q (ReplicateWithPartialGrad), o rowwise.
struct MqaImpl : torch::nn::Module {
  MqaImpl(int64_t h, int64_t n, int64_t d)
      : d(d),
        q(register_module("q", nn::Linear(h, n * d, /*bias=*/false))),
        k(register_module("k", nn::Linear(h, d, /*bias=*/false))),
        o(register_module("o", nn::Linear(n * d, h, /*bias=*/false))),
        q_norm(register_module("q_norm", nn::LayerNorm(d))) {}
  // x: [b, h] -> [b, h]
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0);
    at::Tensor heads = q_norm(q(x).view({b, -1, d}));   // [b, local heads, d]
    at::Tensor mixed = heads * k(x).unsqueeze(1);       // one key head for all
    return o(at::tanh(mixed).reshape({b, -1}));
  }
  int64_t d;
  nn::Linear q{nullptr}, k{nullptr}, o{nullptr};
  nn::LayerNorm q_norm{nullptr};
};
TORCH_MODULE(Mqa);

TEST(TensorParallelTest, PartialGradStylesMatchSingleDevice) {
  const int world = 2;
  const int64_t h = 6, n = 4, d = 3;
  RunMeshRanks(world, [&](const RankContext& ctx) {
    const at::Tensor x0 = Random({5, h}, 1);
    const at::Tensor g = Random({5, h}, 2);
    Mqa ref(h, n, d);
    InitWeights(*ref, 30);
    at::Tensor rx = x0.clone().requires_grad_(true);
    (ref(rx) * g).sum().backward();

    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {world}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok());
    for (bool with_partial_styles : {true, false}) {
      Mqa tp(h, n, d);
      InitWeights(*tp, 30);
      ParallelizePlan plan = {{"q", ColwiseParallel()}, {"o", RowwiseParallel()}};
      if (with_partial_styles) {
        plan.push_back({"k", ReplicateOutputWithPartialGrad()});
        plan.push_back({"q_norm", ReplicateWithPartialGrad()});
      }
      ASSERT_TRUE(ParallelizeModule(tp.ptr(), *mesh, plan).ok());
      at::Tensor x = x0.clone().requires_grad_(true);
      at::Tensor y = tp(x);
      ExpectClose(y.detach(), ref(x0).detach(), "mqa forward");
      (y * g).sum().backward();
      ASSERT_TRUE(AllReducePartialGrads(*tp).ok());
      const double k_diff = (tp->k->weight.grad() - ref->k->weight.grad()).abs().max().item<double>();
      const double n_diff =
          (tp->q_norm->weight.grad() - ref->q_norm->weight.grad()).abs().max().item<double>();
      if (with_partial_styles) {
        ExpectClose(x.grad(), rx.grad(), "mqa x grad");
        ExpectClose(tp->k->weight.grad(), ref->k->weight.grad(), "replicated k grad");
        ExpectClose(tp->q_norm->weight.grad(), ref->q_norm->weight.grad(), "q_norm grad");
        ExpectClose(tp->q->weight.grad(), Chunk(ref->q->weight.grad(), world, 0, ctx.rank), "q grad");
        const auto placements = TensorParallelPlacements(*tp);
        EXPECT_EQ(placements.at("q.weight").dim, 0);
        EXPECT_EQ(placements.at("q.weight").offset, ctx.rank * n * d / world);
        EXPECT_EQ(placements.at("o.weight").dim, 1);
        EXPECT_EQ(placements.at("k.weight").dim, -1);
        EXPECT_EQ(placements.at("q.weight").full_shape, (std::vector<int64_t>{n * d, h}));
        EXPECT_EQ(TensorParallelStyleOf(*tp->k), "ReplicateOutputWithPartialGrad");
      } else {
        // Without them the shared weights only see this rank's heads.
        EXPECT_GT(k_diff, 1e-4);
        EXPECT_GT(n_diff, 1e-4);
      }
    }
  });
}

}  // namespace
}  // namespace tpudist::fsdp
