// dcp_checkpoint.h: our DCP checkpoints against our own reader at other
// world sizes, and against torch itself (DcpOracle: torch's FSDP2 with
// dcp.load / dcp.save and DCP's HF safetensors storage, run by
// tests/oracles/dcp_oracle.py in the venv): C++ 4 ranks -> torch 2, C++ 2 ->
// torch 4, torch 4 -> C++ 2, torch 2 -> C++ 4; fp32 weights and AdamW state
// bit for bit.
#include "fsdp/fully_shard/dcp_checkpoint.h"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/dcp_layout.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "testing/fsdp_util.h"
#include "io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/temp_dir.h"
#include "testing/source_dir.h"

namespace tpudist::fsdp {
namespace {

using test_support::MlpStack;
using test_support::Rank;
using test_support::RunMeshRanks;

using test_support::SourceDir;

// tests/oracles/dcp_oracle.py <mode> <dir> <world> <expected>; its exit
// status (0: done / bit-identical), at most 300 s.
int RunOracle(const std::string& mode, const std::string& dir, int world, const std::string& expected) {
  const std::string cmd = absl::StrCat("timeout -k 10 300 '", TPU_DIST_PYTHON, "' '", SourceDir(),
                                       "/tests/oracles/dcp_oracle.py' ", mode, " '", dir, "' ", world, " '",
                                       expected, "'");
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

void Shard(const MlpStack& m, const DeviceMesh& mesh) {
  for (auto b : {m->b0, m->b1, m->b2}) ASSERT_TRUE(FullyShard(b.ptr(), mesh).ok());
  ASSERT_TRUE(FullyShard(m.ptr(), mesh).ok());
}

// Two AdamW steps on rank-dependent data.
void Train(MlpStack& model, torch::optim::AdamW& opt, int rank) {
  for (int step = 0; step < 2; ++step) {
    at::Tensor x = (at::arange(20, at::kFloat).reshape({4, 5}) * 0.37 * (rank + 1) + step).sin();  // [4, 5]
    at::Tensor y = (at::arange(12, at::kFloat).reshape({4, 3}) * 0.11 - rank).cos();             // [4, 3]
    opt.zero_grad();
    (model->forward(x) - y).pow(2).mean().backward();
    opt.step();
  }
}

torch::optim::AdamWOptions Adam() { return torch::optim::AdamWOptions(1e-2).weight_decay(0.01); }

// rank's torch.chunk rows of `full` over `world` (empty past the end). full: [d0, ...]
at::Tensor ChunkRows(const at::Tensor& full, int world, int rank) {
  const int64_t d0 = full.size(0), per = (d0 + world - 1) / world;
  const int64_t begin = std::min(d0, per * rank), end = std::min(d0, per * (rank + 1));
  return full.narrow(0, begin, end - begin);
}

// Every rank's shards of the weights and AdamW state, reassembled into full
// tensors under the checkpoint's keys (1-D mesh: Shard(0) rows in rank order).
class FullState {
 public:
  void Record(MlpStack& model, torch::optim::AdamW& opt, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& p = item.value();
      pieces_[item.key()][rank] = p.detach().clone();
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
      const std::string prefix = absl::StrCat(kDcpOptimizerStatePrefix, item.key(), ".");
      pieces_[prefix + "exp_avg"][rank] = s.exp_avg().clone();
      pieces_[prefix + "exp_avg_sq"][rank] = s.exp_avg_sq().clone();
      steps_[prefix + "step"] = s.step();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> Full() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [key, by_rank] : pieces_) {
      std::vector<at::Tensor> rows;
      for (const auto& [r, t] : by_rank) rows.push_back(t);
      out.emplace_back(key, at::cat(rows, 0));
    }
    for (const auto& [key, step] : steps_) out.emplace_back(key, at::scalar_tensor(double(step), at::kFloat));
    return out;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::map<int, at::Tensor>> pieces_;
  std::map<std::string, int64_t> steps_;
};

// Trains on `world` ranks from `init`, saves a DCP checkpoint into `dir`;
// returns the full tensors it saved.
std::vector<std::pair<std::string, at::Tensor>> TrainAndSave(int world, test_support::MlpStackImpl& init,
                                                             const std::string& dir) {
  FullState state;
  RunMeshRanks(world, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(init, *model);
    Shard(model, mesh);
    torch::optim::AdamW opt(model->parameters(), Adam());
    Train(model, opt, r.rank);
    absl::Status s = SaveDcpCheckpoint(model.ptr(), mesh, dir, &opt);
    ASSERT_TRUE(s.ok()) << s;
    state.Record(model, opt, r.rank);
  });
  return state.Full();
}

// Loads `dir` on `world` ranks into a model from `init` (other values) and
// checks every rank's shards and AdamW state against `want` bit for bit.
void LoadAndExpect(int world, test_support::MlpStackImpl& init, const std::string& dir,
                   const std::map<std::string, at::Tensor>& want) {
  RunMeshRanks(world, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(init, *model);
    Shard(model, mesh);
    torch::optim::AdamW opt(model->parameters(), Adam());
    absl::Status s = LoadDcpCheckpoint(model.ptr(), mesh, dir, &opt);
    ASSERT_TRUE(s.ok()) << s;
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& p = item.value();
      EXPECT_TRUE(at::equal(p, ChunkRows(want.at(item.key()), world, r.rank))) << item.key() << " rank " << r.rank;
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      ASSERT_NE(it, opt.state().end()) << item.key();
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      const std::string prefix = absl::StrCat(kDcpOptimizerStatePrefix, item.key(), ".");
      EXPECT_TRUE(at::equal(st.exp_avg(), ChunkRows(want.at(prefix + "exp_avg"), world, r.rank))) << item.key();
      EXPECT_TRUE(at::equal(st.exp_avg_sq(), ChunkRows(want.at(prefix + "exp_avg_sq"), world, r.rank)))
          << item.key();
      EXPECT_EQ(st.step(), want.at(prefix + "step").item<float>()) << item.key();
    }
    // The loaded state is usable: one more step runs.
    Train(model, opt, r.rank);
  });
}

