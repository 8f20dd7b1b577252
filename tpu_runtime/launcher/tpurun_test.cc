// End-to-end tests of the built `tpurun` binary (and of examples/slice_check
// under it, when that is built). Every run has a deadline: a hung tpurun is
// SIGKILLed and the test fails.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/launcher/free_port.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string BuildDir() {
  if (const char* dir = getenv("TPU_DIST_BUILD_DIR")) return dir;
  // Not under ctest: this binary lives in <build>/tpu_runtime/launcher/.
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? n : 0);
  for (int up = 0; up < 3; ++up) path = path.substr(0, path.rfind('/'));
  return path;
}

std::string TpurunPath() { return BuildDir() + "/tpu_runtime/launcher/tpurun"; }
std::string SliceCheckPath() { return BuildDir() + "/examples/slice_check"; }

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (off_t off = 0;;) {
    ssize_t n = pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    out.append(buf, n);
    off += n;
  }
  return out;
}

struct RunResult {
  int exit_code = -1;  // shell convention; -1 when it had to be killed
  std::string out, err;
  absl::Duration elapsed;
};

// A started tpurun whose stdout/stderr go to in-memory files.
class Process {
 public:
  Process(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    out_ = memfd_create("tpurun_out", MFD_CLOEXEC);
    err_ = memfd_create("tpurun_err", MFD_CLOEXEC);
    std::vector<std::string> argv = {TpurunPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> argp;
    for (std::string& a : argv) argp.push_back(a.data());
    argp.push_back(nullptr);
    std::vector<std::string> env_copy = env;
    start_ = absl::Now();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out_, STDOUT_FILENO);
      dup2(err_, STDERR_FILENO);
      for (std::string& e : env_copy) putenv(e.data());
      execv(argp[0], argp.data());
      _exit(126);
    }
  }
  ~Process() {
    close(out_);
    close(err_);
  }
  pid_t pid() const { return pid_; }

  RunResult Wait(absl::Duration timeout) {
    RunResult run;
    absl::Time give_up = start_ + timeout;
    int status = 0;
    while (true) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (absl::Now() >= give_up) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        ADD_FAILURE() << "tpurun did not finish within " << timeout;
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    run.elapsed = absl::Now() - start_;
    run.out = ReadAll(out_);
    run.err = ReadAll(err_);
    return run;
  }

 private:
  int out_, err_;
  pid_t pid_;
  absl::Time start_;
};

RunResult Tpurun(const std::vector<std::string>& args, absl::Duration timeout = absl::Seconds(60),
                 const std::vector<std::string>& env = {}) {
  Process p(args, env);
  return p.Wait(timeout);
}

std::vector<std::string> Lines(const std::string& s) {
  return absl::StrSplit(s, '\n', absl::SkipEmpty());
}

TEST(TpurunTest, EmulatedV6e4x4Gives16RanksWithTheirHostsEnvironment) {
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "4x4", "--hosts-emulated",
                          "--job-id", "e2e", "--", "sh", "-c",
                          "echo $RANK $TPU_WORKER_ID $LOCAL_RANK $WORLD_SIZE $TPU_DIST_HOST_ID "
                          "$TPU_DIST_JOB_ID $TORCHELASTIC_RESTART_COUNT"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("tpurun: v6e 4x4, 16 devices on 4 hosts x 4 (emulated), job e2e"));
  EXPECT_THAT(run.err, HasSubstr("tpurun: all 16 ranks succeeded"));
  std::vector<std::string> lines = Lines(run.out);
  EXPECT_EQ(lines.size(), 16u) << run.out;
  for (int r = 0; r < 16; ++r) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrFormat("[rank %2d] %d %d %d 16 127.0.1.%d e2e 0\n", r,
                                                   r, r / 4, r % 4, r / 4 + 1)));
  }
}

TEST(TpurunTest, EmulatedTpu7x2x2x2Gives16RanksOnTwoHostsOfEight) {
  RunResult run = Tpurun({"--accelerator-type=tpu7x", "--topology=2x2x2", "--hosts-emulated", "--",
                          "sh", "-c", "echo $RANK $TPU_WORKER_ID $LOCAL_RANK $LOCAL_WORLD_SIZE"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("tpu7x 2x2x2, 16 devices on 2 hosts x 8 (emulated)"));
  EXPECT_EQ(Lines(run.out).size(), 16u) << run.out;
  for (int r = 0; r < 16; ++r) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrFormat("[rank %2d] %d %d %d 8\n", r, r, r / 8, r % 8)));
  }
}

