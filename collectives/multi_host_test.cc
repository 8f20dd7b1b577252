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

#include "absl/strings/str_cat.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::RunForked;
using testing::RunThreads;
using testing::ShmEntries;
using testing::SmallOptions;
using testing::UniqueJob;
using Clock = std::chrono::steady_clock;

std::string ErrorOf(const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait(std::chrono::seconds(60));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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
  RunThreads(4, [&](int rank) {
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

// A mismatch inside host 1 (rank 3 differs from rank 2): host 1's ranks name
// group ranks in the shm message; host 0 fails through the TCP shutdown.
TEST(MultiHostFaultTest, MismatchInsideAHostFailsEveryRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mhl");
  RunThreads(4, [&](int rank) {
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
// host via its leader).
void KillRemoteRank(int victim) {
  const std::string dir = testing::TempDir();
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
          const auto start = Clock::now();
          const std::string err = ErrorOf(pg->allreduce(t));
          if (i == 3 && rank == victim) close(open(ready.c_str(), O_CREAT | O_WRONLY, 0600));
          if (err.empty()) continue;
          const double took = SecondsSince(start);
          fprintf(stderr, "rank %d failed after %.3f s: %s\n", rank, took, err.c_str());
          // Ranks on the victim's host see it directly (shm); the others see
          // its host's leader go away over TCP (named with its host's ranks).
          const bool same_host = hosts[rank] == hosts[victim];
          const std::string name = same_host || victim == 2 ? absl::StrCat("rank ", victim)
                                                            : "ranks 2,3";
          if (err.find(name) == std::string::npos) return 3;
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

}  // namespace
}  // namespace tpudist::collectives
