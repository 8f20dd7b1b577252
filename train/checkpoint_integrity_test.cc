// Checkpoint integrity: per-file CRC-32 in checkpoint.json and its own
// manifest_crc32, verification before use, fallback past corrupt
// checkpoints, quarantine, I/O errors retried and never quarantined, and
// cleanup of incomplete commits (checkpoint_manager.h,
// checkpoint_metadata.h, checkpoint_file_reader.h, file_checksum.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "train/checkpoint_file_reader.h"
#include "train/checkpoint_manager.h"
#include "train/file_checksum.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Overwrites one byte at `offset` in place (size unchanged).
void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  c = static_cast<char>(c ^ 0x5a);
  f.write(&c, 1);
}

// Replaces the first occurrence of `from` in the file at `path` by `to`
// (same length: a one-character change in place).
void ReplaceInFile(const std::string& path, const std::string& from, const std::string& to) {
  auto body = internal::ReadFile(path);
  ASSERT_TRUE(body.ok()) << body.status();
  const size_t at = body->find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << *body;
  body->replace(at, from.size(), to);
  ASSERT_TRUE(internal::WriteFileSynced(path, *body).ok());
}

// checkpoint.json as a build before manifest_crc32 wrote it: format 2, no
// manifest_crc32 member.
std::string AsFormat2(std::string json) {
  const size_t at = json.rfind(",\"manifest_crc32\":");
  EXPECT_NE(at, std::string::npos);
  json = json.substr(0, at) + "}\n";
  json.replace(json.find("\"format\":3"), 10, "\"format\":2");
  return json;
}

class CheckpointIntegrityTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointManager> Open(int num_to_keep = 0) {
    CheckpointManagerOptions o;
    o.storage_path = tmp_.path();
    o.run_name = "run";
    o.num_to_keep = num_to_keep;
    o.now = [this] { return absl::FromUnixSeconds(1'800'000'000 + ticks_++); };
    o.warn = [this](absl::string_view m) { warnings_.emplace_back(m); };
    o.error = [this](absl::string_view m) { errors_.emplace_back(m); };
    // Every raw read first consults eio_left_: a path ending in one of its
    // keys fails with EIO while that count is not 0 (-1: forever).
    auto fault = [this](const std::string& path) -> absl::Status {
      ++calls_[path];
      for (auto& [suffix, left] : eio_left_) {
        if (!absl::EndsWith(path, suffix) || left == 0) continue;
        if (left > 0) --left;
        return absl::InternalError(absl::StrCat("open '", path, "': Input/output error"));
      }
      return absl::OkStatus();
    };
    o.file_ops.read_file = [fault](const std::string& p) -> absl::StatusOr<std::string> {
      if (absl::Status st = fault(p); !st.ok()) return st;
      return internal::ReadFile(p);
    };
    o.file_ops.file_size = [fault](const std::string& p) -> absl::StatusOr<int64_t> {
      if (absl::Status st = fault(p); !st.ok()) return st;
      return internal::FileSize(p);
    };
    o.file_ops.digest_file = [fault](const std::string& p) -> absl::StatusOr<FileDigest> {
      if (absl::Status st = fault(p); !st.ok()) return st;
      return DigestFile(p);
    };
    o.io_retry.first_backoff = absl::Milliseconds(1);
    auto m = CheckpointManager::Open(o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  CheckpointInfo Save(CheckpointManager& m, int64_t epoch, double loss) {
    auto p = m.BeginWrite();
    EXPECT_TRUE(p.ok()) << p.status();
    fs::create_directories(p->path + "/shards");
    std::ofstream(p->path + "/model.safetensors") << "model weights of epoch " << epoch;
    std::ofstream(p->path + "/shards/optim-1-of-2.safetensors") << "adam state " << epoch;
    auto info = m.Commit(*p, {epoch, 8, loss, {{"lr", "0.003"}}});
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : CheckpointInfo{};
  }

  internal::TestTempDir tmp_;
  int64_t ticks_ = 0;
  std::vector<std::string> warnings_, errors_;
  std::map<std::string, int> eio_left_;  // path suffix -> failures to inject
  std::map<std::string, int> calls_;     // path -> raw reads tried
};

TEST(FileChecksumTest, KnownValuesAndHex) {
  EXPECT_EQ(Crc32(""), 0u);
  EXPECT_EQ(Crc32("123456789"), 0xcbf43926u);  // the CRC-32/ISO-HDLC check value
  EXPECT_EQ(Crc32ToHex(0xcbf43926u), "cbf43926");
  EXPECT_EQ(Crc32ToHex(0x1u), "00000001");
  EXPECT_EQ(Crc32FromHex("CBF43926"), 0xcbf43926u);
  EXPECT_FALSE(Crc32FromHex("cbf4392").has_value());
  EXPECT_FALSE(Crc32FromHex("cbf4392g").has_value());
  internal::TestTempDir tmp;
  const std::string path = tmp.path() + "/f";
  std::string big(3 << 20, 'x');  // spans several read chunks
  big[12345] = 'y';
  std::ofstream(path, std::ios::binary) << big;
  auto d = DigestFile(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes, static_cast<int64_t>(big.size()));
  EXPECT_EQ(d->crc32, Crc32(big));
  EXPECT_EQ(DigestFile(tmp.path() + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointIntegrityTest, CommitRecordsEveryFilesCrcAndTheJob) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 0, 2.0);
  ASSERT_THAT(c.metadata.files, SizeIs(2));
  for (const CheckpointFile& f : c.metadata.files) {
    auto body = internal::ReadFile(c.path + "/" + f.path);
    ASSERT_TRUE(body.ok());
    EXPECT_EQ(f.crc32, Crc32(*body)) << f.path;
  }
  auto text = internal::ReadFile(c.path + "/checkpoint.json");
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(*text, HasSubstr("\"format\":3"));
  // manifest_crc32 is last and covers every byte before it (the by-hand
  // recipe of checkpoint_metadata.h).
  const size_t at = text->rfind(",\"manifest_crc32\":\"");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(text->substr(at), absl::StrCat(",\"manifest_crc32\":\"", Crc32ToHex(Crc32(text->substr(0, at))),
                                           "\"}\n"));
  EXPECT_THAT(*text, HasSubstr("\"crc32\":\"" + Crc32ToHex(c.metadata.files[0].crc32) + "\""));
  EXPECT_THAT(*text, HasSubstr("\"job\":{\"lr\":\"0.003\"}"));
  auto parsed = ParseCheckpointMetadata(*text, "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->job.at("lr"), "0.003");
  EXPECT_TRUE(parsed->manifest_checksum);
  EXPECT_TRUE(m->Verify(c).ok());
}

TEST_F(CheckpointIntegrityTest, ByteFlipIsCaughtOnlyByChecksumsAndSkipped) {
  auto m = Open();
  const CheckpointInfo older = Save(*m, 0, 2.0);
  const CheckpointInfo newer = Save(*m, 1, 1.0);
  const std::string shard = newer.path + "/shards/optim-1-of-2.safetensors";
  FlipByte(shard, 3);
  // Sizes still match: the cheap listing cannot tell.
  EXPECT_THAT(*m->ListComplete(), SizeIs(2));
  absl::Status v = m->Verify(newer);
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(v.message()), AllOf(HasSubstr(shard), HasSubstr("is corrupt: crc32")));

  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->path, older.path);
  ASSERT_THAT(errors_, SizeIs(1));
  EXPECT_THAT(errors_[0], AllOf(HasSubstr(shard), HasSubstr("will not be loaded")));
  // Quarantined: never complete again, kept for inspection, reported once.
  EXPECT_FALSE(fs::exists(newer.path + "/checkpoint.json"));
  EXPECT_TRUE(fs::exists(newer.path + "/checkpoint.json.corrupt"));
  errors_.clear();
  EXPECT_EQ((*m->LatestVerified())->path, older.path);
  EXPECT_THAT(errors_, IsEmpty());
  // Retention neither counts nor deletes it; the sequence goes on.
  m = Open(1);
  const CheckpointInfo next = Save(*m, 2, 0.5);
  EXPECT_EQ(next.metadata.sequence, 2);  // max over complete ones (older = 1) + 1
  EXPECT_TRUE(fs::exists(newer.path));
  EXPECT_FALSE(fs::exists(older.path));  // pruned by num_to_keep 1
}

TEST_F(CheckpointIntegrityTest, NoVerifiedCheckpointLeftIsAnErrorNotAFreshStart) {
  auto m = Open();
  const CheckpointInfo a = Save(*m, 0, 2.0);
  const CheckpointInfo b = Save(*m, 1, 1.0);
  FlipByte(a.path + "/model.safetensors", 0);
  FlipByte(b.path + "/model.safetensors", 5);
  auto latest = m->LatestVerified();
  ASSERT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(latest.status().message()),
              AllOf(HasSubstr("2 corrupt"), HasSubstr(a.path + "/model.safetensors"),
                    HasSubstr(b.path + "/model.safetensors")));
  EXPECT_THAT(errors_, SizeIs(2));
  // Both stay quarantined: the next look (a restarted attempt) fails too,
  // rather than mistaking the run for a fresh one.
  errors_.clear();
  auto again = m->LatestVerified();
  ASSERT_EQ(again.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(again.status().message()),
              AllOf(HasSubstr("found corrupt earlier"), HasSubstr(a.path), HasSubstr(b.path)));
  EXPECT_THAT(errors_, IsEmpty());
}

TEST_F(CheckpointIntegrityTest, TornMarkerIsNotUsed) {
  auto m = Open();
  const CheckpointInfo a = Save(*m, 0, 2.0);
  const CheckpointInfo b = Save(*m, 1, 1.0);
  auto body = internal::ReadFile(b.path + "/checkpoint.json");
  ASSERT_TRUE(body.ok());
  ASSERT_TRUE(internal::WriteFileSynced(b.path + "/checkpoint.json", body->substr(0, body->size() / 2)).ok());
  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
  EXPECT_EQ((*latest)->path, a.path);
  ASSERT_THAT(errors_, SizeIs(1));
  EXPECT_THAT(errors_[0], AllOf(HasSubstr(b.path + "/checkpoint.json"), HasSubstr("bad JSON")));
  // The only checkpoint torn: an error, not "no checkpoint".
  ASSERT_TRUE(internal::WriteFileSynced(a.path + "/checkpoint.json", "{\"format\":2,").ok());
  EXPECT_EQ(m->LatestVerified().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointIntegrityTest, OldFormatWithoutChecksumsIsRefused) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 0, 2.0);
  auto body = internal::ReadFile(c.path + "/checkpoint.json");
  std::string v1 = AsFormat2(*body);
  v1.replace(v1.find("\"format\":2"), 10, "\"format\":1");
  ASSERT_TRUE(internal::WriteFileSynced(c.path + "/checkpoint.json", v1).ok());
  auto latest = m->LatestVerified();
  ASSERT_FALSE(latest.ok());
  EXPECT_THAT(std::string(latest.status().message()), HasSubstr("unsupported format 1"));
}