// --num-slices 2 of a v4 2x2x2 (2 hosts x 4): 16 ranks, slice-major, each
// slice its own hosts, the MEGASCALE_* variables of the KubeRay webhook.
TEST(TpurunTest, TwoEmulatedSlicesGiveEveryRankItsSlicesVariables) {
  RunResult run = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2", "--hosts-emulated",
                          "--num-slices", "2", "--job-id", "ms", "--", "sh", "-c",
                          "echo $RANK $WORLD_SIZE $TPU_WORKER_ID $LOCAL_RANK $TPU_WORKER_HOSTNAMES "
                          "$TPU_DIST_HOST_ID $MEGASCALE_NUM_SLICES $MEGASCALE_SLICE_ID "
                          "$MEGASCALE_COORDINATOR_ADDRESS $MEGASCALE_PORT $MASTER_ADDR"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err,
              HasSubstr("tpurun: v4 2x2x2 x 2 slices, 16 devices on 4 hosts x 4 (emulated), job ms"));
  EXPECT_EQ(Lines(run.out).size(), 16u) << run.out;
  for (int r = 0; r < 16; ++r) {
    const int slice = r / 8, host = (r % 8) / 4;
    EXPECT_THAT(run.out, HasSubstr(absl::StrFormat(
                             "[rank %2d] %d 16 %d %d 127.0.%d.1,127.0.%d.2 127.0.%d.%d 2 %d "
                             "127.0.1.1 8081 127.0.1.1\n",
                             r, r, host, r % 4, slice + 1, slice + 1, slice + 1, host + 1, slice)));
  }
  // Bad slice counts: one line naming the flag, exit 2.
  for (const char* bad : {"0", "-1", "255"}) {
    RunResult refused = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2",
                                "--hosts-emulated", "--num-slices", bad, "--", "true"});
    EXPECT_EQ(refused.exit_code, 2) << bad;
    EXPECT_THAT(refused.err, HasSubstr(absl::StrCat("tpurun: --num-slices=", bad, ": expected 1..254\n")));
  }
  RunResult plain = Tpurun({"--nproc", "2", "--num-slices", "2", "--", "true"});
  EXPECT_EQ(plain.exit_code, 2);
  EXPECT_THAT(plain.err, HasSubstr("--num-slices=2 needs slice mode"));
  RunResult real = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2", "--num-slices", "2",
                           "--", "true"});
  EXPECT_EQ(real.exit_code, 2);
  EXPECT_THAT(real.err, HasSubstr("--num-slices=2 without --hosts-emulated"));
}

const std::string kGivenSecret = "TPU_DIST_JOB_SECRET=" + std::string(64, 'A');

TEST(TpurunTest, WithoutEmulationStartsOnlyThisHostsRanks) {
  RunResult by_flag = Tpurun({"--accelerator-type", "v6e", "--topology", "4x4", "--host-index", "1",
                              "--", "sh", "-c", "echo $RANK $TPU_WORKER_ID"},
                             absl::Seconds(60), {kGivenSecret});
  EXPECT_EQ(by_flag.exit_code, 0) << by_flag.err;
  EXPECT_THAT(by_flag.err, HasSubstr("(host 1 of 4)"));
  EXPECT_EQ(Lines(by_flag.out).size(), 4u) << by_flag.out;
  for (int r = 4; r < 8; ++r) {
    EXPECT_THAT(by_flag.out, HasSubstr(absl::StrFormat("[rank %2d] %d 1\n", r, r)));
  }
  RunResult by_env = Tpurun({"--accelerator-type", "v6e", "--topology", "4x4", "--", "sh", "-c",
                             "echo $RANK $TPU_WORKER_ID $MASTER_PORT"},
                            absl::Seconds(60), {"TPU_WORKER_ID=3", kGivenSecret});
  EXPECT_EQ(by_env.exit_code, 0) << by_env.err;
  EXPECT_THAT(by_env.out, HasSubstr("[rank 15] 15 3 29500\n"));  // multi-host: fixed port
  EXPECT_EQ(Lines(by_env.out).size(), 4u) << by_env.out;
}

