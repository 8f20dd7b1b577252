// gemma_finetune with a URI --storage-path under tpurun (2 ranks, the tiny
// model, 16 rows), against file:// and against a moto S3 server on loopback
// (internal/moto_server_for_test.h). A 2-epoch run uploads both checkpoints;
// then the newest one's remote checkpoint.json is removed (what a crash
// between the files and the marker leaves) and a run on a fresh staging
// directory (another machine) must download the epoch-1 checkpoint, resume
// at epoch 2, end with the uninterrupted run's epoch-2 loss and upload its
// own checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "train/checkpoint_storage.h"
#include "train/internal/finetune_process_for_test.h"
#include "train/internal/moto_server_for_test.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;
using internal::MotoServer;
using internal::RunPython;

constexpr int kWorld = 2;
constexpr char kSecret[] = "e2e-Secret-Value-Never-Printed";

std::string EpochLoss(const std::string& output, int epoch) {
  std::smatch m;
  const std::regex re(absl::StrCat("Epoch ", epoch, "/2 \\| loss=([0-9.]+)"));
  return std::regex_search(output, m, re) ? m[1].str() : std::string("none");
}

std::string NewestLocalCheckpoint(const std::string& run_dir) {
  std::string newest;
  for (const auto& e : std::filesystem::directory_iterator(run_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint_", 0) == 0 && name > newest) newest = name;
  }
  return newest;
}

class CheckpointStorageE2eTest : public ::testing::TestWithParam<bool> {  // true: s3://
 protected:
  void SetUp() override {
    if (!StorageUrisSupported()) GTEST_SKIP() << "built without Arrow";
    setenv("AWS_ACCESS_KEY_ID", "testing", 1);
    setenv("AWS_SECRET_ACCESS_KEY", kSecret, 1);  // moto takes any
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    if (GetParam()) {
      moto_.reset(MotoServer::Start());
      if (moto_ == nullptr || !moto_->ready()) GTEST_SKIP() << "moto server not available";
      uri_ = absl::StrCat("s3://bkt/runs?endpoint_override=127.0.0.1:", moto_->port(),
                          "&scheme=http&region=us-east-1");
    } else {
      uri_ = absl::StrCat("file://", tmp_.path(), "/remote");
    }
  }
  internal::RunOutput Run(const std::string& staging) {
    return internal::RunGemmaFinetune(
        TPURUN_PATH, GEMMA_FINETUNE_PATH, kWorld, "",
        absl::StrCat("--storage-path '", uri_, "' --staging-path ", staging,
                     " --run-name r --dataset-split train[:16] --num-epochs 2 --batch-size-per-device 2 "
                     "--max-seq-len 32 --lr 3e-3 --num-to-keep 0 --seed 5"),
        120);
  }
  // Removes <uri>/r/<name>/checkpoint.json; true on success.
  bool RemoveRemoteMarker(const std::string& name) {
    if (!GetParam()) return std::filesystem::remove(absl::StrCat(tmp_.path(), "/remote/r/", name, "/checkpoint.json"));
    return RunPython(moto_->Boto(absl::StrCat("c.delete_object(Bucket='bkt', Key='runs/r/", name,
                                              "/checkpoint.json')"))) == 0;
  }
  // Number of checkpoint.json objects under <uri>/r.
  int RemoteMarkers() {
    if (!GetParam()) {
      int n = 0;
      for (const auto& e : std::filesystem::recursive_directory_iterator(tmp_.path() + "/remote/r")) {
        n += e.path().filename() == "checkpoint.json";
      }
      return n;
    }
    return RunPython(moto_->Boto("import sys; ks = [o['Key'] for o in c.list_objects_v2(Bucket='bkt')"
                                 ".get('Contents', [])]; sys.exit(sum(k.endswith('/checkpoint.json') for k in ks))"));
  }

  internal::TestTempDir tmp_;
  std::unique_ptr<MotoServer> moto_;
  std::string uri_;
};

TEST_P(CheckpointStorageE2eTest, ResumesOnAnotherMachineFromTheNewestCompleteUpload) {
  const internal::RunOutput a = Run(tmp_.path() + "/staging_a");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(RemoteMarkers(), 2) << a.output;
  const std::string epoch2 = NewestLocalCheckpoint(tmp_.path() + "/staging_a/r");
  ASSERT_TRUE(RemoveRemoteMarker(epoch2));

  const internal::RunOutput b = Run(tmp_.path() + "/staging_b");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_THAT(b.output, HasSubstr("(epoch 2, step 0)")) << b.output;  // resumed after epoch 1
  EXPECT_EQ(EpochLoss(b.output, 1), "none") << b.output;
  EXPECT_EQ(EpochLoss(b.output, 2), EpochLoss(a.output, 2)) << a.output << b.output;
  EXPECT_EQ(RemoteMarkers(), 2) << b.output;  // epoch 1's and b's own epoch 2
  EXPECT_THAT(a.output + b.output, ::testing::Not(HasSubstr(kSecret)));
}

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointStorageE2eTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "S3" : "File"; });

}  // namespace
}  // namespace tpudist::train