// Issue 39: "epoch":1 -> "epoch":3 (one bit) made a run look finished, and
// "step":8 -> "step":0 made it drop a metrics line. Every one-bit flip of
// checkpoint.json is now DataLoss.
TEST_F(CheckpointIntegrityTest, ManifestChecksumCatchesEveryOneBitFlip) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 1, 2.0);
  auto text = internal::ReadFile(c.path + "/checkpoint.json");
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(ParseCheckpointMetadata(*text, "x").ok());
  int caught = 0;
  for (size_t i = 0; i < text->size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = *text;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      auto parsed = ParseCheckpointMetadata(flipped, "x");
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
          << "byte " << i << " bit " << bit << ": " << flipped;
      caught += parsed.status().code() == absl::StatusCode::kDataLoss;
    }
  }
  EXPECT_EQ(caught, static_cast<int>(text->size() * 8));
  // The member itself dropped while "format" still says 3.
  std::string dropped = *text;
  dropped = dropped.substr(0, dropped.rfind(",\"manifest_crc32\":")) + "}\n";
  auto parsed = ParseCheckpointMetadata(dropped, "x");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("no \"manifest_crc32\""));
}

TEST_F(CheckpointIntegrityTest, FlippedEpochInManifestIsQuarantinedAndTheOlderOneUsed) {
  auto m = Open();
  const CheckpointInfo older = Save(*m, 0, 2.0);
  const CheckpointInfo newer = Save(*m, 1, 1.0);
  const std::string marker = newer.path + "/checkpoint.json";
  ReplaceInFile(marker, "\"epoch\":1", "\"epoch\":3");  // '1' ^ '3' is one bit
  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
  EXPECT_EQ((*latest)->path, older.path);
  EXPECT_EQ((*latest)->metadata.epoch, 0);
  ASSERT_THAT(errors_, SizeIs(1));
  EXPECT_THAT(errors_[0], AllOf(HasSubstr(marker + " is corrupt: its bytes have crc32"),
                                HasSubstr("will not be loaded")));
  EXPECT_TRUE(fs::exists(newer.path + "/checkpoint.json.corrupt"));
  // The only checkpoint's "step":8 -> "step":0: refused, not used.
  fs::remove_all(newer.path);
  ReplaceInFile(older.path + "/checkpoint.json", "\"step\":8", "\"step\":0");
  auto none = m->LatestVerified();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("passes verification"));
}

