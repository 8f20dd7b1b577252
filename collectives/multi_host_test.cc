// Multi-host groups: mismatches and a killed rank across emulated hosts, and
// real network namespaces (tools/netns_hosts.sh) with ProcessGroupGloo over
// the same ranks as the oracle. The netns test re-executes this binary with
// --gtest_filter=NetnsWorker.* inside each namespace; NetnsWorker skips
// unless TDH_RANK is set.
#include <ATen/ATen.h>
#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "testing/source_dir.h"
#include "tpu_runtime/job_secret.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using test_support::ErrorOf;
using test_support::RunForked;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

ProcessGroupTpuDist::Options HostOptions(const std::string& job, const std::string& hosts,
                                         int rank) {
  auto o = SmallOptions(job);
  o.host_id = std::string("h") + hosts[rank];
  o.bind_address = "127.0.0.1";
  return o;
}

// Host 1 (ranks 2, 3) calls with a different shape than host 0: both leaders
// see each host's call; the non-leaders fail through their leader's abort.
TEST(MultiHostFaultTest, MismatchAcrossHostsFailsEveryRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mhm");
  RunRankThreads(4, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4,
                                                       HostOptions(job, "0011", rank));
    std::vector<at::Tensor> ok = {at::ones({5}, at::kFloat)};
    pg->allreduce(ok)->wait();  // healthy first
    EXPECT_TRUE(at::equal(ok[0], at::full({5}, 4.0f)));
    std::vector<at::Tensor> t = {at::ones({rank >= 2 ? 11 : 10}, at::kFloat)};
    const std::string err = ErrorOf(pg->allreduce(t));
    EXPECT_THAT(err, HasSubstr("hosts called mismatched collectives")) << rank;
    EXPECT_THAT(err, HasSubstr("host 1 (ranks 2,3): allreduce #2 dtype=float32 shape=[11]"));
    EXPECT_THAT(err, HasSubstr("host 0 (ranks 0,1): allreduce #2 dtype=float32 shape=[10]"));
    const auto start = Clock::now();
    EXPECT_THAT(ErrorOf(pg->barrier()), HasSubstr("mismatched"));
    EXPECT_LT(SecondsSince(start), 1.0);
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// Rows rank `src` sends rank `dst` in the uneven all-to-all tests: uneven,
// zero for some pairs (also across hosts), up to a few thousand rows so the
// blocks span many shm slots and TCP socket buffers.
int64_t AllToAllRows(int src, int dst, int64_t scale) {
  return ((3 * src + 2 * dst + 1) % 5) * scale + (src + dst) % 2;
}

// alltoall_base with uneven input/output split sizes (rows of 3 floats) and
// with even splits, on hosts given by `hosts` (host id per rank; hosts may
// hold non-contiguous ranks and differ in size): ProcessGroupGloo over the
// same ranks is the oracle, and the results must be bit-identical.
void AllToAllMatchesGloo(const std::string& hosts, int64_t scale) {
  const int world = static_cast<int>(hosts.size());
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mha2a");
  RunRankThreads(world, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world,
                                                       HostOptions(job, hosts, rank));
    auto gloo = test_support::MakeGloo(store, rank, world);
    std::vector<int64_t> in_split(world), out_split(world);
    for (int p = 0; p < world; ++p) {
      in_split[p] = AllToAllRows(rank, p, scale);
      out_split[p] = AllToAllRows(p, rank, scale);
    }
    int64_t in_rows = 0, out_rows = 0;
    for (int p = 0; p < world; ++p) {
      in_rows += in_split[p];
      out_rows += out_split[p];
    }
    at::Tensor in = at::randn({in_rows, 3}, at::kFloat);  // [in_rows, 3]
    at::Tensor ours = at::full({out_rows, 3}, -7.0f);     // [out_rows, 3]
    at::Tensor oracle = at::full({out_rows, 3}, 7.0f);    // [out_rows, 3]
    std::vector<int64_t> is = in_split, os = out_split, is2 = in_split, os2 = out_split;
    pg->alltoall_base(ours, in, os, is)->wait();
    gloo->alltoall_base(oracle, in, os2, is2)->wait();
    EXPECT_TRUE(at::equal(ours, oracle)) << "uneven, rank " << rank << " hosts " << hosts;
    at::Tensor even_in = at::randn({world * scale, 3}, at::kFloat);  // [W * scale, 3]
    at::Tensor even_ours = at::zeros_like(even_in), even_oracle = at::ones_like(even_in);
    std::vector<int64_t> none;
    pg->alltoall_base(even_ours, even_in, none, none)->wait();
    gloo->alltoall_base(even_oracle, even_in, none, none)->wait();
    EXPECT_TRUE(at::equal(even_ours, even_oracle)) << "even, rank " << rank << " hosts " << hosts;
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

TEST(MultiHostAllToAllTest, UnevenSplitsTwoHostsTimesTwoMatchGloo) {
  AllToAllMatchesGloo("0011", 1000);
}
TEST(MultiHostAllToAllTest, UnevenSplitsInterleavedHostsMatchGloo) {
  AllToAllMatchesGloo("0110", 1000);
}
TEST(MultiHostAllToAllTest, UnevenSplitsUnequalHostsMatchGloo) {
  AllToAllMatchesGloo("00121", 700);
}

// A mismatch inside host 1 (rank 3 differs from rank 2): host 1's ranks name
// group ranks in the shm message; host 0 fails through the TCP shutdown.
TEST(MultiHostFaultTest, MismatchInsideAHostFailsEveryRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mhl");
  RunRankThreads(4, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4,
                                                       HostOptions(job, "0101", rank));
    std::vector<at::Tensor> t = {at::ones({rank == 3 ? 7 : 6}, at::kFloat)};
    const std::string err = ErrorOf(pg->allreduce(t));
    EXPECT_FALSE(err.empty()) << rank;
    if (rank == 1 || rank == 3) {
      // The local step of the hierarchical allreduce is a reduce to the leader.
      EXPECT_THAT(err, HasSubstr("mismatched collectives"));
      EXPECT_THAT(err, HasSubstr("rank 3: reduce #1 dtype=float32 shape=[7]"));
      EXPECT_THAT(err, HasSubstr("rank 1: reduce #1 dtype=float32 shape=[6]"));
    }
    EXPECT_FALSE(pg->status().ok());
  });
}