std::map<std::string, at::Tensor> AsMap(const std::vector<std::pair<std::string, at::Tensor>>& v) {
  return {v.begin(), v.end()};
}

class DcpRoundTripTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(DcpRoundTripTest, OurReaderLoadsAtAnotherWorldSize) {
  const auto [save_world, load_world] = GetParam();
  ::tpudist::test_support::ScopedTempDir tmp;
  torch::manual_seed(3);
  MlpStack init, other;
  const auto saved = TrainAndSave(save_world, *init, tmp.path());
  // Files: one per rank that holds anything, torch's names.
  for (int r = 0; r < save_world; ++r) {
    EXPECT_TRUE(std::filesystem::exists(tmp / DcpShardFileName(r))) << r;
  }
  LoadAndExpect(load_world, *other, tmp.path(), AsMap(saved));
}

INSTANTIATE_TEST_SUITE_P(Worlds, DcpRoundTripTest,
                         ::testing::Values(std::pair{4, 2}, std::pair{2, 4}, std::pair{4, 3}, std::pair{1, 4}));

TEST(DcpCheckpointTest, RefusesADirectoryHoldingSafetensors) {
  ::tpudist::test_support::ScopedTempDir tmp;
  torch::manual_seed(4);
  MlpStack init;
  TrainAndSave(2, *init, tmp.path());
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    Shard(model, mesh);
    absl::Status s = SaveDcpCheckpoint(model.ptr(), mesh, tmp.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("already holds")) << s;
  });
}

