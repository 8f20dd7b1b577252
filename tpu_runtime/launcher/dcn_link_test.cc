// DcnLinkTest: flag parsing and the commands of the shaped DCN (pure).
// DcnNetnsTest (label netns, needs root and `ip netns`): tpurun --dcn-rate /
// --dcn-delay really shapes the link between emulated slices, leaves a link
// inside a slice alone, counts the DCN bytes, and removes its namespaces.
#include "tpu_runtime/launcher/dcn_link.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

using ::testing::HasSubstr;

TEST(DcnLinkTest, ParsesRateAndDelay) {
  absl::StatusOr<DcnShape> off = ParseDcnShape("", absl::ZeroDuration());
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  absl::StatusOr<DcnShape> on = ParseDcnShape("2.5GBit", absl::Microseconds(100));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->rate, "2.5gbit");
  EXPECT_EQ(on->delay, absl::Microseconds(100));
  for (const char* bad : {"10", "10gb", "gbit", "0mbit", "-1mbit", "1 gbit", "1.2.3gbit"}) {
    absl::StatusOr<DcnShape> s = ParseDcnShape(bad, absl::ZeroDuration());
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("--dcn-rate=\"", bad, "\"")));
  }
  absl::StatusOr<DcnShape> neg = ParseDcnShape("", absl::Microseconds(-5));
  ASSERT_FALSE(neg.ok());
  EXPECT_THAT(neg.status().message(), HasSubstr("--dcn-delay=-5us"));
  EXPECT_FALSE(ParseDcnShape("", absl::Seconds(11)).ok());
}

TEST(DcnLinkTest, NeedsEmulatedSlices) {
  DcnShape shape{"1gbit", absl::ZeroDuration()};
  EXPECT_TRUE(CheckDcnShapeUsable(shape, 2, true, false).ok());
  EXPECT_TRUE(CheckDcnShapeUsable(DcnShape{}, 1, false, true).ok());  // off: anything goes
  absl::Status one = CheckDcnShapeUsable(shape, 1, true, false);
  EXPECT_THAT(one.message(), HasSubstr("--dcn-rate=1gbit"));
  EXPECT_THAT(one.message(), HasSubstr("--num-slices=1"));
  EXPECT_THAT(CheckDcnShapeUsable(shape, 2, false, false).message(),
              HasSubstr("no --hosts-emulated"));
  EXPECT_THAT(CheckDcnShapeUsable(DcnShape{"", absl::Microseconds(50)}, 2, true, true).message(),
              HasSubstr("--dcn-delay=50us: the shaped slices have their own addresses"));
}

TEST(DcnLinkTest, SetupCommands) {
  EXPECT_EQ(DcnHostAddress(1, 0), "10.251.1.1");
  const DcnShape both{"10gbit", absl::Microseconds(100)};
  std::vector<std::string> lines;
  for (const auto& argv : DcnSetupCommands(42, 2, 2, both)) lines.push_back(absl::StrJoin(argv, " "));
  EXPECT_THAT(lines, testing::Contains("ip netns add tpudcn42b"));
  EXPECT_THAT(lines, testing::Contains("ip netns add tpudcn42s1"));
  EXPECT_THAT(lines, testing::Contains(
                         "ip -n tpudcn42b link add s1 type veth peer name eth0 netns tpudcn42s1"));
  EXPECT_THAT(lines, testing::Contains("ip -n tpudcn42s1 addr add 10.251.1.2/16 dev eth0"));
  EXPECT_THAT(lines, testing::Contains("tc -n tpudcn42s0 class add dev eth0 parent 1: classid 1:1 "
                                       "htb rate 10gbit ceil 10gbit"));
  EXPECT_THAT(lines, testing::Contains("tc -n tpudcn42s0 qdisc add dev eth0 parent 1:1 handle 10: "
                                       "netem delay 100us limit 100000"));
  std::vector<std::string> delay_only;
  for (const auto& argv : DcnSetupCommands(7, 2, 1, DcnShape{"", absl::Milliseconds(1)})) {
    delay_only.push_back(absl::StrJoin(argv, " "));
  }
  EXPECT_THAT(delay_only, testing::Contains("tc -n tpudcn7s1 qdisc add dev eth0 root handle 10: "
                                            "netem delay 1000us limit 100000"));
  for (const std::string& l : delay_only) EXPECT_THAT(l, testing::Not(HasSubstr("htb")));
}