// Forked ranks on 2 emulated hosts over a FileStore; the parent SIGKILLs
// `victim` mid-loop. Survivors must fail well within the 10 s op timeout,
// naming the victim (directly via shm or TCP, or as a rank of the failed
// host via its leader). all_to_all: the loop runs 2 MiB alltoall_base
// instead (shm and TCP parts overlapped); survivors must fail as promptly,
// with whatever peer their part noticed first.
void KillRemoteRank(int victim, bool all_to_all = false) {
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob("mhk");
  const std::string ready = dir + "/ready";
  const std::string hosts = "0011";
  const std::vector<int> codes = RunForked(
      4,
      [&](int rank) {
        auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", 4);
        auto o = HostOptions(job, hosts, rank);
        o.timeout = std::chrono::seconds(10);
        auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4, o);
        for (int i = 0; i < 1000000; ++i) {
          std::vector<at::Tensor> t = {at::ones({20000}, at::kFloat)};
          at::Tensor a2a_in = at::ones({4 * 131072}, at::kFloat);  // [4 * 128 Ki]: 2 MiB
          at::Tensor a2a_out = at::empty_like(a2a_in);
          std::vector<int64_t> even;
          const auto start = Clock::now();
          const std::string err = all_to_all
                                      ? ErrorOf(pg->alltoall_base(a2a_out, a2a_in, even, even))
                                      : ErrorOf(pg->allreduce(t));
          if (i == 3 && rank == victim) close(open(ready.c_str(), O_CREAT | O_WRONLY, 0600));
          if (err.empty()) continue;
          const double took = SecondsSince(start);
          fprintf(stderr, "rank %d failed after %.3f s: %s\n", rank, took, err.c_str());
          // Ranks on the victim's host see it directly (shm); the others see
          // its host's leader go away over TCP (named with its host's ranks).
          const bool same_host = hosts[rank] == hosts[victim];
          const std::string name = same_host || victim == 2 ? absl::StrCat("rank ", victim)
                                                            : "ranks 2,3";
          if (!all_to_all && err.find(name) == std::string::npos) return 3;
          if (took > 5.0) return 4;
          return 0;
        }
        return 5;
      },
      std::chrono::seconds(60),
      [&](const std::vector<pid_t>& pids) {
        const auto until = Clock::now() + std::chrono::seconds(30);
        while (access(ready.c_str(), F_OK) != 0 && Clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        kill(pids[victim], SIGKILL);
      });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(codes[r], r == victim ? 128 + SIGKILL : 0) << "rank " << r;
  }
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
  std::filesystem::remove_all(dir);
}

