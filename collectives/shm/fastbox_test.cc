// The fastbox and the two sync modes of shm::Communicator (communicator.h):
// ranks that disagree on them fail at setup naming both; small one-phase
// ops (payload and header digest in the slot's first line) give the
// reference results in both sync modes and with fastboxes off; mismatched
// calls still fail on every rank with both headers named when both ranks
// took the fastbox, when only one did, and when ranks poll each other.
// (ShmAllReduceTest covers counts around the fastbox's 48 bytes for every
// dtype and ReduceOp; the Gloo oracle tests the same ops through the
// process group.)
#include <cstring>
#include <string>
#include <vector>

#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/collectives_util.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives::shm {
namespace {

using ::testing::HasSubstr;

using Sync = CommOptions::Sync;

std::unique_ptr<Communicator> MustCreate(c10d::Store& store, int rank, int world,
                                         const std::string& job, Sync sync, bool fastbox) {
  CommOptions options;
  options.job_id = job;
  options.slot_bytes = 4096;
  options.num_slots = 2;
  options.sync = sync;
  options.fastbox = fastbox;
  return test_support::CreateShmComm(store, rank, world, options);
}

// Both ranks fail; the one that reads the other's layout first names both
// modes (its peer may then fail to map the segment the first one dropped).
TEST(FastboxTest, RanksThatDisagreeOnSyncOrFastboxFailSetup) {
  for (int which = 0; which < 2; ++which) {  // sync, fastbox
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = test_support::UniqueJob("fbsetup");
    absl::Status status[2];
    test_support::RunRankThreads(2, [&](int rank) {
      CommOptions options;
      options.job_id = job;
      options.setup_timeout = absl::Seconds(30);
      options.sync = which == 0 && rank == 1 ? Sync::kArrivals : Sync::kPollPeers;
      options.fastbox = !(which == 1 && rank == 1);
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          Communicator::Create(*store, rank, 2, options);
      status[rank] = comm.ok() ? absl::OkStatus() : comm.status();
    });
    int named = 0;
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_FALSE(status[rank].ok()) << "rank " << rank << " set up a group its peer disagrees with";
      if (status[rank].code() != absl::StatusCode::kInvalidArgument) continue;
      ++named;
      EXPECT_THAT(status[rank].message(), HasSubstr(which == 0 ? "arrivals" : "fastboxes off"));
      EXPECT_THAT(status[rank].message(), HasSubstr(absl::StrCat("rank ", 1 - rank)));
    }
    EXPECT_GE(named, 1) << status[0] << " / " << status[1];
  }
}