// Every rank of a job gets the same secret: generated per job when none is
// given, the given one (hex, normalised) otherwise, a given file as a file.
TEST(TpurunTest, JobSecretIsHandedToEveryRank) {
  const std::vector<std::string> echo = {
      "--nproc", "2", "--", "sh", "-c",
      "echo \"[$TPU_DIST_JOB_SECRET] [$TPU_DIST_JOB_SECRET_FILE]\""};
  RunResult a = Tpurun(echo);
  RunResult b = Tpurun(echo);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_THAT(a.err, HasSubstr("tpurun: job secret: generated for this job"));
  std::vector<std::string> lines = Lines(a.out);
  ASSERT_EQ(lines.size(), 2u) << a.out;
  const std::string secret = lines[0].substr(lines[0].find('[', 2) + 1, 64);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
  EXPECT_THAT(a.out, HasSubstr(absl::StrCat("[rank 0] [", secret, "] []")));
  EXPECT_THAT(a.out, HasSubstr(absl::StrCat("[rank 1] [", secret, "] []")));
  EXPECT_THAT(b.out, Not(HasSubstr(secret)));  // a fresh one per job

  RunResult given = Tpurun(echo, absl::Seconds(60), {kGivenSecret});
  ASSERT_EQ(given.exit_code, 0) << given.err;
  EXPECT_THAT(given.out, HasSubstr(absl::StrCat("[rank 1] [", std::string(64, 'a'), "] []")));

  char path[] = "/tmp/tpurun_secret_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "0123456789abcdef0123456789abcdef\n", 33), 33);
  close(fd);
  RunResult file =
      Tpurun(echo, absl::Seconds(60), {std::string("TPU_DIST_JOB_SECRET_FILE=") + path});
  RunResult bad = Tpurun(echo, absl::Seconds(60), {"TPU_DIST_JOB_SECRET=hunter2"});
  unlink(path);
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_THAT(file.out, HasSubstr(absl::StrCat("[rank 0] [] [", path, "]")));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("TPU_DIST_JOB_SECRET is 7 bytes"));
  EXPECT_THAT(bad.err, Not(HasSubstr("hunter2")));
}

// One tpurun per real host cannot generate the secret its hosts must share.
TEST(TpurunTest, MultiHostNeedsAGivenJobSecret) {
  const std::vector<std::string> args = {"--accelerator-type", "v6e", "--topology", "4x4",
                                         "--host-index", "1", "--", "true"};
  RunResult refused = Tpurun(args);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("host 1 of a 4-host job: every host's tpurun must give its "
                                     "ranks the same job secret"));
  std::vector<std::string> insecure = args;
  insecure.insert(insecure.begin(), "--allow-unauthenticated");
  RunResult allowed = Tpurun(insecure);
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_THAT(allowed.err, HasSubstr("job secret: none (--allow-unauthenticated"));
}

TEST(TpurunTest, FailingRankIsNamedAndExitStatusPropagates) {
  RunResult run = Tpurun(
      {"--nproc", "3", "--", "sh", "-c", "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 30"});
  EXPECT_EQ(run.exit_code, 3) << run.err;
  EXPECT_THAT(run.err, HasSubstr("tpurun: rank 1 (host 0, local 1) failed: exit status 3"));
  EXPECT_LT(run.elapsed, absl::Seconds(5));
}

TEST(TpurunTest, RankKillingItselfIsNamedBySignal) {
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "4x4", "--hosts-emulated",
                          "--", "sh", "-c", "if [ $RANK = 5 ]; then kill -KILL $$; fi; sleep 30"});
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.err;
  EXPECT_THAT(run.err,
              HasSubstr("tpurun: rank 5 (host 1, local 1) failed: killed by signal SIGKILL"));
  EXPECT_LT(run.elapsed, absl::Seconds(8));
}

TEST(TpurunTest, RestartKeepsJobIdAndCountsRestarts) {
  char dir_template[] = "/tmp/tpurun_restart_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  // Each rank prints, then waits (at most 20 s) until both ranks of this
  // attempt have printed before failing in attempt 0: otherwise the first
  // rank to fail got the other one stopped before its echo (a flake under
  // load: rank 0's attempt-0 line missing).
  const std::string script = absl::StrCat(
      "echo $TPU_DIST_JOB_ID $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS; c=",
      dir, "/$TORCHELASTIC_RESTART_COUNT; touch $c.r$RANK; i=0; "
      "while { [ ! -e $c.r0 ] || [ ! -e $c.r1 ]; } && [ $i -lt 2000 ]; do sleep 0.01; "
      "i=$((i+1)); done; [ $TORCHELASTIC_RESTART_COUNT = 1 ]");
  const char* kScript = script.c_str();
  RunResult ok = Tpurun(
      {"--nproc", "2", "--max-restarts", "1", "--job-id", "keep", "--", "sh", "-c", kScript});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("[rank 0] keep 0 1\n"));
  EXPECT_THAT(ok.out, HasSubstr("[rank 0] keep 1 1\n"));
  EXPECT_THAT(ok.err, HasSubstr("after 1 restart"));
  RunResult fails = Tpurun({"--nproc", "2", "--", "sh", "-c", kScript});
  EXPECT_EQ(fails.exit_code, 1) << fails.err;
  EXPECT_THAT(fails.err, HasSubstr("failed: exit status 1"));
  for (const char* f : {"/0.r0", "/0.r1", "/1.r0", "/1.r1"}) unlink((dir + f).c_str());
  rmdir(dir.c_str());
}