TEST(MultiHostFaultTest, KilledLeaderOnAnotherHostFailsSurvivorsNamingIt) { KillRemoteRank(2); }
TEST(MultiHostFaultTest, KilledNonLeaderOnAnotherHostFailsSurvivors) { KillRemoteRank(3); }
TEST(MultiHostFaultTest, KilledRankDuringAllToAllFailsSurvivors) { KillRemoteRank(3, true); }

// --- Real network namespaces -------------------------------------------

int Shell(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) output->append(buf);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double MeanMs(const std::function<void()>& op, int iters) {
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  return SecondsSince(start) * 1e3 / iters;
}

// One rank of the netns job: tpu_dist and Gloo over the same ranks and
// store; Gloo's results are the oracle. Returns 0 on success.
int NetnsRank(int host, int hosts, int local, const std::string& addr, const std::string& dir) {
  const int ranks_per_host = 2, world = hosts * ranks_per_host;
  const int rank = host * ranks_per_host + local;
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", world);
  ProcessGroupTpuDist::Options o;
  o.timeout = std::chrono::seconds(60);
  o.host_id = absl::StrCat("ns", host);
  o.bind_address = addr;
  o.job_id = absl::StrCat("netns", getppid());
  // TPU_DIST_JOB_SECRET / _FILE as distributed/group_config.h reads them
  // (the process group itself takes only explicit values).
  absl::StatusOr<std::string> secret = tpu_runtime::JobSecretFromProcessEnv();
  if (!secret.ok()) return 11;
  o.job_secret = *secret;
  auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, o);
  if (pg->host_layout().num_hosts() != hosts) return 10;
  auto gopts = c10d::ProcessGroupGloo::Options::create();
  gopts->timeout = std::chrono::seconds(60);
  gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, world, gopts);
  auto input = [&](int64_t n, int salt) {  // small integers: exact sums
    return ((at::arange(n, at::kLong) * 7 + rank * 13 + salt) % 11 - 5).to(at::kFloat);
  };
  // allreduce SUM/MAX
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300000}}) {
    for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX}) {
      std::vector<at::Tensor> a = {input(n, 1)}, b = {input(n, 1)};
      c10d::AllreduceOptions ao;
      ao.reduceOp = op;
      pg->allreduce(a, ao)->wait();
      gloo->allreduce(b, ao)->wait();
      if (!at::equal(a[0], b[0])) return 11;
    }
  }
  // allgather, broadcast, alltoall_base, reduce_scatter vs Gloo's allreduce.
  {
    std::vector<at::Tensor> in = {input(777, 2)};
    std::vector<std::vector<at::Tensor>> oa(1), ob(1);
    for (int r = 0; r < world; ++r) {
      oa[0].push_back(at::empty({777}, at::kFloat));
      ob[0].push_back(at::empty({777}, at::kFloat));
    }
    pg->allgather(oa, in)->wait();
    gloo->allgather(ob, in)->wait();
    for (int r = 0; r < world; ++r) {
      if (!at::equal(oa[0][r], ob[0][r])) return 12;
    }
    std::vector<at::Tensor> ba = {input(5000, 3)}, bb = {input(5000, 3)};
    c10d::BroadcastOptions bo;
    bo.rootRank = world - 1;
    pg->broadcast(ba, bo)->wait();
    gloo->broadcast(bb, bo)->wait();
    if (!at::equal(ba[0], bb[0])) return 13;
    at::Tensor ti = input(world * 100, 4), ta = at::empty_like(ti), tb = at::empty_like(ti);
    std::vector<int64_t> none;
    pg->alltoall_base(ta, ti, none, none)->wait();
    gloo->alltoall_base(tb, ti, none, none)->wait();
    if (!at::equal(ta, tb)) return 14;
    // Uneven splits (some pairs empty, across hosts too), rows of 2 floats.
    std::vector<int64_t> is(world), os(world);
    for (int p = 0; p < world; ++p) {
      is[p] = (3 * rank + 2 * p + 1) % 5 * 300 + (rank + p) % 2;
      os[p] = (3 * p + 2 * rank + 1) % 5 * 300 + (rank + p) % 2;
    }
    int64_t in_rows = 0, out_rows = 0;
    for (int p = 0; p < world; ++p) {
      in_rows += is[p];
      out_rows += os[p];
    }
    at::Tensor ui = input(in_rows * 2, 6).view({in_rows, 2});  // [in_rows, 2]
    at::Tensor ua = at::full({out_rows, 2}, -9.0f), ub = at::full({out_rows, 2}, 9.0f);
    std::vector<int64_t> is2 = is, os2 = os;
    pg->alltoall_base(ua, ui, os, is)->wait();
    gloo->alltoall_base(ub, ui, os2, is2)->wait();
    if (!at::equal(ua, ub)) return 16;
    at::Tensor rs_out = at::empty({100}, at::kFloat);
    pg->_reduce_scatter_base(rs_out, ti)->wait();
    std::vector<at::Tensor> full = {ti.clone()};
    gloo->allreduce(full)->wait();
    if (!at::equal(rs_out, full[0].narrow(0, rank * 100, 100))) return 15;
    pg->barrier()->wait();
  }
  // Timings: all_reduce 16 MiB fp32 and 8 B, same ranks, same run.
  std::vector<at::Tensor> big = {at::ones({4 << 20}, at::kFloat)}, tiny = {at::ones({2})};
  pg->allreduce(big)->wait();
  gloo->allreduce(big)->wait();
  const double tb16 = MeanMs([&] { pg->allreduce(big)->wait(); }, 5);
  const double gb16 = MeanMs([&] { gloo->allreduce(big)->wait(); }, 5);
  const double t8 = MeanMs([&] { pg->allreduce(tiny)->wait(); }, 50);
  const double g8 = MeanMs([&] { gloo->allreduce(tiny)->wait(); }, 50);
  // reduce_scatter is an allreduce of the whole input: its cost vs allreduce.
  const int64_t rs_n = (4 << 20) / world;  // 16 MiB of input, W equal blocks
  at::Tensor rs_in = at::ones({rs_n * world}, at::kFloat), rs_o = at::empty({rs_n});
  pg->_reduce_scatter_base(rs_o, rs_in)->wait();  // warm-up
  const double rs16 = MeanMs([&] { pg->_reduce_scatter_base(rs_o, rs_in)->wait(); }, 5);
  // all_to_all of 16 MiB per rank (alltoall_base, even splits; rounded
  // down to a multiple of the world).
  at::Tensor a2a_in = at::ones({(4 << 20) / world * world}, at::kFloat);  // [~4 Mi]
  at::Tensor a2a_out = at::empty_like(a2a_in);
  std::vector<int64_t> even;
  pg->alltoall_base(a2a_out, a2a_in, even, even)->wait();  // warm-up
  gloo->alltoall_base(a2a_out, a2a_in, even, even)->wait();
  const double ta16 = MeanMs([&] { pg->alltoall_base(a2a_out, a2a_in, even, even)->wait(); }, 5);
  const double ga16 =
      MeanMs([&] { gloo->alltoall_base(a2a_out, a2a_in, even, even)->wait(); }, 5);
  // reduce_scatter on Gloo too, all_gather (16 MiB gathered) and broadcast
  // (16 MiB), same ranks, same run.
  auto gloo_rs_opts = c10d::ReduceScatterOptions();
  gloo->_reduce_scatter_base(rs_o, rs_in, gloo_rs_opts)->wait();  // warm-up
  const double grs16 =
      MeanMs([&] { gloo->_reduce_scatter_base(rs_o, rs_in, gloo_rs_opts)->wait(); }, 5);
  at::Tensor ag_in = at::ones({rs_n}, at::kFloat), ag_out = at::empty({rs_n * world});
  pg->_allgather_base(ag_out, ag_in)->wait();
  gloo->_allgather_base(ag_out, ag_in)->wait();
  const double tag16 = MeanMs([&] { pg->_allgather_base(ag_out, ag_in)->wait(); }, 5);
  const double gag16 = MeanMs([&] { gloo->_allgather_base(ag_out, ag_in)->wait(); }, 5);
  pg->broadcast(big)->wait();  // warm-up
  gloo->broadcast(big)->wait();
  const double tbc16 = MeanMs([&] { pg->broadcast(big)->wait(); }, 5);
  const double gbc16 = MeanMs([&] { gloo->broadcast(big)->wait(); }, 5);
  if (rank == 0) {
    fprintf(stdout,
            "%s %d hosts x 2: all_reduce 16 MiB tpu_dist %.2f ms gloo %.2f ms; "
            "8 B tpu_dist %.1f us gloo %.1f us; reduce_scatter 16 MiB in %.2f ms gloo %.2f ms; "
            "all_gather 16 MiB out tpu_dist %.2f ms gloo %.2f ms; broadcast 16 MiB tpu_dist "
            "%.2f ms gloo %.2f ms; all_to_all 16 MiB tpu_dist %.2f ms gloo %.2f ms\n",
            addr == "127.0.0.1" ? "emulated" : "netns", hosts, tb16, gb16, t8 * 1e3, g8 * 1e3, rs16,
            grs16, tag16, gag16, tbc16, gbc16, ta16, ga16);
    fflush(stdout);
  }
  return 0;
}

