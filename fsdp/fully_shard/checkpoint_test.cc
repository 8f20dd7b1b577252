// State dicts and sharded checkpoints of FullyShard-ed models.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "fsdp/fully_shard/dcp_checkpoint.h"
#include "fsdp/fully_shard/dcp_layout.h"
#include "fsdp/fully_shard/flat_param_math.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "fsdp/fully_shard/optimizer_checkpoint.h"
#include "fsdp/fully_shard/sharded_checkpoint.h"
#include "fsdp/fully_shard/state_dict.h"
#include "fsdp/global_layout.h"
#include "fsdp/shard_math.h"
#include "testing/fsdp_util.h"
#include "io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/temp_dir.h"

namespace tpudist::fsdp {
namespace {

using test_support::MlpStack;
using test_support::Rank;
using test_support::RunMeshRanks;

bool fs_exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

// Removed when this test process exits (the tests that can also remove
// theirs early still do).
std::string TempDir() { return ::tpudist::test_support::ProcessTempDir("fsdp_ckpt"); }

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
// Loads `dir` on `world` ranks of plain (1-D) FullyShard into a model that
// starts from `start`'s weights; rank 0's full state dict must equal `want`.
void ExpectReloadsOnPlainFsdp(const std::string& dir, int world, test_support::MlpStackImpl& start, const StateDict& want) {
  RunMeshRanks(world, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(start, *model);
    Shard(model, mesh);
    absl::Status s = LoadShardedCheckpoint(model.ptr(), mesh, dir);
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<StateDict> sd = GetModelStateDict(model.ptr(), mesh);
    ASSERT_TRUE(sd.ok());
    if (r.rank == 0) ExpectSameDict(*sd, want);
  });
}

TEST(StateDictTest, FullRoundTripOnThreeRanks) {
  torch::manual_seed(8);
  MlpStack a, b;
  const StateDict want_a = PlainDict(*a), want_b = PlainDict(*b);
  RunMeshRanks(3, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*a, *model);
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
  RunMeshRanks(4, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
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
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*other, *model);
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
  std::filesystem::remove_all(dir);
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
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    auto run = [&](const std::string& mode) {
      MlpStack m;
      test_support::CopyParams(*init, *m);
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
  std::filesystem::remove_all(dir);
}

// As a tensor-parallel layer would (fsdp/global_layout.h contract): replace
// `p` by its torch.chunk piece `tp` of `n` along `dim` and record where it sits.
void TpShard(at::Tensor p, int64_t dim, int64_t tp, int64_t n) {
  const at::Tensor full = p.detach().clone();  // [any]
  const ChunkExtent c = ChunkOf(full.size(dim), n, tp);
  p.set_data(full.narrow(dim, c.offset, c.size).clone());
  std::vector<int64_t> offsets(full.dim(), 0);
  offsets[dim] = c.offset;
  ASSERT_TRUE(SetGlobalLayout(p, full.sizes().vec(), offsets).ok());
}

// The synthetic TP+FSDP model of a rank at `tp` of 2: in every block fc1
// is Colwise (weight and bias Shard(0)), fc2 Rowwise (weight Shard(1), bias
// Replicate: recorded in b1, unrecorded in b0/b2); head weight Shard(0)
// (3 rows: 2 + 1, then over dp 1 + 1 and 1 + 0), head bias Shard(0).
// Then FullyShard over `dp`.
void ApplyTpThenFsdp(const MlpStack& m, int64_t tp, const DeviceMesh& dp) {
  for (auto b : {m->b0, m->b1, m->b2}) {
    TpShard(b->fc1->weight, 0, tp, 2);
    TpShard(b->fc1->bias, 0, tp, 2);
    TpShard(b->fc2->weight, 1, tp, 2);
  }
  ASSERT_TRUE(SetGlobalLayout(m->b1->fc2->bias, m->b1->fc2->bias.sizes().vec(), {0}).ok());
  TpShard(m->head->weight, 0, tp, 2);
  TpShard(m->head->bias, 0, tp, 2);
  Shard(m, dp);
}

// A TP(2) x FSDP(2) checkpoint, saved by 4 ranks on a 2-D mesh, reloads on
// 1, 2 and 3 ranks of plain FullyShard (and on the same 2-D layout):
// the full state dict equals the original full tensors exactly.
TEST(ShardedCheckpointTest, TpFsdpTwoDimReloadsOnOneDimFsdp) {
  torch::manual_seed(21);
  MlpStack init;
  const StateDict want = PlainDict(*init);
  // tests/oracles/test_sharded_checkpoint.py reassembles the files in Python.
  const char* export_dir = std::getenv("TPU_DIST_CKPT_EXPORT_DIR");
  const std::string dir = export_dir != nullptr ? export_dir : TempDir();
  if (export_dir != nullptr) {
    std::vector<std::pair<std::string, at::Tensor>> full(want.begin(), want.end());
    ASSERT_TRUE(io::WriteSafetensors(dir + "/expected.safetensors", full).ok());
  }
  RunMeshRanks(4, [&](const Rank& r) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2, 2}, {"dp", "tp"}, r.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    MlpStack model;
    test_support::CopyParams(*init, *model);
    ApplyTpThenFsdp(model, mesh->LocalRank(1), *mesh->Slice("dp"));
    absl::Status s = SaveShardedCheckpoint(model.ptr(), *mesh, dir);
    ASSERT_TRUE(s.ok()) << s;
  });
  {  // format 2; b1.fc2.bias (replicated over tp) is stored once
    std::ifstream in(dir + "/metadata.json");
    const nlohmann::json meta = nlohmann::json::parse(in);
    EXPECT_EQ(meta["format"], 2);
    EXPECT_EQ(meta["world_size"], 4);
    EXPECT_EQ(meta["tensors"]["b1.fc2.bias"]["blocks"].size(), 2u);  // dp 2, tp once
    EXPECT_EQ(meta["tensors"]["b1.fc1.weight"]["blocks"].size(), 4u);
  }
  for (int world : {1, 2, 3}) {
    torch::manual_seed(100 + world);
    MlpStack other;  // different initial weights
    ExpectReloadsOnPlainFsdp(dir, world, *other, want);
  }
  // Back onto TP x FSDP: every rank's local shards equal the pieces of the
  // full tensors that its records and dp chunk name.
  torch::manual_seed(7);
  MlpStack other;
  RunMeshRanks(4, [&](const Rank& r) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2, 2}, {"dp", "tp"}, r.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    MlpStack model, expect;
    test_support::CopyParams(*other, *model);
    test_support::CopyParams(*init, *expect);
    ApplyTpThenFsdp(model, mesh->LocalRank(1), *mesh->Slice("dp"));
    ApplyTpThenFsdp(expect, mesh->LocalRank(1), *mesh->Slice("dp"));
    ASSERT_TRUE(LoadShardedCheckpoint(model.ptr(), *mesh, dir).ok());
    StateDictOptions o;
    o.full_state_dict = false;
    absl::StatusOr<StateDict> got = GetModelStateDict(model.ptr(), *mesh->Slice("dp"), o);
    absl::StatusOr<StateDict> exp = GetModelStateDict(expect.ptr(), *mesh->Slice("dp"), o);
    ASSERT_TRUE(got.ok() && exp.ok());
    ExpectSameDict(*got, *exp);
  });
  if (export_dir == nullptr) std::filesystem::remove_all(dir);
}