TEST(DcpCheckpointTest, MissingStateAndKeysAreNamedOnEveryRank) {
  ::tpudist::test_support::ScopedTempDir weights_only, empty;
  torch::manual_seed(5);
  MlpStack init;
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    Shard(model, mesh);
    ASSERT_TRUE(SaveDcpCheckpoint(model.ptr(), mesh, weights_only.path()).ok());
  });
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    test_support::CopyParams(*init, *model);
    Shard(model, mesh);
    torch::optim::AdamW opt(model->parameters(), Adam());
    absl::Status s = LoadDcpCheckpoint(model.ptr(), mesh, weights_only.path(), &opt);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("optim.state.")) << s;
    EXPECT_TRUE(LoadDcpCheckpoint(model.ptr(), mesh, weights_only.path()).ok());  // weights alone load
    s = LoadDcpCheckpoint(model.ptr(), mesh, empty.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("no *.safetensors file in")) << s;
  });
  // DCP's default layout (torch's FileSystemWriter) is named as such.
  { std::ofstream(empty / ".metadata") << "pickle"; }
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    MlpStack model;
    Shard(model, mesh);
    absl::Status s = LoadDcpCheckpoint(model.ptr(), mesh, empty.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("HuggingFaceStorageWriter(path, save_distributed=True)")) << s;
  });
  // Another model's checkpoint: its keys are named.
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    test_support::Mlp model(5, 8, 6);
    ASSERT_TRUE(FullyShard(model.ptr(), mesh).ok());
    absl::Status s = LoadDcpCheckpoint(model.ptr(), mesh, weights_only.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("has no fc1.weight")) << s;
  });
}

TEST(DcpCheckpointTest, AnotherShapeIsRefusedNamingBoth) {
  ::tpudist::test_support::ScopedTempDir tmp;
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    test_support::Mlp nine(5, 9, 6);
    ASSERT_TRUE(FullyShard(nine.ptr(), mesh).ok());
    ASSERT_TRUE(SaveDcpCheckpoint(nine.ptr(), mesh, tmp.path()).ok());
  });
  RunMeshRanks(2, [&](const Rank& r) {
    DeviceMesh mesh = test_support::MakeMesh(r);
    test_support::Mlp eight(5, 8, 6);
    ASSERT_TRUE(FullyShard(eight.ptr(), mesh).ok());
    absl::Status s = LoadDcpCheckpoint(eight.ptr(), mesh, tmp.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("fc1.weight has shape [9, 5]")) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("the model has [8, 5]")) << s;
  });
}

// --- against torch ---------------------------------------------------------

class DcpOracle : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(DcpOracle, TorchLoadsWhatWeSave) {
  const auto [ours, theirs] = GetParam();
  ::tpudist::test_support::ScopedTempDir tmp;
  const std::string dir = tmp / "dcp", expected = tmp / "expected.safetensors";
  std::filesystem::create_directory(dir);
  torch::manual_seed(6);
  MlpStack init;
  const auto saved = TrainAndSave(ours, *init, dir);
  ASSERT_TRUE(io::WriteSafetensors(expected, saved).ok());
  EXPECT_EQ(RunOracle("load", dir, theirs, expected), 0) << "torch on " << theirs << " ranks";
}

TEST_P(DcpOracle, WeLoadWhatTorchSaves) {
  const auto [ours, theirs] = GetParam();
  ::tpudist::test_support::ScopedTempDir tmp;
  const std::string dir = tmp / "dcp", expected = tmp / "expected.safetensors";
  ASSERT_EQ(RunOracle("save", dir, theirs, expected), 0) << "torch on " << theirs << " ranks";
  absl::StatusOr<io::SafetensorsContents> want = io::ReadSafetensors(expected);
  ASSERT_TRUE(want.ok()) << want.status();
  torch::manual_seed(7);
  MlpStack init;
  LoadAndExpect(ours, *init, dir, want->tensors);
}

// (our world, torch's world): 4 -> 2 and 2 -> 4 both ways.
INSTANTIATE_TEST_SUITE_P(Worlds, DcpOracle, ::testing::Values(std::pair{4, 2}, std::pair{2, 4}));

}  // namespace
}  // namespace tpudist::fsdp
