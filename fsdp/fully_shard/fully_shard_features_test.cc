// FullyShard features: memory, mixed precision, frozen/ignored params,
// gradient accumulation + clipping, prefetch order, bad input.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/fully_shard/fully_shard.h"
#include "fsdp/fully_shard/grad_clip.h"
#include "testing/fsdp_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::HasSubstr;
using test_support::MlpStack;
using test_support::MlpStackImpl;
using test_support::Rank;
using test_support::RelErr;
using test_support::RunMeshRanks;

FsdpModule ShardStack(const MlpStack& m, const DeviceMesh& mesh, FullyShardOptions o = {}) {
  const char* names[] = {"b0", "b1", "b2"};
  int i = 0;
  for (auto b : {m->b0, m->b1, m->b2}) {
    FullyShardOptions bo = o;
    bo.label = names[i++];
    EXPECT_TRUE(FullyShard(b.ptr(), mesh, bo).ok());
  }
  o.label = "root";
  auto root = FullyShard(m.ptr(), mesh, o);
  EXPECT_TRUE(root.ok()) << root.status();
  return *root;
}

int64_t StateBytes(torch::optim::AdamW& opt) {
  int64_t bytes = 0;
  for (const auto& [key, st] : opt.state()) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*st);
    bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
  }
  return bytes;
}

// Per-rank params + grads + AdamW state is 1/W of the unsharded total (up to
// one padding row per parameter and tensor); full parameters alive at once
// never exceed the root's group plus two layer groups (current + prefetch).
TEST(FullyShardMemoryTest, ShardedBytesAreOneOverWorld) {
  constexpr int kWorld = 4;
  torch::manual_seed(3);
  MlpStack init;
  const at::Tensor x = torch::randn({8, 5}), y = torch::randn({8, 3});
  int64_t total = 0, slack = 0;
  for (const auto& p : init->parameters()) {
    total += 4 * p.nbytes();  // param, grad, exp_avg, exp_avg_sq
    slack += 4 * (p.nbytes() / p.size(0));
  }
  std::mutex mu;
  int64_t sum_over_ranks = 0;
  RunMeshRanks(kWorld, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    FsdpModule root = ShardStack(model, mesh);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      at::mse_loss(model->forward(x.narrow(0, 2 * r.rank, 2)), y.narrow(0, 2 * r.rank, 2)).backward();
      opt.step();
    }
    int64_t mine = StateBytes(opt);
    for (const auto& p : model->parameters()) mine += p.nbytes() + p.grad().nbytes();
    {
      std::lock_guard<std::mutex> l(mu);
      sum_over_ranks += mine;
    }
    EXPECT_LE(mine, total / kWorld + slack) << "rank " << r.rank;
    int64_t root_bytes = root.group().full_param_bytes(), layer_max = 0;
    for (const FsdpModule& m : root.Subtree()) {
      if (&m.group() != &root.group()) layer_max = std::max(layer_max, m.group().gathered_bytes());
    }
    const FsdpStats& st = root.stats();
    EXPECT_EQ(st.live_unsharded_bytes, 0);
    EXPECT_LE(st.peak_unsharded_bytes, root_bytes + 2 * layer_max);
    EXPECT_GE(st.peak_unsharded_bytes, root_bytes + root.Subtree()[1].group().full_param_bytes());
    if (r.rank == 0) {
      std::printf("memory: unsharded %lld B, rank0 %lld B (1/W = %lld), peak full params %lld B\n",
                  static_cast<long long>(total), static_cast<long long>(mine),
                  static_cast<long long>(total / kWorld), static_cast<long long>(st.peak_unsharded_bytes));
    }
  });
  EXPECT_EQ(sum_over_ranks, total);  // shards partition every tensor exactly
}