// Every small op kind, in each sync mode, fastboxes on and off: results as
// computed here (inputs rank * 10 + i).
TEST(FastboxTest, SmallOpsGiveTheReferenceInEveryMode) {
  constexpr int kWorld = 3;
  for (Sync sync : {Sync::kArrivals, Sync::kPollPeers}) {
    for (bool fastbox : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (sync == Sync::kArrivals ? "arrivals" : "poll")
                                        << (fastbox ? " + fastbox" : ""));
      auto store = c10::make_intrusive<c10d::HashStore>();
      const std::string job = test_support::UniqueJob("fbops");
      test_support::RunRankThreads(kWorld, [&](int rank) {
        std::unique_ptr<Communicator> comm = MustCreate(*store, rank, kWorld, job, sync, fastbox);
        ASSERT_NE(comm, nullptr);
        uint32_t seq = 0;
        for (int64_t count : {int64_t{1}, int64_t{4}, int64_t{12}, int64_t{13}}) {  // 48 B = 12 fp32
          auto spec = [&](const char* name, int64_t n) {
            return test_support::ShmOpSpec(++seq, name, DataType::kFloat32, n);
          };
          std::vector<float> v(count);  // [count]
          for (int64_t i = 0; i < count; ++i) v[i] = static_cast<float>(rank * 10 + i);
          ASSERT_TRUE(AllReduce(*comm, spec("allreduce", count), ReduceKind::kSum, v.data(),
                                32 << 10).ok());
          for (int64_t i = 0; i < count; ++i) EXPECT_EQ(v[i], 30 + 3 * i) << "allreduce " << i;

          std::vector<float> in(count), out(kWorld * count);  // [count], [kWorld * count]
          for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 10 + i);
          std::vector<void*> outs;
          for (int r = 0; r < kWorld; ++r) outs.push_back(out.data() + r * count);
          ASSERT_TRUE(AllGather(*comm, spec("allgather", count), in.data(), count * 4, outs).ok());
          for (int r = 0; r < kWorld; ++r) {
            for (int64_t i = 0; i < count; ++i) EXPECT_EQ(out[r * count + i], r * 10 + i);
          }

          std::vector<float> rs_in(kWorld * count), rs_out(count);  // [kWorld * count], [count]
          std::vector<const void*> inputs;
          for (int64_t i = 0; i < kWorld * count; ++i) rs_in[i] = static_cast<float>(rank + i);
          for (int r = 0; r < kWorld; ++r) inputs.push_back(rs_in.data() + r * count);
          ASSERT_TRUE(ReduceScatter(*comm, spec("reduce_scatter", count), ReduceKind::kSum,
                                    inputs, rs_out.data()).ok());
          for (int64_t i = 0; i < count; ++i) {
            EXPECT_EQ(rs_out[i], 3 + 3 * (rank * count + i)) << "reduce_scatter " << i;
          }

          std::vector<float> b(count, static_cast<float>(rank));  // [count]
          if (rank == 1) for (int64_t i = 0; i < count; ++i) b[i] = static_cast<float>(100 + i);
          ASSERT_TRUE(Broadcast(*comm, spec("broadcast", count), 1, b.data(), count * 4).ok());
          for (int64_t i = 0; i < count; ++i) EXPECT_EQ(b[i], 100 + i) << "broadcast " << i;

          ASSERT_TRUE(Barrier(*comm, spec("barrier", 0)).ok());
        }
      });
    }
  }
}

// Rank 0 calls `a`, rank 1 `b` (an all_reduce of `count_b` floats, or an
// all_gather): both fail naming both calls, in either sync mode.
TEST(FastboxTest, MismatchedSmallCallsFailOnEveryRank) {
  struct Pair {
    const char* what;
    int64_t count_b;
    bool b_gathers;
  };
  for (Sync sync : {Sync::kArrivals, Sync::kPollPeers}) {
    for (const Pair& p : {Pair{"both in fastboxes", 2, true},
                          Pair{"one in a fastbox", 100, false},
                          Pair{"same kind, other count", 3, false}}) {
      SCOPED_TRACE(::testing::Message() << p.what << (sync == Sync::kArrivals ? ", arrivals" : ", poll"));
      auto store = c10::make_intrusive<c10d::HashStore>();
      const std::string job = test_support::UniqueJob("fbmis");
      test_support::RunRankThreads(2, [&](int rank) {
        std::unique_ptr<Communicator> comm = MustCreate(*store, rank, 2, job, sync, true);
        ASSERT_NE(comm, nullptr);
        std::vector<float> v(200, 1.0f);  // [200]
        absl::Status s;
        if (rank == 0) {
          s = AllReduce(*comm, test_support::ShmOpSpec(1, "allreduce", DataType::kFloat32, 2),
                        ReduceKind::kSum, v.data(), 32 << 10);
        } else if (p.b_gathers) {
          std::vector<float> out(2 * p.count_b);  // [2 * count_b]
          std::vector<void*> outs = {out.data(), out.data() + p.count_b};
          s = AllGather(*comm,
                        test_support::ShmOpSpec(1, "allgather", DataType::kFloat32, p.count_b),
                        v.data(), p.count_b * 4, outs);
        } else {
          s = AllReduce(*comm,
                        test_support::ShmOpSpec(1, "allreduce", DataType::kFloat32, p.count_b),
                        ReduceKind::kSum, v.data(), 32 << 10);
        }
        ASSERT_FALSE(s.ok()) << "rank " << rank;
        EXPECT_THAT(s.message(), HasSubstr("mismatched collectives")) << rank;
        EXPECT_THAT(s.message(), HasSubstr("rank 0: allreduce #1 dtype=float32 shape=[2]")) << rank;
        EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(p.b_gathers ? "rank 1: allgather" : "rank 1: allreduce",
                                                        " #1 dtype=float32 shape=[", p.count_b, "]")))
            << rank;
      });
    }
  }
}

}  // namespace
}  // namespace tpudist::collectives::shm