TEST(TpurunTest, SigtermToTpurunIsForwardedToRanks) {
  char dir_template[] = "/tmp/tpurun_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  Process p(
      {"--nproc", "2", "--", "sh", "-c",
       absl::StrCat("trap 'echo got-term; exit 7' TERM; touch ", dir, "/r$RANK; sleep 30 & wait")});
  absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up &&
         (access((dir + "/r0").c_str(), F_OK) != 0 || access((dir + "/r1").c_str(), F_OK) != 0)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(p.pid(), SIGTERM);
  RunResult run = p.Wait(absl::Seconds(30));
  EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[rank 0] got-term"));
  EXPECT_THAT(run.out, HasSubstr("[rank 1] got-term"));
  EXPECT_THAT(run.err, HasSubstr("interrupted by SIGTERM"));
  unlink((dir + "/r0").c_str());
  unlink((dir + "/r1").c_str());
  rmdir(dir.c_str());
}

TEST(TpurunTest, BadUsageExitsWithTwo) {
  EXPECT_EQ(Tpurun({"--nproc", "2"}).exit_code, 2);  // no command
  EXPECT_EQ(Tpurun({"--", "true"}).exit_code, 2);    // no mode
  RunResult bad_topo = Tpurun({"--accelerator-type", "v6e", "--topology", "4xq", "--", "true"});
  EXPECT_EQ(bad_topo.exit_code, 2);
  EXPECT_THAT(bad_topo.err, HasSubstr("4xq"));
  RunResult too_many = Tpurun({"--nproc", "100000", "--", "true"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_THAT(too_many.err, HasSubstr("nproc=100000; expected 1 <= nproc <= 4096"));
  RunResult missing = Tpurun({"--nproc", "1", "--", "/nonexistent/rank_binary"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/rank_binary"));
}

// Durations that expire at once (0s, -5s), never (inf where a bound is
// needed) or run backwards are refused with the flag and what is allowed.
TEST(TpurunTest, BadDurationsAreRefused) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--timeout", "0s"}, "tpurun: --timeout=0: expected a finite duration > 0 and at most "
                            "8760h, or inf for no limit"},
      {{"--timeout=-5s"}, "tpurun: --timeout=-5s: expected a finite duration > 0"},
      {{"--grace-period=-1s"}, "tpurun: --grace-period=-1s: expected a finite duration >= 0"},
      {{"--grace-period", "inf"}, "tpurun: --grace-period=inf: expected a finite duration >= 0"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.flags;
    for (const char* a : {"--nproc", "1", "--", "true"}) args.push_back(a);
    RunResult run = Tpurun(args);
    EXPECT_EQ(run.exit_code, 2) << c.flags[0] << ": " << run.err;
    EXPECT_THAT(run.err, HasSubstr(c.message));
    EXPECT_THAT(run.err, Not(HasSubstr("succeeded")));
  }
  // No limit on the whole job is what tpurun's --timeout defaults to.
  RunResult no_limit = Tpurun({"--timeout", "inf", "--grace-period", "0s", "--nproc", "1", "--",
                               "true"});
  EXPECT_EQ(no_limit.exit_code, 0) << no_limit.err;
}

// A secret file group or others can read is refused, as ssh refuses such a
// key (`openssl rand -hex 32 > job.key` makes a 0644 file under umask 022).
TEST(TpurunTest, SecretFileReadableByOthersIsRefused) {
  char path[] = "/tmp/tpurun_secret_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "0123456789abcdef0123456789abcdef\n", 33), 33);
  close(fd);
  const std::vector<std::string> args = {"--job-secret-file", path, "--nproc", "1", "--", "true"};
  ASSERT_EQ(chmod(path, 0644), 0);
  RunResult open_file = Tpurun(args);
  RunResult open_env = Tpurun({"--nproc", "1", "--", "true"}, absl::Seconds(60),
                              {std::string("TPU_DIST_JOB_SECRET_FILE=") + path});
  ASSERT_EQ(chmod(path, 0600), 0);
  RunResult private_file = Tpurun(args);
  unlink(path);
  EXPECT_EQ(open_file.exit_code, 2) << open_file.err;
  EXPECT_THAT(open_file.err, HasSubstr(absl::StrCat("tpurun: permissions 0644 for the file ", path,
                                                    " (--job-secret-file) are too open")));
  EXPECT_THAT(open_file.err, HasSubstr(absl::StrCat("run `chmod 600 ", path, "`")));
  EXPECT_EQ(open_env.exit_code, 2) << open_env.err;
  EXPECT_THAT(open_env.err, HasSubstr("(TPU_DIST_JOB_SECRET_FILE) are too open"));
  EXPECT_EQ(private_file.exit_code, 0) << private_file.err;
}

// One tpurun per host cannot restart the job alone (the other hosts' ranks
// have stopped, and the hosts do not agree on an attempt): refused up front.
TEST(TpurunTest, MaxRestartsIsRefusedWithOneTpurunPerHost) {
  RunResult run = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2", "--host-index", "0",
                          "--max-restarts", "1", "--", "true"},
                         absl::Seconds(60), {kGivenSecret});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("tpurun: --max-restarts=1 with one tpurun per host (host 0 of "
                                 "2): not supported yet"));
  RunResult negative = Tpurun({"--max-restarts", "-1", "--nproc", "1", "--", "true"});
  EXPECT_EQ(negative.exit_code, 2) << negative.err;
  EXPECT_THAT(negative.err, HasSubstr("--max-restarts=-1: expected a number >= 0"));
}