// bf16 compute, fp32 reduce and master: the grads equal the average over
// ranks of the fp32 casts of a bf16 model's grads on each rank's batch.
TEST(FullyShardMixedPrecisionTest, Bf16ComputeFp32ReduceMatchesOracle) {
  constexpr int kWorld = 2;
  torch::manual_seed(4);
  MlpStack init;
  const at::Tensor x = torch::randn({4, 5}), y = torch::randn({4, 3});
  std::map<std::string, at::Tensor> oracle;  // averaged fp32 grads
  for (int r = 0; r < kWorld; ++r) {
    MlpStack m;
    test_support::CopyParams(*init, *m);
    m->to(at::kBFloat16);
    at::mse_loss(m->forward(x.narrow(0, 2 * r, 2).to(at::kBFloat16)).to(at::kFloat), y.narrow(0, 2 * r, 2))
        .backward();
    for (const auto& item : m->named_parameters()) {
      at::Tensor g = item.value().grad().to(at::kFloat) / kWorld;
      oracle[item.key()] = oracle.count(item.key()) ? oracle[item.key()] + g : g;
    }
  }
  RunMeshRanks(kWorld, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    FullyShardOptions o;
    o.mp_policy.param_dtype = at::kBFloat16;
    o.mp_policy.reduce_dtype = at::kFloat;
    FsdpModule root = ShardStack(model, mesh, o);
    at::ScalarType seen = at::kFloat;
    model->b1->RegisterPreForwardHook([&](nn::HookableModule&, std::vector<at::Tensor>& in) {
      // Runs after FullyShard's own pre-hook (registered first).
      seen = model->b1->fc1->weight.scalar_type();
      EXPECT_EQ(in[0].scalar_type(), at::kBFloat16);
    });
    at::Tensor out = model->forward(x.narrow(0, 2 * r.rank, 2));
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    at::mse_loss(out.to(at::kFloat), y.narrow(0, 2 * r.rank, 2)).backward();
    EXPECT_EQ(seen, at::kBFloat16);
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& p = item.value();
      EXPECT_EQ(p.scalar_type(), at::kFloat) << item.key();
      ASSERT_TRUE(p.grad().defined()) << item.key();
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      const auto chunks = oracle[item.key()].chunk(kWorld, 0);
      const at::Tensor want = r.rank < static_cast<int>(chunks.size()) ? chunks[r.rank] : at::Tensor();
      if (!want.defined()) continue;
      ASSERT_EQ(p.grad().sizes(), want.sizes()) << item.key();
      EXPECT_LE(RelErr(p.grad(), want), 1e-6) << item.key();
    }
    // One micro-step with sync off on the other rank's batch (its bf16 grads
    // kept in fp32), one with sync on on this rank's: their sum is reduced in
    // fp32 and added to the grads above, 3x the oracle in all. (Summed in
    // bf16, the two different grads would round.)
    for (bool sync : {false, true}) {
      root.SetRequiresGradientSync(sync);
      const int64_t b = sync ? r.rank : 1 - r.rank;
      at::mse_loss(model->forward(x.narrow(0, 2 * b, 2)).to(at::kFloat), y.narrow(0, 2 * b, 2)).backward();
    }
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& p = item.value();
      const auto chunks = oracle[item.key()].chunk(kWorld, 0);
      if (r.rank >= static_cast<int>(chunks.size())) continue;
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      EXPECT_LE(RelErr(p.grad(), 3 * chunks[r.rank]), 1e-6) << item.key();
    }
  });
}

// Micro-steps with sync off issue no reduce-scatter; the last one reduces
// the sum; clipping uses the global norm. Oracle: one process accumulating
// two full-batch micro-steps and torch's clip_grad_norm_.
TEST(FullyShardAccumulationTest, NoSyncThenSyncAndClipMatchSingleProcess) {
  constexpr int kWorld = 2, kSteps = 5;
  constexpr double kMaxNorm = 0.05;
  torch::manual_seed(5);
  MlpStack init;
  const at::Tensor x = torch::randn({2, 4, 5}), y = torch::randn({2, 4, 3});
  MlpStack oracle;
  test_support::CopyParams(*init, *oracle);
  torch::optim::AdamW oopt(oracle->parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    oopt.zero_grad();
    for (int micro = 0; micro < 2; ++micro) at::mse_loss(oracle->forward(x[micro]), y[micro]).backward();
    norms.push_back(torch::nn::utils::clip_grad_norm_(oracle->parameters(), kMaxNorm));
    oopt.step();
  }
  EXPECT_GT(norms[0], kMaxNorm);  // clipping is active
  RunMeshRanks(kWorld, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    FsdpModule root = ShardStack(model, mesh);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        root.SetRequiresGradientSync(micro == 1);
        const int64_t rs_before = root.Subtree()[1].group().num_reduce_scatters();
        at::mse_loss(model->forward(x[micro].narrow(0, 2 * r.rank, 2)), y[micro].narrow(0, 2 * r.rank, 2))
            .backward();
        const int64_t rs_after = root.Subtree()[1].group().num_reduce_scatters();
        EXPECT_EQ(rs_after - rs_before, micro == 1 ? 1 : 0);
        if (micro == 0) {
          // zero_grad left zero shard grads; nothing was reduced into them.
          const at::Tensor& g = model->b1->fc1->weight.grad();
          EXPECT_TRUE(!g.defined() || g.abs().sum().item<double>() == 0.0);
        }
      }
      absl::StatusOr<double> norm = ClipGradNorm(model.ptr(), mesh, kMaxNorm);
      ASSERT_TRUE(norm.ok()) << norm.status();
      EXPECT_NEAR(*norm, norms[s], 1e-5 * norms[s]) << "step " << s;
      opt.step();
    }
    for (const FsdpModule& m : root.Subtree()) ASSERT_TRUE(m.Unshard().ok());
    for (const auto& item : oracle->named_parameters()) {
      EXPECT_LE(RelErr(model->named_parameters()[item.key()], item.value()), 1e-5) << item.key();
    }
  });
}

