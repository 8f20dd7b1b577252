// CheckpointStorage against file:// and against a real S3-compatible server:
// moto (requirements.txt) started on a free loopback port per suite, stopped
// by pid. The remote side is inspected and damaged with std::filesystem
// (file://) or boto3 (s3://, moto's own dependency), not through the code
// under test.
#include "train/checkpoint_storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "train/checkpoint_manager.h"
#include "train/internal/fs_util.h"
#include "train/internal/moto_server_for_test.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;
using internal::MotoServer;
using internal::RunPython;

MotoServer* moto_server = nullptr;

class StorageEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    // The standard AWS variables, as a user sets them (never logged).
    setenv("AWS_ACCESS_KEY_ID", "testing", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "testing", 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    if (StorageUrisSupported()) moto_server = MotoServer::Start();
  }
  void TearDown() override {
    delete moto_server;
    moto_server = nullptr;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new StorageEnv);

enum class Backend { kFile, kS3 };

class CheckpointStorageTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!StorageUrisSupported()) GTEST_SKIP() << "built without Arrow";
    if (GetParam() == Backend::kS3) {
      if (moto_server == nullptr || !moto_server->ready()) GTEST_SKIP() << "moto server not available";
      prefix_ = absl::StrCat("p", ::testing::UnitTest::GetInstance()->current_test_info()->name());
      for (char& ch : prefix_) {
        if (ch == '/') ch = '_';
      }
      uri_ = absl::StrCat("s3://bkt/", prefix_, "?endpoint_override=127.0.0.1:", moto_server->port(),
                          "&scheme=http&region=us-east-1");
    } else {
      uri_ = absl::StrCat("file://", tmp_.path(), "/remote");
    }
    CheckpointManagerOptions o;
    o.storage_path = tmp_.path() + "/local";
    o.run_name = "run";
    o.now = [this] { return absl::FromUnixSeconds(1'800'000'000 + ticks_++); };
    auto m = CheckpointManager::Open(o);
    ASSERT_TRUE(m.ok()) << m.status();
    mgr_ = *std::move(m);
    storage_ = OpenStorage();
    ASSERT_NE(storage_, nullptr);
  }
  std::unique_ptr<CheckpointStorage> OpenStorage() {
    CheckpointStorageOptions so;
    so.uri = uri_;
    so.run_name = "run";
    so.warn = [this](absl::string_view m) { warnings_.emplace_back(m); };
    auto s = CheckpointStorage::Open(so);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  static void WriteFile(const std::string& path, const std::string& body) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << body;
  }
  CheckpointInfo Save(int64_t epoch, const std::string& payload) {
    auto p = mgr_->BeginWrite();
    EXPECT_TRUE(p.ok()) << p.status();
    WriteFile(p->path + "/model.safetensors", payload);
    WriteFile(p->path + "/shards/rank_1.pt", payload + payload);
    auto info = mgr_->Commit(*p, {epoch, 0, 1.0 / epoch, {}});
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : CheckpointInfo{};
  }
  static std::string Base(const std::string& dir) { return std::filesystem::path(dir).filename().string(); }
  // Deletes one remote object of checkpoint `name`.
  void RemoveRemote(const std::string& name, const std::string& file) {
    if (GetParam() == Backend::kFile) {
      ASSERT_TRUE(std::filesystem::remove(absl::StrCat(tmp_.path(), "/remote/run/", name, "/", file)));
    } else {
      ASSERT_EQ(RunPython(moto_server->Boto(absl::StrCat("c.delete_object(Bucket='bkt', Key='", prefix_, "/run/",
                                                          name, "/", file, "')"))),
                0);
    }
  }
  // Overwrites one remote object with `body`.
  void PutRemote(const std::string& name, const std::string& file, const std::string& body) {
    if (GetParam() == Backend::kFile) {
      WriteFile(absl::StrCat(tmp_.path(), "/remote/run/", name, "/", file), body);
    } else {
      ASSERT_EQ(RunPython(moto_server->Boto(absl::StrCat("c.put_object(Bucket='bkt', Key='", prefix_, "/run/", name,
                                                          "/", file, "', Body=b'", body, "')"))),
                0);
    }
  }

  internal::TestTempDir tmp_;
  std::string uri_, prefix_;
  int64_t ticks_ = 0;
  std::unique_ptr<CheckpointManager> mgr_;
  std::unique_ptr<CheckpointStorage> storage_;
  std::vector<std::string> warnings_;
};