// One tpurun per host: this host's ranks all stop because a rank of another
// host failed (exit 75). That is a failure of the job, never "all ranks
// succeeded", and tpurun says where the root cause is.
TEST(TpurunTest, HostWhoseRanksOnlyFollowedAnotherHostsFailureFails) {
  RunResult run = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2", "--host-index", "0",
                          "--", "sh", "-c",
                          "echo \"rank $RANK stopping, another rank failed: task 5 lost its "
                          "connection\" >&2; exit 75"},
                         absl::Seconds(60), {kGivenSecret});
  EXPECT_EQ(run.exit_code, 75) << run.err;
  EXPECT_THAT(run.err, Not(HasSubstr("succeeded")));
  EXPECT_THAT(run.err, HasSubstr("tpurun: ranks 0, 1, 2, 3 stopped because another rank failed "
                                 "(exit 75); none of this tpurun's ranks failed for a reason of "
                                 "its own; the rank that failed is on another host (this tpurun "
                                 "runs host 0 of 2, ranks 0-3): see the tpurun of host 1 "
                                 "(127.0.1.2)"));
  EXPECT_THAT(run.err, HasSubstr("its last stderr line: rank "));
  EXPECT_THAT(run.err, HasSubstr(" stopping, another rank failed: task 5 lost its connection"));
}

// The supervisor's "all ranks stopped <d> after the first failure" line.
absl::Duration StopLatency(const std::string& err) {
  const std::string kBefore = "all ranks stopped ", kAfter = " after the first failure";
  size_t at = err.find(kBefore);
  if (at == std::string::npos) return absl::InfiniteDuration();
  at += kBefore.size();
  size_t end = err.find(kAfter, at);
  absl::Duration d = absl::InfiniteDuration();
  if (end == std::string::npos || !absl::ParseDuration(err.substr(at, end - at), &d)) {
    return absl::InfiniteDuration();
  }
  return d;
}

TEST(TpurunTest, StopLatencyIsReported) {
  RunResult run =
      Tpurun({"--nproc", "2", "--", "sh", "-c", "if [ $RANK = 0 ]; then exit 4; fi; sleep 30"});
  EXPECT_EQ(run.exit_code, 4) << run.err;
  EXPECT_LT(StopLatency(run.err), absl::Seconds(3)) << run.err;
}