// Runs inside one namespace (TDH_* set by tools/netns_hosts.sh run).
TEST(NetnsWorker, TwoRanksOnThisHost) {
  const char* h = std::getenv("TDH_RANK");
  const char* n = std::getenv("TDH_SIZE");
  const char* addr = std::getenv("TDH_ADDR");
  const char* dir = std::getenv("TPU_DIST_NETNS_DIR");
  if (!h || !n || !addr || !dir) GTEST_SKIP() << "only runs under tools/netns_hosts.sh";
  const int host = std::atoi(h), hosts = std::atoi(n);
  const std::vector<int> codes = RunForked(
      2, [&](int local) { return NetnsRank(host, hosts, local, addr, dir); },
      std::chrono::seconds(120));
  EXPECT_THAT(codes, ::testing::Each(0));
  if (codes == std::vector<int>{0, 0}) printf("host %d OK addr %s\n", host, addr);
}

// with_secret: every rank gets TPU_DIST_JOB_SECRET (the TCP mesh then
// authenticates each connection) and no rank may warn about listening
// without one; without, each host's ranks warn.
void RunInNamespaces(int hosts, bool with_secret) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  std::string probe;
  if (Shell("ip netns list", &probe) != 0) GTEST_SKIP() << "`ip netns` unavailable: " << probe;
  const std::string script = test_support::SourceDir() + "/tools/netns_hosts.sh";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string suffix = absl::StrCat("c", getpid(), "n", hosts);
  std::string out;
  const std::string secret =
      with_secret ? absl::StrCat("TPU_DIST_JOB_SECRET=", std::string(64, '5'), " ") : "";
  const int rc = Shell(absl::StrCat(secret, "TPU_DIST_NETNS_DIR=", dir,
                                    " TDH_TIMEOUT=150 timeout --kill-after=5 170 ", script,
                                    " run ", hosts, " ", suffix, " -- ", self,
                                    " --gtest_filter=NetnsWorker.*"),
                       &out);
  std::string leftover;
  Shell(absl::StrCat(script, " down ", suffix, "; ip netns list | grep _", suffix, " || true"),
        &leftover);
  std::filesystem::remove_all(dir);
  for (const auto& line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "netns ")) printf("%s\n", std::string(line).c_str());
  }
  EXPECT_EQ(rc, 0) << out;
  for (int h = 0; h < hosts; ++h) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("host ", h, " OK addr 10.250.0.", h + 1)));
  }
  EXPECT_EQ(leftover, "") << "namespaces left behind";
  if (with_secret) {
    EXPECT_THAT(out, ::testing::Not(HasSubstr("without a job secret")));
  } else {
    EXPECT_THAT(out, HasSubstr("without a job secret"));
  }
}