TEST_P(CheckpointStorageTest, UploadListDownloadRoundTrip) {
  auto empty = storage_->ListComplete();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  const CheckpointInfo c1 = Save(1, "one");
  const CheckpointInfo c2 = Save(2, "two-two");
  ASSERT_TRUE(storage_->Upload(c1.path).ok());
  ASSERT_TRUE(storage_->Upload(c2.path).ok());

  auto listed = storage_->ListComplete();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name, Base(c1.path));
  EXPECT_EQ((*listed)[1].name, Base(c2.path));
  EXPECT_EQ((*listed)[1].metadata.sequence, c2.metadata.sequence);

  // A fresh machine: an empty local run dir resumes from the newest.
  const std::string fresh = tmp_.path() + "/fresh/run";
  ASSERT_TRUE(internal::MakeDirs(fresh).ok());
  auto got = OpenStorage()->FetchNewestVerified(fresh);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, fresh + "/" + Base(c2.path));
  EXPECT_EQ(*internal::ReadFile(**got + "/shards/rank_1.pt"), "two-twotwo-two");
  EXPECT_EQ(*internal::ReadFile(**got + "/checkpoint.json"), *internal::ReadFile(c2.path + "/checkpoint.json"));
  // The local manager takes it as its own (every byte verified).
  CheckpointManagerOptions o;
  o.storage_path = tmp_.path() + "/fresh";
  o.run_name = "run";
  auto m = CheckpointManager::Open(o);
  ASSERT_TRUE(m.ok()) << m.status();
  auto latest = (*m)->LatestVerified();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->metadata.sequence, c2.metadata.sequence);
  // Already local: not downloaded again.
  auto again = storage_->FetchNewestVerified(fresh);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ(**again, **got);
}

// A crash between the files and checkpoint.json leaves an upload without a
// marker: never listed, and resume takes the older complete one.
TEST_P(CheckpointStorageTest, PartialUploadIsNotComplete) {
  const CheckpointInfo c1 = Save(1, "one");
  const CheckpointInfo c2 = Save(2, "two");
  ASSERT_TRUE(storage_->Upload(c1.path).ok());
  ASSERT_TRUE(storage_->Upload(c2.path).ok());
  RemoveRemote(Base(c2.path), "checkpoint.json");
  auto listed = storage_->ListComplete();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, Base(c1.path));
  const std::string fresh = tmp_.path() + "/fresh";
  ASSERT_TRUE(internal::MakeDirs(fresh).ok());
  auto got = storage_->FetchNewestVerified(fresh);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ(**got, fresh + "/" + Base(c1.path));
}

// A marker whose file is missing or of another size: skipped with a warning.
TEST_P(CheckpointStorageTest, MissingOrTruncatedFileIsNotComplete) {
  const CheckpointInfo c1 = Save(1, "one");
  const CheckpointInfo c2 = Save(2, "two");
  ASSERT_TRUE(storage_->Upload(c1.path).ok());
  ASSERT_TRUE(storage_->Upload(c2.path).ok());
  RemoveRemote(Base(c1.path), "shards/rank_1.pt");
  PutRemote(Base(c2.path), "model.safetensors", "tw");
  auto listed = storage_->ListComplete();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  ASSERT_EQ(warnings_.size(), 2u);
  EXPECT_THAT(warnings_[0], HasSubstr("shards/rank_1.pt is missing"));
  EXPECT_THAT(warnings_[1], HasSubstr("model.safetensors has the wrong size"));
}

// Same size, other bytes: the download's CRC-32 check refuses it, leaves
// nothing behind, and resume falls back to the older checkpoint.
TEST_P(CheckpointStorageTest, CorruptDownloadFallsBackToOlder) {
  const CheckpointInfo c1 = Save(1, "one");
  const CheckpointInfo c2 = Save(2, "two");
  ASSERT_TRUE(storage_->Upload(c1.path).ok());
  ASSERT_TRUE(storage_->Upload(c2.path).ok());
  PutRemote(Base(c2.path), "model.safetensors", "twX");
  const std::string fresh = tmp_.path() + "/fresh";
  ASSERT_TRUE(internal::MakeDirs(fresh).ok());
  auto got = storage_->FetchNewestVerified(fresh);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ(**got, fresh + "/" + Base(c1.path));
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_THAT(warnings_[0], HasSubstr("is corrupt"));
  EXPECT_THAT(warnings_[0], HasSubstr("model.safetensors"));
  EXPECT_EQ(*internal::ListDir(fresh), std::vector<std::string>{Base(c1.path)});
}

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointStorageTest, ::testing::Values(Backend::kFile, Backend::kS3),
                         [](const auto& info) { return info.param == Backend::kFile ? "File" : "S3"; });

TEST(StorageUriTest, SchemesAndRedaction) {
  EXPECT_TRUE(IsStorageUri("s3://bkt/x"));
  EXPECT_TRUE(IsStorageUri("file:///tmp/x"));
  EXPECT_FALSE(IsStorageUri("/tmp/x"));
  EXPECT_FALSE(IsStorageUri("rel/dir"));
  EXPECT_FALSE(IsStorageUri("://x"));
  EXPECT_EQ(RedactedUri("s3://b/p?access_key=AK&secret_key=SK"), "s3://b/p?...");
  EXPECT_EQ(RedactedUri("s3://b/p"), "s3://b/p");
}

TEST(StorageUriTest, ErrorsNameTheUriWithoutSecrets) {
  CheckpointStorageOptions so;
  so.uri = "nosuch://x/y?secret_key=SK";
  so.run_name = "run";
  auto s = CheckpointStorage::Open(so);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("nosuch://x/y?..."));
  EXPECT_THAT(std::string(s.status().message()), ::testing::Not(HasSubstr("SK")));
  so.uri = "s3://";
  EXPECT_FALSE(CheckpointStorage::Open(so).ok());
  so.uri = "file:///tmp";
  so.run_name = "a/b";
  EXPECT_EQ(CheckpointStorage::Open(so).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpudist::train