// 16 ranks of examples/slice_check (discovery, coordination service, Gloo
// barrier + all_reduce) on an emulated v6e 4x4.
TEST(SliceCheckTest, EmulatedV6e4x4AllRanksAgree) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "4x4", "--hosts-emulated",
                          "--timeout", "150s", "--", SliceCheckPath(), "--timeout", "120s"},
                         absl::Seconds(170));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  std::vector<std::string> lines = Lines(run.out);
  int ok_lines = 0;
  for (const std::string& line : lines)
    ok_lines += line.find("allreduce 136 (expected 136) OK") != std::string::npos;
  EXPECT_EQ(ok_lines, 16) << run.out;
  for (int r = 0; r < 16; ++r) {
    EXPECT_THAT(run.out,
                HasSubstr(absl::StrFormat("[rank %2d] slice_check: rank %d/16 local %d/4 host %d/4",
                                          r, r, r % 4, r / 4)));
  }
  EXPECT_THAT(run.out, HasSubstr("@127.0.1.4"));  // host 3 binds its emulated address
  std::cerr << "slice_check v6e 4x4 (16 ranks) under tpurun: " << run.elapsed << "\n";
}

// examples/slice_check on 2 emulated v6e 2x2 slices (one host of 4 each):
// every rank discovers its slice, and the tpu_dist all_reduce over the world
// spans both slices (shm inside each, TCP between the slices' hosts).
TEST(SliceCheckTest, TwoEmulatedSlicesAllRanksAgree) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "2x2", "--hosts-emulated",
                          "--num-slices", "2", "--timeout", "150s", "--", SliceCheckPath(),
                          "--timeout", "120s"},
                         absl::Seconds(170));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  for (int r = 0; r < 8; ++r) {
    EXPECT_THAT(run.out,
                HasSubstr(absl::StrFormat(
                    "[rank %d] slice_check: rank %d/8 local %d/4 host %d/2 slice %d/2 (v6e 2x2, "
                    "kuberay-tpu) tpu_dist@127.0.%d.1 allreduce 36 (expected 36) OK",
                    r, r, r % 4, r / 4, r / 4, r / 4 + 1)));
  }
  std::cerr << "slice_check 2 x v6e 2x2 (8 ranks) under tpurun: " << run.elapsed << "\n";
}

// The same 2 slices: the world group and each group of equal in-slice
// position span both slices (slice_backend.h: reduce-scatter inside the
// slice, DCN between slices, all-gather inside), and their all_reduce /
// reduce_scatter / all_gather equal Gloo's, fp32 and bf16, sizes 1, 7, 1001,
// 65539 (none divisible by the 4 ranks of a slice).
// Found a real bug (2026-12-06): it hung in about one run of three because
// every Gloo group made over the job's store shared its rendezvous keys, so
// the cross-slice Gloo groups {1,5}, {2,6} connected to each other's ranks
// (collectives/generation_store.h; GenerationStoreTest).
TEST(SliceCheckTest, TwoEmulatedSlicesReductionsMatchGloo) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "2x2", "--hosts-emulated",
                          "--num-slices", "2", "--timeout", "150s", "--", SliceCheckPath(),
                          "--timeout", "120s", "--gloo-parity"},
                         absl::Seconds(170));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  for (int r = 0; r < 8; ++r) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrFormat(
                             "[rank %d] slice_check: rank %d gloo parity (world, position %d "
                             "across 2 slices): OK",
                             r, r, r % 4)));
  }
  std::cerr << "slice_check --gloo-parity 2 x v6e 2x2 (8 ranks) under tpurun: " << run.elapsed
            << "\n";
}

TEST(SliceCheckTest, RankKillingItselfStopsTheJobQuickly) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun(
      {"--accelerator-type", "TPU-V6E", "--topology", "4x4", "--hosts-emulated", "--grace-period",
       "3s", "--timeout", "150s", "--", SliceCheckPath(), "--die-rank", "5", "--timeout", "120s"},
      absl::Seconds(170));
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.out << run.err;
  EXPECT_THAT(run.err,
              HasSubstr("tpurun: rank 5 (host 1, local 1) failed: killed by signal SIGKILL"));
  EXPECT_THAT(run.out, Not(HasSubstr("OK\n")));  // nobody got past the barrier
  const absl::Duration latency = StopLatency(run.err);
  EXPECT_LT(latency, absl::Seconds(5)) << run.err;
  std::cerr << "die-rank 5: all ranks stopped " << latency << " after the failure (job "
            << run.elapsed << ")\n";
}