// A checkpoint written by yesterday's build (format 2, no manifest_crc32)
// still resumes, with a warning that its fields are unprotected.
TEST_F(CheckpointIntegrityTest, Format2CheckpointStillResumesWithAWarning) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 0, 2.0);
  const std::string marker = c.path + "/checkpoint.json";
  auto body = internal::ReadFile(marker);
  ASSERT_TRUE(body.ok());
  ASSERT_TRUE(internal::WriteFileSynced(marker, AsFormat2(*body)).ok());
  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
  EXPECT_EQ((*latest)->path, c.path);
  EXPECT_FALSE((*latest)->metadata.manifest_checksum);
  EXPECT_THAT(errors_, IsEmpty());
  EXPECT_THAT(warnings_, ::testing::Contains(AllOf(HasSubstr(c.path), HasSubstr("older build"),
                                                   HasSubstr("format 2"))));
  // Its per-file CRC-32s are still checked.
  FlipByte(c.path + "/model.safetensors", 2);
  EXPECT_EQ(m->LatestVerified().status().code(), absl::StatusCode::kDataLoss);
}

// Issue 39: one EIO while verifying the only checkpoint (--num-to-keep 1)
// quarantined it for good. Now a transient error is retried and the
// checkpoint used, for checkpoint.json, a file's size and its bytes.
TEST_F(CheckpointIntegrityTest, TransientIoErrorIsRetriedAndNothingQuarantined) {
  auto m = Open(1);
  const CheckpointInfo c = Save(*m, 0, 2.0);
  for (const std::string file : {"/checkpoint.json", "/model.safetensors", "/shards/optim-1-of-2.safetensors"}) {
    SCOPED_TRACE(file);
    eio_left_ = {{file, 2}};  // two failed tries, the third succeeds
    calls_.clear();
    auto latest = m->LatestVerified();
    ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
    EXPECT_EQ((*latest)->path, c.path);
    EXPECT_EQ(eio_left_[file], 0);
    EXPECT_GE(calls_[c.path + file], 3);
    EXPECT_THAT(errors_, IsEmpty());
    EXPECT_TRUE(fs::exists(c.path + "/checkpoint.json"));
  }
}