// The embedding is frozen and ignored (stays whole, no grad, no AdamW
// state); mlp.fc1.weight is frozen but sharded (no grad, no state). The rest
// trains exactly like a single process with the same freezing.
TEST(FullyShardFrozenTest, FrozenAndIgnoredParams) {
  constexpr int kWorld = 3;
  torch::manual_seed(6);
  test_support::Block init(11, 8);
  auto freeze = [](test_support::Block& b) {
    b->embed.set_requires_grad(false);
    b->mlp->fc1->weight.set_requires_grad(false);
  };
  const at::Tensor tok = torch::randint(0, 11, {6, 4}, at::kLong), y = torch::randn({6, 4, 8});
  test_support::Block oracle(11, 8);
  test_support::CopyParams(*init, *oracle);
  freeze(oracle);
  torch::optim::AdamW oopt(oracle->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < 5; ++s) {
    oopt.zero_grad();
    at::mse_loss(oracle->forward(tok), y).backward();
    oopt.step();
  }
  RunMeshRanks(kWorld, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    test_support::Block model(11, 8);
    test_support::CopyParams(*init, *model);
    freeze(model);
    EXPECT_TRUE(FullyShard(model->attn.ptr(), mesh).ok());
    EXPECT_TRUE(FullyShard(model->mlp.ptr(), mesh).ok());
    FullyShardOptions o;
    o.ignored_params = {model->embed};
    auto root = FullyShard(model.ptr(), mesh, o);
    ASSERT_TRUE(root.ok()) << root.status();
    EXPECT_EQ(model->embed.size(0), 11);  // ignored: whole
    EXPECT_FALSE(FsdpOwner(model->embed).has_value());
    EXPECT_LE(model->mlp->fc1->weight.size(0), 6);  // frozen: sharded (17 rows / 3)
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 5; ++s) {
      opt.zero_grad();
      at::mse_loss(model->forward(tok.narrow(0, 2 * r.rank, 2)), y.narrow(0, 2 * r.rank, 2)).backward();
      opt.step();
    }
    EXPECT_FALSE(model->embed.grad().defined());
    EXPECT_FALSE(model->mlp->fc1->weight.grad().defined());
    auto has_state = [&](const at::Tensor& p) {
      return opt.state().count(p.unsafeGetTensorImpl()) > 0;
    };
    EXPECT_FALSE(has_state(model->embed));
    EXPECT_FALSE(has_state(model->mlp->fc1->weight));
    EXPECT_TRUE(has_state(model->mlp->fc2->weight));
    for (const FsdpModule& m : root->Subtree()) ASSERT_TRUE(m.Unshard().ok());
    for (const auto& item : oracle->named_parameters()) {
      EXPECT_LE(RelErr(model->named_parameters()[item.key()], item.value()), 1e-5) << item.key();
    }
    EXPECT_TRUE(at::equal(model->embed, init->embed));
  });
}

size_t IndexOf(const std::vector<std::string>& trace, const std::string& event, size_t from = 0) {
  auto it = std::find(trace.begin() + std::min(from, trace.size()), trace.end(), event);
  EXPECT_NE(it, trace.end()) << "missing " << event;
  return static_cast<size_t>(it - trace.begin());
}