// A restart brings up a fresh coordination service (new MASTER_PORT, same job
// id) and the second attempt succeeds.
TEST(SliceCheckTest, RestartAfterARankDiedSucceeds) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--accelerator-type", "TPU-V6E", "--topology", "4x4",
                          "--hosts-emulated", "--max-restarts", "1", "--grace-period", "3s",
                          "--timeout", "200s", "--", SliceCheckPath(), "--die-rank", "5",
                          "--die-restart", "0", "--timeout", "90s"},
                         absl::Seconds(220));
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("rank 5 (host 1, local 1) failed: killed by signal SIGKILL"));
  EXPECT_THAT(run.err, HasSubstr("restarting all ranks (restart 1 of 1)"));
  EXPECT_THAT(run.err, HasSubstr("all 16 ranks succeeded"));
  int ok_lines = 0;
  for (const std::string& line : Lines(run.out)) {
    ok_lines += line.find("allreduce 136 (expected 136) OK") != std::string::npos;
  }
  EXPECT_EQ(ok_lines, 16) << run.out;
  std::cerr << "slice_check with one restart: " << run.elapsed << "\n";
}

// A hung rank (SIGSTOPped after the barrier, so the others sit in the
// all_reduce): the coordination service misses its heartbeats
// (--heartbeat-timeout 3s), every other rank's collective is aborted naming
// it, they exit 75, and tpurun names the rank still running. The collective
// timeout (120 s) plays no part.
TEST(SliceCheckTest, HungRankIsDetectedByTheHeartbeatAndNamed) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--accelerator-type", "v4", "--topology", "2x2x2", "--hosts-emulated",
                          "--grace-period", "1s", "--timeout", "100s", "--", SliceCheckPath(),
                          "--stop-rank", "5", "--heartbeat-timeout", "3s", "--timeout", "120s"},
                         absl::Seconds(110));
  EXPECT_EQ(run.exit_code, 75) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("task 5 of job"));
  EXPECT_THAT(run.err, HasSubstr("missed its heartbeat deadline"));
  EXPECT_THAT(run.err, HasSubstr("stopping, another rank failed"));
  EXPECT_THAT(run.err, HasSubstr("still running (hung?): ranks 5"));
  EXPECT_LT(run.elapsed, absl::Seconds(60)) << run.err;
  std::cerr << "hung rank 5 of 8 (heartbeat timeout 3s): job ended after " << run.elapsed << "\n";
}

// Rank 2 fails on its own: the others are told at once (exit 75) and tpurun
// reports rank 2, not whichever rank exited first.
TEST(SliceCheckTest, RootCauseIsTheRankThatFailedNotItsFollowers) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult run = Tpurun({"--nproc", "4", "--grace-period", "2s", "--timeout", "100s", "--",
                          SliceCheckPath(), "--fail-rank", "2", "--timeout", "120s"},
                         absl::Seconds(110));
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("tpurun: rank 2"));
  EXPECT_THAT(run.err, HasSubstr("failed: exit status 1"));
  EXPECT_THAT(run.err, HasSubstr("a failure of this rank's own"));
  EXPECT_THAT(run.err, Not(HasSubstr("tpurun: rank 0 failed")));
  EXPECT_LT(run.elapsed, absl::Seconds(30)) << run.err;
}

// A rank binary's --timeout inf used to become INT64_MAX ms and every
// collective "timed out after 9223372036854775807 ms" at once.
TEST(SliceCheckTest, RankTimeoutFlagsMustBeFiniteAndPositive) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  RunResult inf = Tpurun({"--nproc", "1", "--", SliceCheckPath(), "--timeout", "inf"});
  EXPECT_EQ(inf.exit_code, 2) << inf.out << inf.err;
  EXPECT_THAT(inf.err, HasSubstr("[rank 0] slice_check: usage error: --timeout=inf: expected a "
                                 "finite duration > 0 and at most 8760h"));
  RunResult zero = Tpurun({"--nproc", "1", "--", SliceCheckPath(), "--heartbeat-timeout", "0s"});
  EXPECT_EQ(zero.exit_code, 2) << zero.out << zero.err;
  EXPECT_THAT(zero.err, HasSubstr("usage error: --heartbeat-timeout=0: expected"));
}

