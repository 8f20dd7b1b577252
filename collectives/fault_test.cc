// Faults and bad input: mismatched calls, a killed rank (forked processes),
// a missing rank (timeout), poisoning, the host layout, and /dev/shm
// hygiene after normal and failed runs.
#include <ATen/ATen.h>
#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using test_support::RunForked;
using test_support::ErrorOf;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

TEST(FaultTest, MismatchedShapesFailOnEveryRankNamingThem) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mm");
  RunRankThreads(3, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, SmallOptions(job));
    std::vector<at::Tensor> t = {at::ones({rank == 2 ? 11 : 10}, at::kFloat)};
    auto work = pg->allreduce(t);
    const std::string err = ErrorOf(work);
    EXPECT_TRUE(work->isCompleted());
    EXPECT_FALSE(work->isSuccess());
    EXPECT_NE(work->exception(), nullptr);
    EXPECT_TRUE(work->getFuture()->hasError());
    EXPECT_THAT(err, HasSubstr("allreduce"));
    EXPECT_THAT(err, HasSubstr("mismatched"));
    EXPECT_THAT(err, HasSubstr("rank 2: allreduce #1 dtype=float32 shape=[11]"));
    EXPECT_THAT(err, HasSubstr("rank 0: allreduce #1 dtype=float32 shape=[10]"));
    // Poisoned: the next op fails fast with the same cause.
    const auto start = Clock::now();
    const std::string again = ErrorOf(pg->barrier());
    EXPECT_LT(SecondsSince(start), 1.0);
    EXPECT_THAT(again, HasSubstr("shape=[11]"));
    EXPECT_FALSE(pg->status().ok());
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

TEST(FaultTest, MismatchedDtypeAndOpFail) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("mmd");
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, SmallOptions(job));
    std::vector<at::Tensor> t = {at::ones({4}, rank ? at::kDouble : at::kFloat)};
    EXPECT_THAT(ErrorOf(pg->allreduce(t)), HasSubstr("dtype=float64"));
  });
  RunRankThreads(2, [&](int rank) {
    auto o = SmallOptions(job);
    o.group_name = "ops";
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    std::vector<at::Tensor> t = {at::ones({4}, at::kFloat)};
    const std::string err = rank ? ErrorOf(pg->broadcast(t)) : ErrorOf(pg->allreduce(t));
    EXPECT_THAT(err, HasSubstr("broadcast #1"));
    EXPECT_THAT(err, HasSubstr("allreduce #1"));
  });
}

TEST(FaultTest, MissingRankTimesOutNamingItAndPeersAbortFast) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("to");
  std::atomic<int> failed{0};
  RunRankThreads(3, [&](int rank) {
    auto o = SmallOptions(job);
    o.timeout = std::chrono::milliseconds(rank == 2 ? 10000 : 800);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, o);
    std::vector<at::Tensor> t = {at::ones({100}, at::kFloat)};
    if (rank == 2) {
      // Joins late, after the others gave up: must fail fast on their abort
      // flags instead of waiting out its own 10 s timeout.
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (failed.load() < 2 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const auto start = Clock::now();
      const std::string err = ErrorOf(pg->allreduce(t));
      EXPECT_LT(SecondsSince(start), 2.0);
      EXPECT_THAT(err, HasSubstr("aborted"));
      return;
    }
    const auto start = Clock::now();
    const std::string err = ErrorOf(pg->allreduce(t));
    const double took = SecondsSince(start);
    failed.fetch_add(1);
    EXPECT_GE(took, 0.7);
    EXPECT_LT(took, 5.0);
    if (err.find("timed out") != std::string::npos) {
      EXPECT_THAT(err, HasSubstr("peer rank 2"));
      EXPECT_THAT(err, HasSubstr("bytes 400"));
      EXPECT_THAT(err, HasSubstr("vs timeout 800ms"));
    } else {
      EXPECT_THAT(err, HasSubstr("aborted"));  // the other survivor was first
    }
  });
}

