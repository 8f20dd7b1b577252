// ParseTrainVsTorchFlags: defaults, --quick, explicit values over --quick,
// and every rejected value names its flag.
#include <string>
#include <vector>

#include "bench/train_vs_torch_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::bench {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<TrainVsTorchFlags> Parse(std::vector<std::string> args) {
  std::vector<const char*> argv = {"train_vs_torch"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseTrainVsTorchFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(TrainVsTorchFlagsTest, Defaults) {
  absl::StatusOr<TrainVsTorchFlags> f = Parse({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->world, 2);
  EXPECT_EQ(f->global_batch, 16);
  EXPECT_EQ(f->seq, 128);
  EXPECT_EQ(f->plan, "layers");
  EXPECT_FALSE(f->freeze_ple);
  EXPECT_DOUBLE_EQ(f->lr, 1e-3);
  EXPECT_DOUBLE_EQ(f->weight_decay, 0.01);
}

TEST(TrainVsTorchFlagsTest, QuickThenExplicitValuesWin) {
  absl::StatusOr<TrainVsTorchFlags> f =
      Parse({"--steps=7", "--quick", "--lr=2e-5", "--plan=mlp", "--freeze_ple=1", "--seed=9"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->quick);
  EXPECT_EQ(f->world, 2);
  EXPECT_EQ(f->global_batch, 4);
  EXPECT_EQ(f->seq, 32);
  EXPECT_EQ(f->warmup, 1);
  EXPECT_EQ(f->steps, 7);
  EXPECT_DOUBLE_EQ(f->lr, 2e-5);
  EXPECT_EQ(f->plan, "mlp");
  EXPECT_TRUE(f->freeze_ple);
  EXPECT_EQ(f->seed, 9u);
}

TEST(TrainVsTorchFlagsTest, RejectsBadValuesNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--world=4", "--global_batch=6"}, "--global_batch=6"},
      {{"--world=0"}, "--world=0"},
      {{"--seq=1"}, "--seq=1"},
      {{"--warmup=0"}, "--warmup=0"},
      {{"--steps=0"}, "--steps=0"},
      {{"--plan=blocks"}, "--plan=blocks"},
      {{"--backend=nccl"}, "--backend=nccl"},
      {{"--freeze_ple=2"}, "--freeze_ple=2"},
      {{"--lr=fast"}, "--lr=fast"},
      {{"--bogus=1"}, "unknown flag"},
      {{"world=2"}, "expected --name=value"},
  };
  for (const auto& [args, want] : cases) {
    absl::StatusOr<TrainVsTorchFlags> f = Parse(args);
    ASSERT_FALSE(f.ok()) << args[0];
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(want));
  }
}

}  // namespace
}  // namespace tpudist::bench
