#include "io/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/files.h"
#include "testing/temp_dir.h"

namespace tpudist::io {
namespace {

bool Contains(const absl::Status& st, const std::string& needle) {
  return std::string(st.message()).find(needle) != std::string::npos;
}

TEST(AtomicFile, WritesAndReplaces) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "a.json";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  EXPECT_EQ(test_support::ReadFile(path), "first");
  ASSERT_TRUE(WriteFileAtomically(path, "second, longer").ok());
  EXPECT_EQ(test_support::ReadFile(path), "second, longer");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(test_support::ReadFile(path), "");
  EXPECT_EQ(test_support::CountEntries(dir.path()), 1);  // no temp left behind
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0600, 0600);
}

TEST(AtomicFile, PiecesAreConcatenatedInOrder) {
  test_support::ScopedTempDir dir("io_test");
  const std::string big(1 << 20, 'x');  // more than one write(2) may take
  std::vector<absl::string_view> pieces = {"ab", "", big, "cd"};
  ASSERT_TRUE(WriteFileAtomically(dir / "p", pieces).ok());
  EXPECT_EQ(test_support::ReadFile(dir / "p"), "ab" + big + "cd");
}

TEST(AtomicFile, BareNameWritesInTheCurrentDirectory) {
  test_support::ScopedTempDir dir("io_test");
  char old_cwd[4096];
  ASSERT_NE(::getcwd(old_cwd, sizeof(old_cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  absl::Status st = WriteFileAtomically("bare.txt", "x");
  ASSERT_EQ(::chdir(old_cwd), 0);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(test_support::ReadFile(dir / "bare.txt"), "x");
}

TEST(AtomicFile, MissingDirectoryIsNotFoundNamingThePath) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "absent/a.json";
  absl::Status st = WriteFileAtomically(path, "x");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(Contains(st, path)) << st;
  EXPECT_TRUE(Contains(st, "No such file or directory")) << st;
  EXPECT_EQ(test_support::CountEntries(dir.path()), 0);
}

// rename(2) of a file over a directory fails (EISDIR): the error names the
// target, the directory stays, and the temp file is gone.
TEST(AtomicFile, TargetIsADirectoryLeavesNoTemp) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "target";
  ASSERT_TRUE(std::filesystem::create_directory(path));
  absl::Status st = WriteFileAtomically(path, "x");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st, path)) << st;
  EXPECT_TRUE(Contains(st, "Is a directory")) << st;
  EXPECT_TRUE(std::filesystem::is_directory(path));
  EXPECT_FALSE(std::filesystem::exists(AtomicTempPath(path)));
  EXPECT_EQ(test_support::CountEntries(dir.path()), 1);
}

// A full disk (the temp name is a symlink to /dev/full, whose writes fail with
// ENOSPC): ResourceExhausted with strerror, the temp file's name, the target
// untouched, the temp (here the symlink) removed.
TEST(AtomicFile, DiskFullKeepsTheOldFile) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "m.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_EQ(::symlink("/dev/full", AtomicTempPath(path).c_str()), 0);
  absl::Status st = WriteFileAtomically(path, std::string(8192, 'n'));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_TRUE(Contains(st, "No space left on device")) << st;
  EXPECT_TRUE(Contains(st, AtomicTempPath(path))) << st;
  EXPECT_EQ(test_support::ReadFile(path), "old");
  EXPECT_EQ(test_support::CountEntries(dir.path()), 1);
}

// A directory that cannot be written: PermissionDenied naming the path
// (skipped as root, who may write anywhere).
TEST(AtomicFile, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  test_support::ScopedTempDir dir("io_test");
  const std::string ro = dir / "ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
  absl::Status st = WriteFileAtomically(ro + "/a", "x");
  ::chmod(ro.c_str(), 0700);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_TRUE(Contains(st, ro + "/a")) << st;
}

}  // namespace
}  // namespace tpudist::io
