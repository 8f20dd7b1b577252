// The multi-rail paths of HierarchicalBackend (hierarchical_backend_rails.cc)
// against ProcessGroupGloo over the same ranks: every rails op, fp32 and
// bf16, every ReduceOp, counts that do not divide by the ranks per host, 2
// and 3 hosts, interleaved hosts, and hosts of different sizes (the leaders
// fallback); a mismatch across hosts and a rank killed mid-op must fail
// every rank promptly.
#include <ATen/ATen.h>
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collectives/hierarchical_backend_pipeline.h"
#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using test_support::ErrorOf;
using test_support::MakeGloo;
using test_support::RunForked;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

// hosts[r] names rank r's emulated host. min_bytes 0: every op whose
// payload splits over the host's ranks takes the rails.
ProcessGroupTpuDist::Options RailOptions(const std::string& job, const std::string& hosts,
                                         int rank, int64_t min_bytes = 0) {
  auto o = SmallOptions(job);
  o.host_id = std::string("h") + hosts[rank];
  o.bind_address = "127.0.0.1";
  o.multi_rail_min_bytes = min_bytes;
  o.rail_chunk_bytes = 1024;  // several pipelined chunks from a few hundred elements
  return o;
}

// Small integers (exact in bf16 sums over <= 8 ranks); `salt` varies them.
at::Tensor Input(int rank, int64_t n, at::ScalarType type, int salt = 0) {
  return ((at::arange(n, at::kLong) * 7 + rank * 13 + salt) % 11 - 5).to(type);
}
// -1, 0, 1: exact products.
at::Tensor ProductInput(int rank, int64_t n, at::ScalarType type) {
  return ((at::arange(n, at::kLong) + rank) % 3 - 1).to(type);
}

// The pipeline's schedule: tcp(k) after before(k), after(k) after tcp(k),
// every stage once per chunk, in chunk order.
TEST(RailPipelineTest, RunsEveryStageInDependencyOrder) {
  absl::Mutex mu;
  std::vector<std::string> log;
  auto note = [&](const std::string& e) {
    absl::MutexLock lock(&mu);
    log.push_back(e);
  };
  RailStages st;
  st.before = [&](int64_t k) { note(absl::StrCat("b", k)); return absl::OkStatus(); };
  st.tcp = [&](int64_t k) { note(absl::StrCat("t", k)); return absl::OkStatus(); };
  st.after = [&](int64_t k) { note(absl::StrCat("a", k)); return absl::OkStatus(); };
  const RailPipelineResult r = RunRailPipeline(5, st, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(r.status.ok()) << r.status;
  auto pos = [&](const std::string& e) {
    return std::find(log.begin(), log.end(), e) - log.begin();
  };
  ASSERT_EQ(log.size(), 15u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_LT(pos(absl::StrCat("b", k)), pos(absl::StrCat("t", k))) << k;
    EXPECT_LT(pos(absl::StrCat("t", k)), pos(absl::StrCat("a", k))) << k;
    if (k > 0) {
      EXPECT_LT(pos(absl::StrCat("t", k - 1)), pos(absl::StrCat("t", k))) << k;
    }
    // The shm steps' order is fixed: b0 b1 a0 b2 a1 ... b4 a3 a4.
    if (k > 0 && k + 1 < 5) {
      EXPECT_LT(pos(absl::StrCat("a", k - 1)), pos(absl::StrCat("b", k + 1))) << k;
    }
  }
}

// A failing tcp stage aborts the shm side once and is reported as the
// failure; a failing shm stage unblocks a tcp stage waiting on the network
// through abort_tcp.
TEST(RailPipelineTest, FirstFailureWinsAndAbortsTheOtherStage) {
  std::atomic<int> shm_aborts{0};
  RailStages st;
  st.tcp = [](int64_t k) {
    return k == 2 ? absl::UnavailableError("peer 3 gone") : absl::OkStatus();
  };
  st.abort_shm = [&](const absl::Status&) { ++shm_aborts; };
  RailPipelineResult r = RunRailPipeline(6, st, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(r.tcp_failed);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("peer 3 gone"));
  EXPECT_EQ(shm_aborts.load(), 1);

  std::atomic<bool> aborted{false};
  RailStages st2;
  st2.before = [](int64_t k) {
    return k == 1 ? absl::AbortedError("local rank died") : absl::OkStatus();
  };
  st2.tcp = [&](int64_t) {  // blocks like a transfer until aborted
    while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::AbortedError("rail aborted");
  };
  st2.abort_tcp = [&](const absl::Status&) { aborted = true; };
  const auto start = Clock::now();
  r = RunRailPipeline(4, st2, absl::Now() + absl::Seconds(30));
  EXPECT_FALSE(r.tcp_failed);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("local rank died"));
  EXPECT_LT(SecondsSince(start), 5.0);
}

class RailsTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {};

TEST_P(RailsTest, EveryRailsOpMatchesGloo) {
  const auto [hosts, count] = GetParam();
  const int world = static_cast<int>(hosts.size());
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("rails");
  RunRankThreads(world, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(
        c10::make_intrusive<c10d::PrefixStore>("td", store), rank, world,
        RailOptions(job, hosts, rank));
    auto gloo = MakeGloo(store, rank, world);
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      const std::string tn = c10::toString(type);
      // allreduce, every op; AVG against Gloo's SUM / W (Gloo has no AVG).
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::MIN,
                      c10d::ReduceOp::MAX, c10d::ReduceOp::PRODUCT}) {
        at::Tensor in = op == c10d::ReduceOp::PRODUCT ? ProductInput(rank, count, type)
                                                      : Input(rank, count, type);
        std::vector<at::Tensor> a = {in.clone()}, b = {in.clone()};
        c10d::AllreduceOptions ao, go;
        ao.reduceOp = op;
        go.reduceOp = op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
        pg->allreduce(a, ao)->wait();
        gloo->allreduce(b, go)->wait();
        at::Tensor expect = op == c10d::ReduceOp::AVG ? (b[0].to(at::kFloat) / world).to(type)
                                                      : b[0];
        EXPECT_TRUE(at::equal(a[0], expect))
            << "allreduce " << tn << " op " << int(op) << " rank " << rank;
      }
      // _reduce_scatter_base SUM / AVG / MAX vs Gloo's allreduce of the input.
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::MAX}) {
        at::Tensor full = Input(rank, world * count, type, 3);
        at::Tensor out = at::full({count}, 99, type);
        c10d::ReduceScatterOptions ro;
        ro.reduceOp = op;
        pg->_reduce_scatter_base(out, full, ro)->wait();
        std::vector<at::Tensor> b = {full.clone()};
        c10d::AllreduceOptions go;
        go.reduceOp = op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op;
        gloo->allreduce(b, go)->wait();
        at::Tensor expect = b[0].narrow(0, rank * count, count);
        if (op == c10d::ReduceOp::AVG) expect = (expect.to(at::kFloat) / world).to(type);
        EXPECT_TRUE(at::equal(out, expect))
            << "reduce_scatter " << tn << " op " << int(op) << " rank " << rank;
      }
      // allgather (list form) vs Gloo's.
      {
        std::vector<at::Tensor> in = {Input(rank, count, type, 5)};
        std::vector<std::vector<at::Tensor>> oa(1), ob(1);
        for (int r = 0; r < world; ++r) {
          oa[0].push_back(at::full({count}, 99, type));
          ob[0].push_back(at::empty({count}, type));
        }
        pg->allgather(oa, in)->wait();
        gloo->allgather(ob, in)->wait();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(at::equal(oa[0][r], ob[0][r])) << "allgather " << tn << " from " << r;
        }
      }
      // broadcast from a leader, a non-leader and the last rank.
      for (int root : {0, 1, world - 1}) {
        std::vector<at::Tensor> a = {Input(rank, count, type, 7)}, b = {a[0].clone()};
        c10d::BroadcastOptions bo;
        bo.rootRank = root;
        pg->broadcast(a, bo)->wait();
        gloo->broadcast(b, bo)->wait();
        EXPECT_TRUE(at::equal(a[0], b[0])) << "broadcast " << tn << " root " << root;
      }
    }
    EXPECT_TRUE(pg->status().ok()) << pg->status();
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// 2 x 2, 3 x 2, interleaved hosts, 2 x 3 (counts not divisible by 3), 4 x 4,
// and hosts of different sizes (leaders path); counts below, at and above
// the ranks per host, odd (a tail on the last rail) and multi-slot.
INSTANTIATE_TEST_SUITE_P(
    HostsByCount, RailsTest,
    ::testing::Combine(::testing::Values("0011", "001122", "0101", "000111", "00111",
                                         "0000111122223333"),
                       ::testing::Values<int64_t>(1, 5, 2501)),
    [](const auto& info) {
      return "hosts" + std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param));
    });