// The same TP(2) x FSDP(2) save in torch DCP's layout (dcp_checkpoint.h):
// TP pieces placed by their records, the tp-replicated bias written once per
// dp piece, and it loads on 1-D FullyShard at
// other world sizes.
TEST(ShardedCheckpointTest, DcpTpFsdpTwoDimReloadsOnOneDimFsdp) {
  torch::manual_seed(22);
  MlpStack init;
  const StateDict want = PlainDict(*init);
  const std::string dir = TempDir() + "/dcp_tp";
  std::filesystem::create_directories(dir);
  RunMeshRanks(4, [&](const Rank& r) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2, 2}, {"dp", "tp"}, r.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    MlpStack model;
    test_support::CopyParams(*init, *model);
    ApplyTpThenFsdp(model, mesh->LocalRank(1), *mesh->Slice("dp"));
    absl::Status s = SaveDcpCheckpoint(model.ptr(), *mesh, dir);
    ASSERT_TRUE(s.ok()) << s;
  });
  int bias_copies = 0, fc1_pieces = 0;  // b1.fc2.bias is replicated over tp: dp 2 pieces, once each
  for (int r = 0; r < 4; ++r) {
    auto f = io::SafetensorsFile::Open(dir + "/" + DcpShardFileName(r));
    ASSERT_TRUE(f.ok()) << f.status();
    bias_copies += (*f)->Contains("b1.fc2.bias");
    fc1_pieces += (*f)->Contains("b1.fc1.weight");
  }
  EXPECT_EQ(bias_copies, 2);
  EXPECT_EQ(fc1_pieces, 4);
  for (int world : {1, 2, 3}) {
    torch::manual_seed(200 + world);
    MlpStack other;
    RunMeshRanks(world, [&](const Rank& r) {
      DeviceMesh mesh = test_support::MakeMesh(r);
      MlpStack model;
      test_support::CopyParams(*other, *model);
      Shard(model, mesh);
      absl::Status s = LoadDcpCheckpoint(model.ptr(), mesh, dir);
      ASSERT_TRUE(s.ok()) << s;
      absl::StatusOr<StateDict> sd = GetModelStateDict(model.ptr(), mesh);
      ASSERT_TRUE(sd.ok());
      if (r.rank == 0) ExpectSameDict(*sd, want);
    });
  }
}