TEST(FaultTest, MismatchedShmLayoutFailsConstruction) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("lay");
  RunRankThreads(2, [&](int rank) {
    auto o = SmallOptions(job);
    o.timeout = std::chrono::seconds(5);
    o.shm_slot_bytes = rank == 0 ? 4096 : 8192;
    try {
      c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
      ADD_FAILURE() << "rank " << rank << " constructed a mismatched group";
    } catch (const c10::Error& e) {
      // Rank 1 sees rank 0's segment too small, or (if rank 0 already failed
      // and unlinked) no segment. Rank 0 either sees rank 1's layout, or
      // (if rank 1 already failed and unlinked) no segment.
      if (rank == 1) {
        EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("is smaller than"),
                                               HasSubstr("No such file")));
      } else {
        EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("uses 8 slots of 8192 bytes"),
                                               HasSubstr("No such file")));
      }
    }
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

TEST(HostLayoutTest, GroupsRanksByHostInFirstAppearanceOrder) {
  const std::vector<std::string> ids = {"a", "b", "a", "c", "b"};
  const HostLayout l = ComputeHostLayout(ids);
  ASSERT_EQ(l.num_hosts(), 3);
  EXPECT_THAT(l.hosts[0], ::testing::ElementsAre(0, 2));
  EXPECT_THAT(l.hosts[1], ::testing::ElementsAre(1, 4));
  EXPECT_THAT(l.hosts[2], ::testing::ElementsAre(3));
  EXPECT_THAT(l.host_of_rank, ::testing::ElementsAre(0, 1, 0, 2, 1));
  EXPECT_THAT(l.local_index, ::testing::ElementsAre(0, 0, 1, 0, 1));
  EXPECT_THAT(l.leaders, ::testing::ElementsAre(0, 1, 3));
  EXPECT_FALSE(l.single_host());
  EXPECT_TRUE(ComputeHostLayout(std::vector<std::string>{"x", "x"}).single_host());
  EXPECT_EQ(DefaultHostId("given"), "given");
  EXPECT_FALSE(DefaultHostId("").empty());
}

// TPU_WORKER_HOSTNAMES entries are numeric under tpurun but names under
// KubeRay ("<group>-0-<j>.<cluster>-headless"): a name that resolves is
// advertised as its address (it used to fall through to the host id or to
// gethostname(), which in a pod or namespace may resolve to 127.0.0.1).
TEST(HostLayoutTest, BindAddressFromTheWorkerHostnamesEntry) {
  auto resolve = [](const std::string& configured, const std::string& worker,
                    const std::string& host_id) {
    absl::StatusOr<BindAddress> a = ResolveBindAddress(configured, worker, host_id);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.value_or(BindAddress{});
  };
  BindAddress a = resolve("", "10.9.8.7", "127.0.9.9");
  EXPECT_EQ(a.bind, "10.9.8.7");
  EXPECT_EQ(a.advertise, "");
  a = resolve("", "localhost", "127.0.9.9");  // a name this host owns: bound
  EXPECT_EQ(a.bind, "127.0.0.1");
  EXPECT_EQ(a.advertise, "");
  a = resolve("", "no-such-host.invalid", "127.0.9.9");  // unresolvable
  EXPECT_EQ(a.bind, "127.0.9.9");  // the numeric host id wins
  EXPECT_EQ(resolve("192.0.2.1", "10.9.8.7", "").bind, "192.0.2.1");
  // A wildcard only when asked for, still advertising a dialable address.
  a = resolve("0.0.0.0", "10.9.8.7", "127.0.9.9");
  EXPECT_EQ(a.bind, "0.0.0.0");
  EXPECT_EQ(a.advertise, "10.9.8.7");
}