// Host 1 calls a rails allreduce with a different count: every rank (the
// non-leaders on their own rails too) fails naming both hosts' calls.
TEST(RailsFaultTest, MismatchAcrossHostsFailsEveryRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("railm");
  RunRankThreads(4, [&](int rank) {
    auto o = RailOptions(job, "0011", rank);
    o.timeout = std::chrono::seconds(20);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4, o);
    std::vector<at::Tensor> t = {at::ones({rank >= 2 ? 1002 : 1000}, at::kFloat)};
    const auto start = Clock::now();
    const std::string err = ErrorOf(pg->allreduce(t));
    EXPECT_THAT(err, HasSubstr("hosts called mismatched collectives")) << rank;
    EXPECT_THAT(err, HasSubstr("shape=[1002]")) << rank;
    EXPECT_LT(SecondsSince(start), 5.0) << rank;
  });
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// Forked ranks on 2 emulated hosts x 2 loop over 1 MiB rails ops (threshold
// lowered to 256 KiB, the real slot geometry, 4 pipelined chunks); the
// parent SIGKILLs `victim`. Every survivor must fail well within the 10 s op
// timeout.
void KillDuringRails(int victim, bool all_gather) {
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob("railk");
  const std::string ready = dir + "/ready";
  const std::vector<int> codes = RunForked(
      4,
      [&](int rank) {
        auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", 4);
        auto o = RailOptions(job, "0011", rank, 256 << 10);
        o.timeout = std::chrono::seconds(10);
        o.shm_slot_bytes = 0;  // the real slot geometry
        o.rail_chunk_bytes = 256 << 10;  // 4 pipelined chunks per op
        auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4, o);
        at::Tensor ag_in = at::ones({65536}, at::kFloat);      // [64 Ki]
        at::Tensor ag_out = at::empty({4 * 65536}, at::kFloat);  // [4 * 64 Ki]: 1 MiB
        for (int i = 0; i < 1000000; ++i) {
          std::vector<at::Tensor> t = {at::ones({262144}, at::kFloat)};  // 1 MiB
          const auto start = Clock::now();
          const std::string err = all_gather ? ErrorOf(pg->_allgather_base(ag_out, ag_in))
                                             : ErrorOf(pg->allreduce(t));
          if (i == 3 && rank == victim) close(open(ready.c_str(), O_CREAT | O_WRONLY, 0600));
          if (err.empty()) continue;
          const double took = SecondsSince(start);
          fprintf(stderr, "rank %d failed after %.3f s: %s\n", rank, took, err.c_str());
          return took > 5.0 ? 4 : 0;
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

TEST(RailsFaultTest, KilledNonLeaderDuringAllReduceFailsSurvivors) { KillDuringRails(3, false); }
TEST(RailsFaultTest, KilledLeaderDuringAllReduceFailsSurvivors) { KillDuringRails(0, false); }
TEST(RailsFaultTest, KilledNonLeaderDuringAllGatherFailsSurvivors) { KillDuringRails(1, true); }

}  // namespace
}  // namespace tpudist::collectives