// The same job on 2 emulated hosts x 2 forked ranks over loopback.
TEST(MultiHostForkedTest, TwoEmulatedHostsTimesTwoRanksMatchGloo) {
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::vector<int> codes = RunForked(
      4, [&](int r) { return NetnsRank(r / 2, 2, r % 2, "127.0.0.1", dir); },
      std::chrono::seconds(120));
  std::filesystem::remove_all(dir);
  EXPECT_THAT(codes, ::testing::Each(0));
}

TEST(NetnsTest, TwoNamespaceHostsTimesTwoRanksMatchGloo) { RunInNamespaces(2, false); }
TEST(NetnsTest, ThreeNamespaceHostsTimesTwoRanksWithJobSecretMatchGloo) {
  RunInNamespaces(3, true);
}

// Two hosts x two ranks as threads, the TCP mesh authenticated with a secret
// given in the options.
TEST(MultiHostAuthTest, JobSecretInOptionsAuthenticatesTheMesh) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mha");
  RunRankThreads(4, [&](int rank) {
    auto o = HostOptions(job, "0011", rank);
    o.job_secret = "a job secret of at least 16 bytes";
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4, o);
    std::vector<at::Tensor> t = {at::full({7}, static_cast<float>(rank))};
    pg->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t[0], at::full({7}, 6.0f))) << rank;
  });
}

}  // namespace
}  // namespace tpudist::collectives
