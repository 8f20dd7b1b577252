// OpContext::while_waiting (op_header.h): a rank that must wait for a peer
// runs the issuer's bookkeeping before it waits, once per op however many
// phases the op has, and never while a late peer is still on its way in a
// way that changes the result. Checked in both sync modes, for a one-phase
// (fastbox) all_reduce and one spread over several slot phases.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "gtest/gtest.h"
#include "testing/collectives_util.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives::shm {
namespace {

using Sync = CommOptions::Sync;

struct HookLog {
  int runs = 0;
  bool peer_had_arrived = false;  // at the first run
  const std::atomic<bool>* peer_arrived = nullptr;
};

void Record(void* arg) {
  auto* log = static_cast<HookLog*>(arg);
  if (log->runs++ == 0) log->peer_had_arrived = log->peer_arrived->load();
}

TEST(WaitHookTest, AWaitingRankRunsItOnceBeforeItsLatePeerArrives) {
  for (Sync sync : {Sync::kArrivals, Sync::kPollPeers}) {
    for (int64_t count : {int64_t{2}, int64_t{4096}}) {  // one fastbox phase; 4 slot phases
      SCOPED_TRACE(::testing::Message() << (sync == Sync::kArrivals ? "arrivals" : "poll")
                                        << " count " << count);
      auto store = c10::make_intrusive<c10d::HashStore>();
      const std::string job = test_support::UniqueJob("whook");
      std::atomic<bool> rank1_arrived{false};
      test_support::RunRankThreads(2, [&](int rank) {
        CommOptions options;
        options.job_id = job;
        options.slot_bytes = 4096;
        options.num_slots = 2;
        options.sync = sync;
        std::unique_ptr<Communicator> comm =
            test_support::CreateShmComm(*store, rank, 2, options);
        ASSERT_NE(comm, nullptr);
        std::vector<float> v(count, static_cast<float>(rank + 1));  // [count]
        HookLog log;
        log.peer_arrived = &rank1_arrived;
        WaitHook hook(&Record, &log);
        OpSpec spec = test_support::ShmOpSpec(1, "allreduce", DataType::kFloat32, count);
        spec.ctx.while_waiting = &hook;
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          rank1_arrived = true;
        }
        ASSERT_TRUE(AllReduce(*comm, spec, ReduceKind::kSum, v.data(), 32 << 10).ok());
        for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(v[i], 3.0f) << i;
        EXPECT_LE(log.runs, 1) << "rank " << rank;
        if (rank == 0) {
          EXPECT_EQ(log.runs, 1) << "rank 0 waited 200 ms without running the hook";
          EXPECT_FALSE(log.peer_had_arrived) << "the hook ran after the wait, not in it";
        }
        hook.Run();  // the issuer's call after the op: runs it only if nobody did
        EXPECT_EQ(log.runs, 1) << "rank " << rank;
      });
    }
  }
}

}  // namespace
}  // namespace tpudist::collectives::shm
