// State dicts and sharded checkpoints of FullyShard-ed models.
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include <torch/torch.h>

#include "fsdp/fully_shard/flat_param_math.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "fsdp/fully_shard/optimizer_checkpoint.h"
#include "fsdp/fully_shard/sharded_checkpoint.h"
#include "fsdp/fully_shard/state_dict.h"
#include "fsdp/fully_shard/testing/fsdp_test_util.h"
#include "io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using testing::MlpStack;
using testing::Rank;
using testing::RunRanks;

bool fs_exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

std::string TempDir() {
  char tmpl[] = "/tmp/fsdp_ckpt_XXXXXX";
  return mkdtemp(tmpl);
}

FsdpModule Shard(const MlpStack& m, const DeviceMesh& mesh) {
  for (auto b : {m->b0, m->b1, m->b2}) EXPECT_TRUE(FullyShard(b.ptr(), mesh).ok());
  auto root = FullyShard(m.ptr(), mesh);
  EXPECT_TRUE(root.ok());
  return *root;
}

void ExpectSameDict(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    EXPECT_TRUE(at::equal(v, b.at(k))) << k;
  }
}

StateDict PlainDict(torch::nn::Module& m) {
  StateDict d;
  for (const auto& item : m.named_parameters()) d[item.key()] = item.value().detach().clone();
  return d;
}

// Full dict on rank 0 == the unsharded model's; Set on other values then
// Get returns them; a missing key is rejected on every rank.
TEST(StateDictTest, FullRoundTripOnThreeRanks) {
  torch::manual_seed(8);
  MlpStack a, b;
  const StateDict want_a = PlainDict(*a), want_b = PlainDict(*b);
  RunRanks(3, [&](const Rank& r) {
    DeviceMesh mesh = testing::MakeMesh(r);
    MlpStack model;
    testing::CopyParams(*a, *model);
    Shard(model, mesh);
    absl::StatusOr<StateDict> got = GetModelStateDict(model.ptr(), mesh);
    ASSERT_TRUE(got.ok()) << got.status();
    if (r.rank == 0) {
      ExpectSameDict(*got, want_a);
    } else {
      EXPECT_TRUE(got->empty());
    }
    ASSERT_TRUE(SetModelStateDict(model.ptr(), mesh, r.rank == 0 ? want_b : StateDict{}).ok());
    got = GetModelStateDict(model.ptr(), mesh);
    ASSERT_TRUE(got.ok());
    if (r.rank == 0) ExpectSameDict(*got, want_b);
    // Sharded dict: this rank's rows.
    StateDictOptions sharded;
    sharded.full_state_dict = false;
    got = GetModelStateDict(model.ptr(), mesh, sharded);
    ASSERT_TRUE(got.ok());
    const auto chunks = want_b.at("b1.fc1.weight").chunk(3, 0);
    EXPECT_TRUE(at::equal(got->at("b1.fc1.weight"), chunks[r.rank]));

    StateDict broken = want_a;
    broken.erase("head.bias");
    absl::Status s = SetModelStateDict(model.ptr(), mesh, r.rank == 0 ? broken : StateDict{});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    if (r.rank == 0) {
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("head.bias"));
    }
    got = GetModelStateDict(model.ptr(), mesh);  // unchanged by the rejected set
    if (r.rank == 0) ExpectSameDict(*got, want_b);
  });
}