// After the first iteration the next group's all-gather is issued before
// the current group computes, in forward and in backward; one all-gather and
// one reduce-scatter per group and pass.
TEST(FullyShardPrefetchTest, NextAllGatherIssuedBeforeCurrentCompute) {
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({4, 5}), y = torch::randn({4, 3});
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    FsdpModule root = ShardStack(model, mesh);
    for (int it = 0; it < 3; ++it) {
      if (it == 2) root.stats().tracing = true;
      at::mse_loss(model->forward(x), y).backward();
    }
    const std::vector<std::string>& t = root.stats().trace;
    // Forward: b1's gather is in flight while b0 computes.
    const size_t b1_issue = IndexOf(t, "b1:all_gather_issued");
    EXPECT_LT(b1_issue, IndexOf(t, "b0:forward"));
    EXPECT_LT(IndexOf(t, "b0:forward"), IndexOf(t, "b0:resharded"));
    EXPECT_LT(IndexOf(t, "b0:resharded"), IndexOf(t, "b1:unsharded"));
    // Backward: b1's gather is issued before b2's grads are reduced.
    const size_t bwd = IndexOf(t, "root:backward");
    const size_t b1_bwd_issue = IndexOf(t, "b1:all_gather_issued", bwd);
    EXPECT_LT(b1_bwd_issue, IndexOf(t, "b2:reduce_scatter_issued", bwd));
    EXPECT_LT(IndexOf(t, "b2:reduce_scatter_issued", bwd), IndexOf(t, "b1:unsharded", bwd));
    EXPECT_EQ(t.back(), "backward_done");
    for (const FsdpModule& m : root.Subtree()) {
      const bool is_root = &m.group() == &root.group();
      EXPECT_EQ(m.group().num_all_gathers(), is_root ? 3 : 6) << m.group().label();
      EXPECT_EQ(m.group().num_reduce_scatters(), 3) << m.group().label();
      EXPECT_EQ(m.group().state(), FsdpParamGroup::State::kSharded);
    }
  });
}

// Phase timing is off by default (no entries); once on, every all-gather
// and reduce-scatter of every group is counted in its phases.
TEST(FullyShardStatsTest, PhaseTimesCountEveryCollectiveOnlyWhenOn) {
  torch::manual_seed(8);
  const at::Tensor x = torch::randn({4, 5}), y = torch::randn({4, 3});
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    FsdpModule root = ShardStack(model, mesh);
    at::mse_loss(model->forward(x), y).backward();
    EXPECT_TRUE(root.stats().phase_times.empty());
    int64_t gathers = 0, reduces = 0;
    for (const FsdpModule& m : root.Subtree()) {
      gathers -= m.group().num_all_gathers();
      reduces -= m.group().num_reduce_scatters();
    }
    root.stats().timing = true;
    for (int it = 0; it < 2; ++it) at::mse_loss(model->forward(x), y).backward();
    for (const FsdpModule& m : root.Subtree()) {
      gathers += m.group().num_all_gathers();
      reduces += m.group().num_reduce_scatters();
    }
    const auto& t = root.stats().phase_times;
    for (const char* phase : {"unshard_issue", "all_gather_wait", "unpack"}) {
      ASSERT_TRUE(t.count(phase)) << phase;
      EXPECT_EQ(t.at(phase).calls, gathers) << phase;
    }
    for (const char* phase : {"reduce_issue", "reduce_scatter_wait", "reduce_finish"}) {
      ASSERT_TRUE(t.count(phase)) << phase;
      EXPECT_EQ(t.at(phase).calls, reduces) << phase;
    }
    EXPECT_EQ(t.size(), 6u);
    for (const auto& [phase, time] : t) {
      EXPECT_GE(time.wall_s, 0) << phase;
      EXPECT_GE(time.cpu_s, 0) << phase;
    }
  });
}

class Holder : public nn::HookableModule {
 public:
  explicit Holder(const at::Tensor& w) { w_ = register_parameter("w", w); }
  at::Tensor forward(const at::Tensor& x) {
    return RunForward(x, [&](const at::Tensor& in) { return at::matmul(in, w_); });
  }
  at::Tensor w_;
};

TEST(FullyShardErrorsTest, SharedParamWrongMeshAndNonHookable) {
  RunMeshRanks(4, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    at::Tensor shared = torch::randn({4, 4}).requires_grad_();
    auto a = std::make_shared<Holder>(shared);
    auto b = std::make_shared<Holder>(shared);
    FullyShardOptions oa;
    oa.label = "a";
    ASSERT_TRUE(FullyShard(a, mesh, oa).ok());
    absl::Status s = FullyShard(b, mesh).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("shared with FullyShard group 'a'"));
    EXPECT_EQ(FullyShard(a, mesh).status().code(), absl::StatusCode::kFailedPrecondition);

    DeviceMeshEnv env = r.env;
    env.mesh_name = "mesh2d";
    absl::StatusOr<DeviceMesh> m2 = InitDeviceMesh("cpu", {2, 2}, {"dp", "tp"}, env);
    ASSERT_TRUE(m2.ok());
    auto c = std::make_shared<Holder>(torch::randn({4, 4}));
    s = FullyShard(c, *m2).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("1-D mesh"));

    auto plain = std::make_shared<torch::nn::LinearImpl>(3, 3);
    s = FullyShard(plain, mesh).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr("HookableModule"));
    auto scalar = std::make_shared<Holder>(torch::randn({}));
    EXPECT_THAT(std::string(FullyShard(scalar, mesh).status().message()), HasSubstr("0-dim"));
  });
}

}  // namespace
}  // namespace tpudist::fsdp
