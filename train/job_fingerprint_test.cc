#include "train/job_fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class JobFingerprintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.path() + "/model";
    std::filesystem::create_directories(model_ + "/sub");
    Write(model_ + "/config.json", "{\"vocab_size\": 512}");
    Write(model_ + "/model.safetensors", "weights");
    Write(model_ + "/tokenizer.json", "{}");
    Write(model_ + "/README.md", "not part of the job");
    Write(model_ + "/.hidden.json", "editor swap file");
    Write(model_ + "/sub/other.json", "not top level");
    Write(tmp_.path() + "/train.jsonl", "{\"instruction\":\"a\"}\n");
  }
  static void Write(const std::string& path, const std::string& body) {
    std::ofstream(path, std::ios::binary) << body;
  }
  JobSpec Spec() const {
    JobSpec s;
    s.model_dir = model_;
    s.dataset = tmp_.path() + "/train.jsonl";
    s.dataset_split = "train[:16]";
    s.dataset_rows = 16;
    s.max_seq_len = 64;
    s.batch_size_per_device = 2;
    s.num_epochs = 2;
    s.lr = 3e-3;
    s.weight_decay = 0.01;
    s.seed = 5;
    s.world_size = 2;
    return s;
  }

  internal::TestTempDir tmp_;
  std::string model_;
};

TEST_F(JobFingerprintTest, FieldsCoverModelDataAndHyperParameters) {
  auto f = ComputeJobFingerprint(Spec());
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<std::string> keys;
  for (const auto& [k, v] : *f) keys.push_back(k);
  EXPECT_THAT(keys, ElementsAre("batch_size_per_device", "bf16", "dataset", "dataset_rows", "dataset_split",
                                "include_context", "lr", "max_seq_len", "model/config.json",
                                "model/model.safetensors", "model/tokenizer.json", "num_epochs", "seed",
                                "weight_decay", "world_size"));
  EXPECT_EQ(f->at("lr"), "0.003");
  EXPECT_EQ(f->at("model/model.safetensors"), "bytes=7 crc32=1ad27358");
}

TEST_F(JobFingerprintTest, SameInputsSameFingerprintAndEachChangeIsNamed) {
  auto a = ComputeJobFingerprint(Spec());
  auto b = ComputeJobFingerprint(Spec());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(FingerprintDifferences(*a, *b), IsEmpty());

  JobSpec other = Spec();
  other.lr = 1e-3;
  auto c = ComputeJobFingerprint(other);
  EXPECT_THAT(FingerprintDifferences(*a, *c), ElementsAre("lr: 0.003 in the checkpoint, 0.001 now"));

  Write(model_ + "/model.safetensors", "weightz");  // same size, other bytes
  auto d = ComputeJobFingerprint(Spec());
  auto diff = FingerprintDifferences(*a, *d);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_THAT(diff[0], HasSubstr("model/model.safetensors: bytes=7 crc32="));

  JobFingerprint missing = *a;
  missing.erase("seed");
  EXPECT_THAT(FingerprintDifferences(missing, *a), ElementsAre("seed: absent in the checkpoint, 5 now"));
}

TEST_F(JobFingerprintTest, ErrorsNameTheFile) {
  JobSpec s = Spec();
  s.dataset = tmp_.path() + "/nope.jsonl";
  auto f = ComputeJobFingerprint(s);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("nope.jsonl"));
  s = Spec();
  s.model_dir = tmp_.path() + "/no_model";
  EXPECT_FALSE(ComputeJobFingerprint(s).ok());
}

TEST(CanonicalDoubleTest, ShortestRoundTrip) {
  EXPECT_EQ(CanonicalDouble(2e-5), "2e-05");
  EXPECT_EQ(CanonicalDouble(0.01), "0.01");
  EXPECT_EQ(CanonicalDouble(0.0), "0");
  EXPECT_NE(CanonicalDouble(2e-5), CanonicalDouble(std::nextafter(2e-5, 1.0)));
}

}  // namespace
}  // namespace tpudist::train