// ---- End to end, in network namespaces -------------------------------------

std::string BuildDir() {
  if (const char* dir = getenv("TPU_DIST_BUILD_DIR")) return dir;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? n : 0);
  for (int up = 0; up < 3; ++up) path = path.substr(0, path.rfind('/'));
  return path;
}

std::string ReadFile(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  char buf[4096];
  for (ssize_t n; fd >= 0 && (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  if (fd >= 0) close(fd);
  return out;
}

// Namespaces whose name starts with `prefix`.
std::vector<std::string> Namespaces(const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* dir = opendir("/var/run/netns")) {
    while (dirent* e = readdir(dir)) {
      if (absl::StartsWith(e->d_name, prefix)) out.push_back(e->d_name);
    }
    closedir(dir);
  }
  return out;
}

struct TpurunResult {
  int exit_code = -1;
  int pid = 0;
  std::string out, err;
};

// tpurun with `args`, SIGKILLed after 60 s.
TpurunResult Tpurun(const std::vector<std::string>& args) {
  TpurunResult run;
  char dir_template[] = "/tmp/dcn_link_test_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string out = dir + "/out", err = dir + "/err";
  std::vector<std::string> argv = {BuildDir() + "/tpu_runtime/launcher/tpurun"};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  run.pid = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  run.out = ReadFile(out);
  run.err = ReadFile(err);
  unlink(out.c_str());
  unlink(err.c_str());
  rmdir(dir.c_str());
  return run;
}

// Each rank: rank 0 (slice 0) serves on its host address and times `kBytes`
// (or, with ROUNDS > 0, ROUNDS 1-byte round trips) to itself (inside its
// slice); rank 1 (slice 1) times the same to rank 0 (across the DCN).
constexpr char kRankScript[] = R"PY(
import os, socket, threading, time
rank = int(os.environ["RANK"]); nbytes = int(os.environ["DCN_TEST_BYTES"])
rounds = int(os.environ["DCN_TEST_ROUNDS"]); port = 29731
server = os.environ["MEGASCALE_COORDINATOR_ADDRESS"]
def serve(srv):
    for _ in range(2):
        c, _ = srv.accept()
        while True:
            b = c.recv(1 << 16)
            if not b: break
            if rounds: c.sendall(b"k")
        if not rounds: c.sendall(b"k")
        c.close()
def timed(addr):
    for _ in range(400):
        try:
            s = socket.create_connection((addr, port), timeout=20); break
        except OSError: time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    if rounds:
        for _ in range(rounds): s.sendall(b"x"); s.recv(1)
        s.shutdown(socket.SHUT_WR)
        return (time.monotonic() - t0) / rounds
    s.sendall(b"x" * nbytes); s.shutdown(socket.SHUT_WR); s.recv(1)
    return time.monotonic() - t0
if rank == 0:
    srv = socket.create_server((server, port)); th = threading.Thread(target=serve, args=(srv,)); th.start()
    print("intra %.6f" % timed(server), flush=True); th.join()
else:
    time.sleep(0.5)
    print("cross %.6f" % timed(server), flush=True)
)PY";

class DcnNetnsTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
    if (system("ip netns list >/dev/null 2>&1") != 0) GTEST_SKIP() << "no `ip netns` here";
    if (system("python3 -c 'import socket' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  }

  TpurunResult Shaped(const std::vector<std::string>& shape, int64_t bytes, int rounds) {
    std::vector<std::string> args = {"--accelerator-type", "v6e",   "--topology", "1x1",
                                     "--hosts-emulated",   "--num-slices", "2", "--timeout", "50s"};
    args.insert(args.end(), shape.begin(), shape.end());
    for (const char* a : {"--", "env"}) args.push_back(a);
    args.push_back(absl::StrCat("DCN_TEST_BYTES=", bytes));
    args.push_back(absl::StrCat("DCN_TEST_ROUNDS=", rounds));
    for (const char* a : {"python3", "-c"}) args.push_back(a);
    args.push_back(kRankScript);
    TpurunResult run = Tpurun(args);
    EXPECT_THAT(Namespaces(absl::StrCat("tpudcn", run.pid)), testing::IsEmpty())
        << "tpurun left its namespaces behind";
    return run;
  }

  static double Seconds(const std::string& out, const std::string& what) {
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      const size_t at = line.find(what + " ");
      double v = 0;
      if (at != absl::string_view::npos && absl::SimpleAtod(line.substr(at + what.size() + 1), &v)) {
        return v;
      }
    }
    ADD_FAILURE() << "no '" << what << "' line in:\n" << out;
    return -1;
  }
};

TEST_F(DcnNetnsTest, RateShapesOnlyTheLinkBetweenSlices) {
  constexpr int64_t kBytes = 1 << 20;
  TpurunResult run = Shaped({"--dcn-rate", "40mbit"}, kBytes, 0);
  ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
  EXPECT_THAT(run.err, HasSubstr("shaped DCN: 2 slices, 40mbit"));
  const double floor = kBytes * 8.0 / 40e6;  // seconds at the shaped rate
  const double cross = Seconds(run.out, "cross"), intra = Seconds(run.out, "intra");
  EXPECT_GE(cross, 0.9 * floor) << run.out;
  EXPECT_LT(intra, cross / 4) << run.out;
  // The kernel's count of what slice 1 sent into the DCN: the payload and headers.
  const size_t at = run.err.find("tpurun: dcn: slice 1 sent ");
  ASSERT_NE(at, std::string::npos) << run.err;
  int64_t sent = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      run.err.substr(at + 26, run.err.find(' ', at + 26) - at - 26), &sent)) << run.err;
  EXPECT_GE(sent, kBytes);
  EXPECT_LT(sent, kBytes * 11 / 10);
  std::cout << "cross " << cross << " s (floor " << floor << " s), intra " << intra
            << " s, slice 1 DCN bytes " << sent << "\n";
}

TEST_F(DcnNetnsTest, DelayShapesRoundTripsOrNamesTheMissingNetem) {
  constexpr int kRounds = 20;
  TpurunResult run = Shaped({"--dcn-delay", "5ms"}, 0, kRounds);
  if (run.exit_code != 0 && absl::StrContains(run.err, "netem")) {
    // This kernel cannot delay: the error names the flag, its value and tc's words.
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_THAT(run.err, HasSubstr("tpurun: --dcn-delay=5ms: building the shaped DCN failed"));
    EXPECT_THAT(run.err, HasSubstr("netem"));
    GTEST_SKIP() << "no netem qdisc in this kernel: " << run.err;
  }
  ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
  const double cross = Seconds(run.out, "cross"), intra = Seconds(run.out, "intra");
  EXPECT_GE(cross, 2 * 0.005) << run.out;  // each direction's egress delays 5 ms
  EXPECT_LT(intra, 0.005) << run.out;
}

TEST_F(DcnNetnsTest, RefusesShapingWithoutSlices) {
  TpurunResult run = Tpurun({"--accelerator-type", "v6e", "--topology", "1x1", "--hosts-emulated",
                    "--dcn-rate", "1gbit", "--", "true"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("tpurun: --dcn-rate=1gbit: shapes the link between emulated "
                                 "slices; needs --hosts-emulated and --num-slices >= 2"));
  TpurunResult bad = Tpurun({"--accelerator-type", "v6e", "--topology", "1x1", "--hosts-emulated",
                    "--num-slices", "2", "--dcn-rate", "fast", "--", "true"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("tpurun: --dcn-rate=\"fast\": expected a positive number"));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