TEST_F(CheckpointIntegrityTest, PersistentIoErrorIsReportedNamingTheFileAndNothingQuarantined) {
  auto m = Open(1);
  const CheckpointInfo c = Save(*m, 0, 2.0);
  for (const std::string file : {"/checkpoint.json", "/shards/optim-1-of-2.safetensors"}) {
    SCOPED_TRACE(file);
    eio_left_ = {{file, -1}};
    auto latest = m->LatestVerified();
    ASSERT_EQ(latest.status().code(), absl::StatusCode::kUnavailable) << latest.status();
    EXPECT_THAT(std::string(latest.status().message()),
                AllOf(HasSubstr("I/O error reading '" + c.path + file + "' (3 tries over "),
                      HasSubstr("Input/output error"), HasSubstr("Nothing was quarantined")));
    EXPECT_THAT(errors_, IsEmpty());
    EXPECT_TRUE(fs::exists(c.path + "/checkpoint.json"));
    EXPECT_FALSE(fs::exists(c.path + "/checkpoint.json.corrupt"));
    // The storage recovers: the same checkpoint resumes.
    eio_left_.clear();
    auto later = m->LatestVerified();
    ASSERT_TRUE(later.ok() && later->has_value()) << later.status();
    EXPECT_EQ((*later)->path, c.path);
  }
}

// With the default policy the three tries of a failing read take about
// 50 + 100 ms: bounded, and short next to a resume.
TEST(CheckpointFileReaderTest, DefaultRetriesAreBoundedAndMissingFilesAreNotRetried) {
  int calls = 0;
  CheckpointFileOps ops;
  ops.read_file = [&calls](const std::string& p) -> absl::StatusOr<std::string> {
    ++calls;
    return absl::InternalError(absl::StrCat("read '", p, "': Input/output error"));
  };
  ops.file_size = [&calls](const std::string& p) -> absl::StatusOr<int64_t> {
    ++calls;
    return absl::NotFoundError(absl::StrCat("stat '", p, "': No such file or directory"));
  };
  const CheckpointFileReader reader(ops);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::string> r = reader.ReadFile("/ckpt/checkpoint.json");
  const absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(IsCheckpointIoError(r.status())) << r.status();
  EXPECT_EQ(calls, 3);
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(2));
  calls = 0;
  EXPECT_EQ(reader.FileSize("/ckpt/x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 1);
}

TEST_F(CheckpointIntegrityTest, IncompleteCommitIsIgnoredThenPruned) {
  auto m = Open();  // keep all: incomplete commits go anyway
  const CheckpointInfo a = Save(*m, 0, 2.0);
  const std::string crashed = m->run_dir() + "/checkpoint_2099-01-01_00-00-00.000000";
  fs::create_directories(crashed);
  std::ofstream(crashed + "/model.safetensors") << "half";
  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->path, a.path);
  EXPECT_THAT(errors_, IsEmpty());  // a crash mid-commit is not corruption
  EXPECT_THAT(warnings_, ::testing::Contains(HasSubstr(crashed)));
  Save(*m, 1, 1.0);
  EXPECT_FALSE(fs::exists(crashed));
  EXPECT_TRUE(fs::exists(a.path));
}

TEST_F(CheckpointIntegrityTest, EmptyRunDirIsAFreshStart) {
  auto m = Open();
  auto latest = m->LatestVerified();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
}

TEST(VerifyCheckpointFilesTest, OnlyChecksTheNamedFiles) {
  internal::TestTempDir tmp;
  std::ofstream(tmp.path() + "/a") << "aaaa";
  std::ofstream(tmp.path() + "/b") << "bbbb";
  CheckpointMetadata meta;
  meta.files = {{"a", 4, Crc32("aaaa")}, {"b", 4, Crc32("XXXX")}};
  EXPECT_TRUE(VerifyCheckpointFiles(tmp.path(), meta, VerifyMode::kSizes).ok());
  EXPECT_FALSE(VerifyCheckpointFiles(tmp.path(), meta, VerifyMode::kChecksums).ok());
  const std::vector<std::string> only_a = {"a"};
  EXPECT_TRUE(VerifyCheckpointFiles(tmp.path(), meta, VerifyMode::kChecksums, only_a).ok());
  const std::vector<std::string> unlisted = {"c"};
  absl::Status s = VerifyCheckpointFiles(tmp.path(), meta, VerifyMode::kChecksums, unlisted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not listed"));
}

}  // namespace
}  // namespace tpudist::train
