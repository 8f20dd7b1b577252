#include "train/training_flags.h"

#include <cmath>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

std::string Message(const TrainingFlags& f) { return std::string(ValidateTrainingFlags(f).message()); }

TEST(TrainingFlagsTest, DefaultsAndZeroLrPass) {
  EXPECT_TRUE(ValidateTrainingFlags({}).ok());
  TrainingFlags f;
  f.lr = 0;  // the world-size equivalence test trains with --lr 0
  f.weight_decay = 0;
  EXPECT_TRUE(ValidateTrainingFlags(f).ok());
}

TEST(TrainingFlagsTest, LrAndWeightDecayMustBeFiniteNonNegative) {
  TrainingFlags f;
  f.lr = std::nan("");
  EXPECT_EQ(ValidateTrainingFlags(f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(f), HasSubstr("--lr nan: must be a finite number >= 0"));
  f.lr = std::numeric_limits<double>::infinity();
  EXPECT_THAT(Message(f), HasSubstr("--lr inf"));
  f.lr = -1e-5;
  EXPECT_THAT(Message(f), HasSubstr("--lr -1e-05"));
  f = {};
  f.weight_decay = -0.1;
  EXPECT_THAT(Message(f), HasSubstr("--weight-decay -0.1"));
  f.weight_decay = std::nan("");
  EXPECT_THAT(Message(f), HasSubstr("--weight-decay nan"));
}

// Representable where used (issue 39): the optimizer computes in fp32.
TEST(TrainingFlagsTest, LrAndWeightDecayMustBeNormalInFloat32) {
  TrainingFlags f;
  f.lr = 1e-300;  // > 0, but 0 in fp32
  EXPECT_EQ(ValidateTrainingFlags(f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(f), HasSubstr("--lr 1e-300: is 0 or subnormal in float32"));
  f.lr = 1e-40;  // subnormal in fp32
  EXPECT_THAT(Message(f), HasSubstr("--lr 1e-40: is 0 or subnormal in float32"));
  f.lr = 1e39;
  EXPECT_THAT(Message(f), HasSubstr("--lr 1e+39: is inf in float32"));
  f = {};
  f.weight_decay = 1e-300;
  EXPECT_THAT(Message(f), HasSubstr("--weight-decay 1e-300: is 0 or subnormal"));
  f = {};
  f.lr = 1e6;  // representable: training's non-finite check is what stops it
  EXPECT_TRUE(ValidateTrainingFlags(f).ok());
  f.lr = 1e-30;
  EXPECT_TRUE(ValidateTrainingFlags(f).ok());
}

TEST(TrainingFlagsTest, SizesAreBounded) {
  TrainingFlags f;
  f.max_seq_len = 1;
  EXPECT_THAT(Message(f), HasSubstr("--max-seq-len 1: must be in [2, 1048576]"));
  f.max_seq_len = int64_t{1} << 40;
  EXPECT_THAT(Message(f), HasSubstr("--max-seq-len 1099511627776"));
  f = {};
  f.batch_size_per_device = 0;
  EXPECT_THAT(Message(f), HasSubstr("--batch-size-per-device 0"));
  f.batch_size_per_device = -4;
  EXPECT_THAT(Message(f), HasSubstr("--batch-size-per-device -4"));
  f = {};
  f.num_epochs = 0;
  EXPECT_THAT(Message(f), HasSubstr("--num-epochs 0"));
  f = {};
  f.batch_size_per_device = 1024;
  f.max_seq_len = 1 << 15;
  EXPECT_THAT(Message(f), HasSubstr("tokens per step and device"));
}

TEST(TrainingFlagsTest, TensorParallelMustDivideTheWorld) {
  TrainingFlags f;
  f.tp = 0;
  EXPECT_THAT(Message(f), ::testing::HasSubstr("--tp 0"));
  EXPECT_TRUE(ValidateTensorParallel(2, 4).ok());
  EXPECT_TRUE(ValidateTensorParallel(1, 3).ok());
  absl::Status s = ValidateTensorParallel(3, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("--tp 3: must divide the world size 4"));
}

TEST(TrainingFlagsTest, HsdpReplicasMustDivideTheWorldNamingBothNumbers) {
  EXPECT_TRUE(ValidateHsdp(2, 4, 1).ok());
  EXPECT_TRUE(ValidateHsdp(1, 3, 1).ok());
  EXPECT_TRUE(ValidateHsdp(4, 4, 1).ok());
  absl::Status s = ValidateHsdp(4, 6, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("--hsdp: the world size 6 is not divisible by 4 replicas"));
  EXPECT_THAT(std::string(ValidateHsdp(0, 4, 1).message()), ::testing::HasSubstr("not divisible by 0 replicas"));
  EXPECT_THAT(std::string(ValidateHsdp(2, 4, 2).message()), ::testing::HasSubstr("--hsdp with --tp 2"));
}

}  // namespace
}  // namespace tpudist::train