// Train on 4 ranks, save sharded, load into a differently initialized model
// on 2 ranks: the full dicts agree. The full safetensors file reads back.
TEST(ShardedCheckpointTest, ReshardOnLoadFourToTwo) {
  torch::manual_seed(9);
  MlpStack init;
  const at::Tensor x = torch::randn({4, 5}), y = torch::randn({4, 3});
  const std::string dir = TempDir();
  StateDict saved;
  RunRanks(4, [&](const Rank& r) {
    DeviceMesh mesh = testing::MakeMesh(r);
    MlpStack model;
    testing::CopyParams(*init, *model);
    model->b2->fc1->weight.set_requires_grad(false);  // frozen: skipped below
    Shard(model, mesh);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      at::mse_loss(model->forward(x.narrow(0, r.rank, 1)), y.narrow(0, r.rank, 1)).backward();
      opt.step();
    }
    StateDictOptions o;
    o.ignore_frozen_params = true;
    ASSERT_TRUE(SaveShardedCheckpoint(model.ptr(), mesh, dir, o).ok());
    ASSERT_TRUE(SaveFullSafetensors(model.ptr(), mesh, dir + "/full.safetensors").ok());
    absl::StatusOr<StateDict> sd = GetModelStateDict(model.ptr(), mesh);
    ASSERT_TRUE(sd.ok());
    if (r.rank == 0) saved = *sd;
  });
  ASSERT_FALSE(saved.empty());
  absl::StatusOr<io::SafetensorsContents> full = io::ReadSafetensors(dir + "/full.safetensors");
  ASSERT_TRUE(full.ok()) << full.status();
  ExpectSameDict(full->tensors, saved);
  EXPECT_EQ(full->metadata.at("format"), "pt");

  torch::manual_seed(10);
  MlpStack other;  // different initial weights
  RunRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = testing::MakeMesh(r);
    MlpStack model;
    testing::CopyParams(*other, *model);
    Shard(model, mesh);
    EXPECT_EQ(LoadShardedCheckpoint(model.ptr(), mesh, "/nonexistent").code(), absl::StatusCode::kNotFound);
    absl::Status s = LoadShardedCheckpoint(model.ptr(), mesh, dir);
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<StateDict> sd = GetModelStateDict(model.ptr(), mesh);
    ASSERT_TRUE(sd.ok());
    if (r.rank != 0) return;
    for (const auto& [k, v] : saved) {
      if (k == "b2.fc1.weight") {  // frozen, not in the checkpoint: kept
        EXPECT_TRUE(at::equal(sd->at(k), other->named_parameters()[k])) << k;
      } else {
        EXPECT_TRUE(at::equal(sd->at(k), v)) << k;
      }
    }
  });
}

// Resume = no interruption: 2 AdamW steps, checkpoint model + optimizer
// shards, 2 more steps; a fresh model and optimizer loaded from the
// checkpoint take the same 2 steps to bit-identical weights. Without the
// optimizer state they differ (so the test can fail). A checkpoint of
// another world size is rejected.
TEST(OptimizerCheckpointTest, ResumeIsBitIdentical) {
  torch::manual_seed(9);
  MlpStack init;
  const std::string dir = TempDir();
  auto step = [](MlpStack& m, torch::optim::AdamW& opt, int rank, int i) {
    at::Generator g = at::detail::createCPUGenerator(100 + 10 * i + rank);
    at::Tensor x = at::randn({4, 5}, g);  // [batch, in]
    opt.zero_grad();
    m->forward(x).pow(2).mean().backward();
    opt.step();
  };
  std::mutex mu;
  std::map<std::string, StateDict> finals;  // "straight" / "resumed" / "no_optim"
  RunRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = testing::MakeMesh(r);
    auto run = [&](const std::string& mode) {
      MlpStack m;
      testing::CopyParams(*init, *m);
      Shard(m, mesh);
      torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
      if (mode == "straight") {
        for (int i = 0; i < 2; ++i) step(m, opt, r.rank, i);
        ASSERT_TRUE(SaveShardedCheckpoint(m.ptr(), mesh, dir).ok());
        ASSERT_TRUE(SaveShardedAdamWState(m.ptr(), opt, r.rank, 2, dir).ok());
        EXPECT_TRUE(fs_exists(dir + "/" + OptimizerShardFileName(r.rank, 2)));
      } else {
        ASSERT_TRUE(LoadShardedCheckpoint(m.ptr(), mesh, dir).ok());
        if (mode == "resumed") {
          absl::Status s = LoadShardedAdamWState(m.ptr(), opt, r.rank, 2, dir);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_FALSE(LoadShardedAdamWState(m.ptr(), opt, r.rank, 3, dir).ok());
        }
      }
      for (int i = 2; i < 4; ++i) step(m, opt, r.rank, i);
      absl::StatusOr<StateDict> d = GetModelStateDict(m.ptr(), mesh);
      ASSERT_TRUE(d.ok());
      if (r.rank == 0) {
        std::lock_guard<std::mutex> l(mu);
        finals[mode] = *d;
      }
      mesh.Group(0)->barrier()->wait();
    };
    run("straight");
    run("resumed");
    run("no_optim");
  });
  ExpectSameDict(finals["resumed"], finals["straight"]);
  EXPECT_FALSE(at::equal(finals["no_optim"].at("b0.fc1.weight"), finals["straight"].at("b0.fc1.weight")));
}

}  // namespace
}  // namespace tpudist::fsdp