// A host name that resolves to an address this host does not own used to
// make the listeners bind 0.0.0.0 silently (every interface, against the
// README's promise). Now it is refused naming the name, its address and the
// variable to set; asking for the wildcard still works and advertises that
// address. "192.0.513" is a name to inet_pton (so not taken as numeric) that
// getaddrinfo resolves to 192.0.2.1 (TEST-NET-1) without DNS.
TEST(HostLayoutTest, NameResolvingToAForeignAddressIsRefusedNotWildcarded) {
  absl::StatusOr<BindAddress> a = ResolveBindAddress("", "192.0.513", "slice_host_0");
  ASSERT_FALSE(a.ok()) << "bound " << a->bind << " advertising " << a->advertise;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(a.status().message()),
              ::testing::AllOf(::testing::HasSubstr("'192.0.513' resolves to 192.0.2.1"),
                               ::testing::HasSubstr("not an address of this host"),
                               ::testing::HasSubstr("TPU_DIST_BIND_ADDRESS=0.0.0.0")));
  a = ResolveBindAddress("0.0.0.0", "192.0.513", "slice_host_0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bind, "0.0.0.0");
  EXPECT_EQ(a->advertise, "192.0.2.1");
}

// Forked processes over a FileStore: correctness and no /dev/shm leftovers.
TEST(ForkedTest, AllreduceAndAllgatherAcrossProcesses) {
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob("fk");
  const int world = 4;
  const std::vector<int> codes = RunForked(world, [&](int rank) {
    auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", world);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, SmallOptions(job));
    std::vector<at::Tensor> t = {at::arange(3001, at::kFloat) * (rank + 1)};
    pg->allreduce(t)->wait();
    if (!at::equal(t[0], at::arange(3001, at::kFloat) * 10)) return 1;
    at::Tensor out = at::empty({world * 5}, at::kLong);
    at::Tensor in = at::full({5}, rank, at::kLong);
    pg->_allgather_base(out, in)->wait();
    if (!at::equal(out, at::arange(world, at::kLong).repeat_interleave(5))) return 2;
    return 0;
  }, std::chrono::seconds(60));
  EXPECT_THAT(codes, ::testing::Each(0));
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// A rank is SIGKILLed by the parent while every rank loops over chunked
// allreduces: the survivors' current op must fail well within its timeout
// naming rank 2, and /dev/shm must be clean. `ahead`: with 8 slots and the
// phases that run ahead next to a busy load (survivors wait on the dead
// rank's own phase word, not the group's arrival count).
void KillDuringAllreduces(bool ahead) {
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob(ahead ? "killahead" : "kill");
  const std::string ready = dir + "/ready";
  const int world = 3;
  const std::vector<int> codes = RunForked(
      world,
      [&](int rank) {
        auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", world);
        auto o = SmallOptions(job);
        o.timeout = std::chrono::seconds(10);
        if (ahead) {
          o.shm_num_slots = 8;
          o.shm_assume_foreign_load = true;
        }
        auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, o);
        for (int i = 0; i < 1000000; ++i) {
          std::vector<at::Tensor> t = {at::ones({20000}, at::kFloat)};
          const auto start = Clock::now();
          const std::string err = ErrorOf(pg->allreduce(t));
          if (i == 3 && rank == 2) close(open(ready.c_str(), O_CREAT | O_WRONLY, 0600));
          if (err.empty()) continue;
          const double took = SecondsSince(start);
          fprintf(stderr, "rank %d failed after %.3f s: %s\n", rank, took, err.c_str());
          if (err.find("rank 2") == std::string::npos) return 3;
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
        kill(pids[2], SIGKILL);
      });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

TEST(ForkedTest, KilledRankFailsSurvivorsWithinTimeoutNamingIt) { KillDuringAllreduces(false); }

TEST(ForkedTest, KilledRankFailsSurvivorsOfPhasesThatRunAhead) { KillDuringAllreduces(true); }

}  // namespace
}  // namespace tpudist::collectives