// v4 2x2x2 as two tpuruns, one per emulated host (127.0.1.1, 127.0.1.2), as
// on two real hosts; rank 5 (host 1) is SIGKILLed after the rendezvous.
// Host 1's tpurun names rank 5 and its signal; host 0's ranks all exit 75
// (they were told by the coordination service) and host 0's tpurun, which
// once said "all 4 ranks succeeded" and exited 0, now fails with 75 and
// points at host 1's tpurun.
TEST(SliceCheckTest, MultiHostRankKilledOnHost1FailsBothHosts) {
  if (access(SliceCheckPath().c_str(), X_OK) != 0) {
    GTEST_SKIP() << SliceCheckPath() << " not built (configure with the examples folder)";
  }
  absl::StatusOr<int> port = PickFreePort("127.0.1.1");
  ASSERT_TRUE(port.ok()) << port.status();
  auto args = [&](int host) -> std::vector<std::string> {
    return {"--accelerator-type", "v4", "--topology", "2x2x2", "--host-index",
            absl::StrCat(host), "--master-port", absl::StrCat(*port), "--job-id",
            absl::StrCat("two-tpuruns-", *port), "--grace-period", "3s", "--timeout", "100s", "--",
            SliceCheckPath(), "--die-rank", "5", "--timeout", "60s"};
  };
  Process host0(args(0), {kGivenSecret});
  Process host1(args(1), {kGivenSecret});
  RunResult run1 = host1.Wait(absl::Seconds(110));
  RunResult run0 = host0.Wait(absl::Seconds(110));
  EXPECT_EQ(run1.exit_code, 128 + SIGKILL) << run1.out << run1.err;
  EXPECT_THAT(run1.err,
              HasSubstr("tpurun: rank 5 (host 1, local 1) failed: killed by signal SIGKILL"));
  EXPECT_EQ(run0.exit_code, 75) << run0.out << run0.err;
  EXPECT_THAT(run0.err, Not(HasSubstr("succeeded")));
  EXPECT_THAT(run0.err, HasSubstr("stopped because another rank failed (exit 75); no rank failed "
                                  "for a reason of its own; the rank that failed is on another "
                                  "host (this tpurun runs host 0 of 2, ranks 0-3): see the "
                                  "tpurun of host 1 (127.0.1.2)"));
  // The job error, relayed from host 0's ranks, names a task of host 1: rank
  // 5, or a rank host 1's tpurun stopped first (seen: "task 4 ... lost its
  // connection", when its SIGTERM beat rank 5's closed connection).
  EXPECT_THAT(run0.err, ::testing::ContainsRegex("task [4-7] of job"));
  EXPECT_THAT(run0.out, Not(HasSubstr("OK\n")));
  std::cerr << "two tpuruns, rank 5 killed: host 1 done after " << run1.elapsed
            << ", host 0 after " << run0.elapsed << "\n";
}

// kill -9 of tpurun takes its ranks with it (PR_SET_PDEATHSIG).
TEST(TpurunTest, KilledTpurunTakesItsRanksWithIt) {
  char dir_template[] = "/tmp/tpurun_pdeath_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  Process p({"--nproc", "2", "--", "/bin/sh", "-c",
             absl::StrCat("echo $$ > ", dir, "/pid.$RANK; exec sleep 60")});
  std::vector<pid_t> ranks;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (ranks.size() < 2 && absl::Now() < until) {
    ranks.clear();
    for (int r = 0; r < 2; ++r) {
      std::string text;
      if (FILE* f = fopen(absl::StrCat(dir, "/pid.", r).c_str(), "r")) {
        char buf[32] = {};
        if (fgets(buf, sizeof(buf), f) != nullptr) text = buf;
        fclose(f);
      }
      int pid = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) && pid > 0) ranks.push_back(pid);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(kill(p.pid(), SIGKILL), 0);
  RunResult run = p.Wait(absl::Seconds(10));
  EXPECT_EQ(run.exit_code, 128 + SIGKILL);
  const absl::Time killed = absl::Now();
  bool gone = false;
  // Gone: no such process, or a zombie waiting for init to reap it.
  auto dead = [](pid_t pid) {
    std::string stat;
    if (FILE* f = fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r")) {
      char buf[512] = {};
      if (fgets(buf, sizeof(buf), f) != nullptr) stat = buf;
      fclose(f);
    }
    const size_t paren = stat.rfind(')');
    return stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() &&
                            (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X'));
  };
  while (!gone && absl::Now() - killed < absl::Seconds(5)) {
    gone = true;
    for (pid_t pid : ranks) gone = gone && dead(pid);
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(gone) << "ranks outlived tpurun";
  EXPECT_LT(absl::Now() - killed, absl::Seconds(1));
  for (pid_t pid : ranks) kill(pid, SIGKILL);
  for (int r = 0; r < 2; ++r) unlink(absl::StrCat(dir, "/pid.", r).c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
