// Multi-host for real: three network namespaces (tools/netns_hosts.sh), one
// tcp_netns_worker process per namespace binding its own address, rendezvous
// through a c10d::FileStore in a shared temp dir, ring all-reduce and
// all-gather checked inside each worker. Skipped unless root with `ip netns`.

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef TCP_TEST_SOURCE_DIR
#error "TCP_TEST_SOURCE_DIR must be defined by the build"
#endif
#ifndef TCP_NETNS_WORKER
#error "TCP_NETNS_WORKER must be defined by the build"
#endif

namespace tpudist::collectives::tcp {
namespace {

// Runs `cmd` through the shell; returns its exit code and appends its output.
int Shell(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) output->append(buf);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TcpNetnsTest, RingAcrossThreeNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  std::string probe;
  if (Shell("ip netns list", &probe) != 0) GTEST_SKIP() << "`ip netns` unavailable: " << probe;
  const std::string script = std::string(TCP_TEST_SOURCE_DIR) + "/tools/netns_hosts.sh";
  char tmpl[] = "/tmp/tcp_netns_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string suffix = absl::StrCat("t", getpid());
  // `run` sets up, runs one worker per namespace, and tears down via trap even
  // when a worker fails; the outer timeout bounds the whole thing.
  std::string out;
  const int rc = Shell(
      absl::StrCat("TPU_DIST_JOB_SECRET=", std::string(64, 'c'),
                   " TDH_TIMEOUT=60 timeout --kill-after=5 120 ", script, " run 3 ", suffix, " -- ",
                   TCP_NETNS_WORKER, " --store=", dir, "/store --group=netns --count=262147"),
      &out);
  std::string leftover;
  Shell(absl::StrCat(script, " down ", suffix, "; ip netns list | grep _", suffix, " || true"),
        &leftover);
  std::filesystem::remove_all(dir);
  std::printf("%s", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  for (int host = 0; host < 3; ++host) {
    EXPECT_THAT(out, ::testing::HasSubstr(
                         absl::StrCat("host ", host, " OK addr 10.250.0.", host + 1, " auth on")));
  }
  EXPECT_EQ(leftover, "") << "namespaces left behind";
}

}  // namespace
}  // namespace tpudist::collectives::tcp
