// FullyShard forward/backward/optimizer parity against one unsharded process.
#include "fsdp/fully_shard/fully_shard.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "testing/fsdp_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using test_support::Rank;
using test_support::RelErr;
using test_support::RunMeshRanks;

constexpr int kSteps = 20;
constexpr int64_t kBatch = 12;  // divisible by 1, 2, 3, 4

using ForwardFn = std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>;

struct Problem {
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  ForwardFn forward;
  // Applies FullyShard bottom-up; returns the root handle.
  std::function<FsdpModule(const std::shared_ptr<torch::nn::Module>&, const DeviceMesh&)> shard;
  at::Tensor x, y;  // [kBatch, ...]
};

struct Trace {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> final_params;  // full
  std::map<std::string, at::Tensor> first_grads;   // full, after step 0's backward
};

torch::optim::AdamW MakeAdamW(torch::nn::Module& m) {
  return torch::optim::AdamW(m.parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
}

Trace TrainOracle(const Problem& p, const std::shared_ptr<torch::nn::Module>& init) {
  auto model = p.make();
  test_support::CopyParams(*init, *model);
  auto opt = MakeAdamW(*model);
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    at::Tensor loss = at::mse_loss(p.forward(*model, p.x), p.y);
    loss.backward();
    if (s == 0) {
      for (const auto& item : model->named_parameters()) t.first_grads[item.key()] = item.value().grad().clone();
    }
    opt.step();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) t.final_params[item.key()] = item.value().detach().clone();
  return t;
}

// Full parameters of a FullyShard-ed model, gathered group by group.
std::map<std::string, at::Tensor> GatherFull(torch::nn::Module& model, const FsdpModule& root) {
  for (const FsdpModule& m : root.Subtree()) EXPECT_TRUE(m.Unshard().ok());
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (const FsdpModule& m : root.Subtree()) EXPECT_TRUE(m.Reshard().ok());
  return out;
}

double AvgOverRanks(const DeviceMesh& mesh, double v) {
  std::vector<at::Tensor> t = {at::full({1}, v, at::kDouble)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::AVG;
  mesh.Group(0)->allreduce(t, o)->wait(mesh.collective_timeout_ms());
  return t[0].item<double>();
}

void ExpectParity(const Problem& p, int world) {
  auto init = p.make();
  const Trace oracle = TrainOracle(p, init);
  RunMeshRanks(world, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    auto model = p.make();
    test_support::CopyParams(*init, *model);
    FsdpModule root = p.shard(model, mesh);
    auto opt = MakeAdamW(*model);
    const int64_t rows = kBatch / world;
    const at::Tensor x = p.x.narrow(0, r.rank * rows, rows);
    const at::Tensor y = p.y.narrow(0, r.rank * rows, rows);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      at::Tensor loss = at::mse_loss(p.forward(*model, x), y);
      loss.backward();
      if (s == 0) {  // AdamW hides a grad scale error; check the grads themselves
        for (const auto& item : model->named_parameters()) {
          const auto chunks = oracle.first_grads.at(item.key()).chunk(world, 0);
          if (r.rank >= static_cast<int>(chunks.size())) continue;
          ASSERT_TRUE(item.value().grad().defined()) << item.key();
          EXPECT_LE(RelErr(item.value().grad(), chunks[r.rank]), 1e-5) << "world " << world << " " << item.key();
        }
      }
      opt.step();
      const double avg = AvgOverRanks(mesh, loss.item<double>());
      EXPECT_NEAR(avg, oracle.losses[s], 1e-5 * std::abs(oracle.losses[s]))
          << "world " << world << " rank " << r.rank << " step " << s;
    }
    // Only shards stay resident and the optimizer stepped on them.
    for (const auto& item : model->named_parameters()) {
      EXPECT_LE(item.value().size(0), (oracle.final_params.at(item.key()).size(0) + world - 1) / world)
          << item.key();
    }
    std::map<std::string, at::Tensor> full = GatherFull(*model, root);
    for (const auto& [name, want] : oracle.final_params) {
      ASSERT_TRUE(full.count(name)) << name;
      EXPECT_EQ(full[name].sizes(), want.sizes()) << name;
      EXPECT_LE(RelErr(full[name], want), 1e-5) << "world " << world << " " << name;
    }
    EXPECT_GT(RelErr(full.begin()->second, init->named_parameters()[full.begin()->first]), 1e-3)
        << "training must move the weights";
  });
}

Problem MlpProblem() {
  Problem p;
  torch::manual_seed(1);
  p.make = [] { return std::static_pointer_cast<torch::nn::Module>(test_support::MlpStack().ptr()); };
  p.forward = [](torch::nn::Module& m, const at::Tensor& x) {
    return static_cast<test_support::MlpStackImpl&>(m).forward(x);
  };
  p.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto& stack = static_cast<test_support::MlpStackImpl&>(*m);
    for (auto b : {stack.b0, stack.b1, stack.b2}) EXPECT_TRUE(FullyShard(b.ptr(), mesh).ok());
    auto root = FullyShard(m, mesh);
    EXPECT_TRUE(root.ok()) << root.status();
    return *root;
  };
  p.x = torch::randn({kBatch, 5});
  p.y = torch::randn({kBatch, 3});
  return p;
}

Problem BlockProblem() {
  Problem p;
  torch::manual_seed(2);
  p.make = [] { return std::static_pointer_cast<torch::nn::Module>(test_support::Block(11, 8).ptr()); };
  p.forward = [](torch::nn::Module& m, const at::Tensor& x) {
    return static_cast<test_support::BlockImpl&>(m).forward(x);
  };
  p.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto& block = static_cast<test_support::BlockImpl&>(*m);
    EXPECT_TRUE(FullyShard(block.attn.ptr(), mesh).ok());
    EXPECT_TRUE(FullyShard(block.mlp.ptr(), mesh).ok());
    auto root = FullyShard(m, mesh);
    EXPECT_TRUE(root.ok()) << root.status();
    return *root;
  };
  p.x = torch::randint(0, 11, {kBatch, 4}, at::kLong);
  p.y = torch::randn({kBatch, 4, 8});
  return p;
}

class ParityTest : public ::testing::TestWithParam<int> {};

TEST_P(ParityTest, MlpMatchesSingleProcess) { ExpectParity(MlpProblem(), GetParam()); }
TEST_P(ParityTest, TransformerBlockMatchesSingleProcess) { ExpectParity(BlockProblem(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(Worlds, ParityTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace tpudist::fsdp