// A checkpoint in format 1 (no "format", "sharded": true = torch.chunk rows
// of dim 0 per rank), as the writer before format 2 left in run dirs, written
// here file by file the way that writer did, loads on another world size.
TEST(ShardedCheckpointTest, FormatOneCheckpointStillLoads) {
  torch::manual_seed(31);
  MlpStack init;
  const StateDict want = PlainDict(*init);
  const std::string dir = TempDir();
  const int64_t old_world = 4;
  nlohmann::json meta = {{"world_size", old_world}, {"tensors", nlohmann::json::object()}};
  for (int64_t r = 0; r < old_world; ++r) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& [name, full] : want) {
      const bool sharded = name.rfind("head.", 0) != 0;  // head: unsharded, whole on rank 0
      meta["tensors"][name] = {{"shape", full.sizes().vec()}, {"dtype", "Float"}, {"sharded", sharded}};
      if (sharded) {
        const ChunkExtent c = ChunkOf(full.size(0), old_world, r);
        tensors.emplace_back(name, full.narrow(0, c.offset, c.size).contiguous());
      } else if (r == 0) {
        tensors.emplace_back(name, full);
      }
    }
    ASSERT_TRUE(io::WriteSafetensors(dir + "/shard-" + std::to_string(r) + "-of-4.safetensors", tensors).ok());
  }
  std::ofstream(dir + "/metadata.json") << meta.dump(1);
  torch::manual_seed(32);
  MlpStack other;
  ExpectReloadsOnPlainFsdp(dir, 3, *other, want);
  std::filesystem::remove_all(dir);
}

// A block description edited after the save (overlapping blocks), or a
// shard file whose tensor disagrees with it, is an error naming the tensor.
TEST(ShardedCheckpointTest, CorruptBlockDescriptionNamesTheTensor) {
  torch::manual_seed(41);
  MlpStack init;
  const std::string dir = TempDir();
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    Shard(model, mesh);
    ASSERT_TRUE(SaveShardedCheckpoint(model.ptr(), mesh, dir).ok());
  });
  std::ifstream in(dir + "/metadata.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  auto load_with = [&](const nlohmann::json& meta) {
    std::ofstream(dir + "/metadata.json", std::ios::trunc) << meta.dump(1);
    absl::Status result;
    RunMeshRanks(1, [&](const Rank& r) {
      DeviceMesh mesh = test_support::MakeMesh(r);
      MlpStack model;
      Shard(model, mesh);
      result = LoadShardedCheckpoint(model.ptr(), mesh, dir);
    });
    return result;
  };
  ASSERT_TRUE(load_with(good).ok());
  nlohmann::json overlap = good;
  overlap["tensors"]["b1.fc1.weight"]["blocks"][1]["offsets"][0] = 1;  // rows 1.. overlap rank 0's 0..4
  absl::Status s = load_with(overlap);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("b1.fc1.weight"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("overlap"));
  // Consistent description, wrong file: rank 1's piece is said to be 4 rows.
  nlohmann::json moved = good;
  auto& blocks = moved["tensors"]["b1.fc1.weight"]["blocks"];
  blocks[0]["sizes"][0] = 4;
  blocks[1]["offsets"][0] = 4;
  blocks[1]["sizes"][0] = 5;
  s = load_with(moved);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("b1.fc1.weight"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("shard-0-of-2.safetensors"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tpudist::fsdp
