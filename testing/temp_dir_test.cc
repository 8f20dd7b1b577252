#include "testing/temp_dir.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tpudist::test_support {
namespace {

namespace fs = std::filesystem;

// Runs `child` in a forked process that ends with std::exit(0) (exit
// handlers run); returns its exit status.
template <typename Fn>
int InForkedChild(Fn child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    child();
    std::exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(ScopedTempDirTest, RemovedWithItsContents) {
  std::string path;
  {
    ScopedTempDir dir("temp_dir_test");
    path = dir.path();
    ASSERT_FALSE(path.empty());
    EXPECT_NE(path.find("/temp_dir_test_"), std::string::npos);
    fs::create_directories(dir / "a/b");
    std::ofstream(dir / "a/b/file") << "x";
    EXPECT_TRUE(fs::exists(dir / "a/b/file"));
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(ScopedTempDirTest, HonoursTmpdir) {
  ScopedTempDir base("temp_dir_base");
  ASSERT_FALSE(base.path().empty());
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("TMPDIR", base.path().c_str(), 1);
  {
    ScopedTempDir inner("inner");
    EXPECT_EQ(fs::path(inner.path()).parent_path(), fs::path(base.path()));
  }
  if (old != nullptr) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
}

TEST(ScopedTempDirTest, AForkedCopyDoesNotRemoveIt) {
  ScopedTempDir dir("temp_dir_fork");
  ASSERT_FALSE(dir.path().empty());
  // The child destroys its own copy of a ScopedTempDir made by the parent.
  const int status = InForkedChild([&] {
    auto* copy = new ScopedTempDir("temp_dir_child");
    const std::string child_path = copy->path();
    delete copy;  // the child's own directory goes
    if (fs::exists(child_path)) std::_Exit(3);
    const std::string parent_path = dir.path();
    dir.~ScopedTempDir();  // the parent's must stay (pid check)
    std::_Exit(fs::exists(parent_path) ? 0 : 4);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::exists(dir.path()));
}

TEST(ProcessTempDirTest, RemovedWhenTheCreatingProcessExits) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int status = InForkedChild([&] {
    const std::string path = ProcessTempDir("temp_dir_proc");
    std::ofstream(path + "/f") << "x";
    (void)!::write(fds[1], path.data(), path.size());
  });
  ::close(fds[1]);
  char buf[512] = {};
  const ssize_t n = ::read(fds[0], buf, sizeof(buf) - 1);
  ::close(fds[0]);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_GT(n, 0);
  const std::string path(buf, static_cast<size_t>(n));
  EXPECT_NE(path.find("/temp_dir_proc_"), std::string::npos);
  EXPECT_FALSE(fs::exists(path)) << path << " outlived the process that made it";
}

TEST(ProcessTempDirTest, AChildExitingLeavesTheParentsDirectory) {
  // Runs in a child so that this test binary's own exit stays clean; the
  // grandchild exits normally while its parent's directory is in use.
  const int status = InForkedChild([] {
    const std::string path = ProcessTempDir("temp_dir_parent");
    if (path.empty()) std::_Exit(5);
    const pid_t pid = ::fork();
    if (pid == 0) std::exit(0);  // runs the inherited exit handler
    int grandchild = 0;
    ::waitpid(pid, &grandchild, 0);
    if (!fs::exists(path)) std::_Exit(6);
    // ... and this process's own exit removes it (checked by the test above).
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace tpudist::test_support
