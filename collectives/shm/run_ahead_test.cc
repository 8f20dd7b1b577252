// Phases that run ahead (phases.h: RunPhasesAhead, AgreedLead), as the shm
// ops take them next to a busy load (CommOptions::assume_foreign_load): a
// fast rank gets ahead of a slow reader by the agreed lead and no further,
// never writes over a slot a peer has not read, and leaves the lock-step
// protocol intact for the next op; and the ops that use them (all_reduce's
// pipelined path, reduce_scatter, all_gather, all_to_all, reduce, gather,
// scatter) give the reference results with a rank that lags at every op.
// Ranks are threads over a HashStore.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "collectives/shm/phases.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives::shm {
namespace {

OpSpec Spec(uint32_t seq, const char* name, DataType type, int64_t count) {
  return test_support::ShmOpSpec(seq, name, type, count);
}

std::unique_ptr<Communicator> Create(c10d::Store& store, const std::string& job, int rank, int world,
                                     int64_t slot_bytes, int slots, bool load) {
  CommOptions options;
  options.job_id = job;
  options.slot_bytes = slot_bytes;
  options.num_slots = slots;
  options.assume_foreign_load = load;
  options.setup_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Create(store, rank, world, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

char Pattern(int rank, int64_t phase, int64_t i) { return static_cast<char>(rank * 31 + phase * 7 + i); }

// Rank 1 sleeps in every read; rank 0 records, at each write, how far it is
// ahead of rank 1's reads. Lead L: rank 0 writes phase w after reading w - L,
// which rank 1 published after reading w - 2L, so the gap is at most 2L - 1;
// lock-step (L = 1) keeps it at 1. Every read checks every peer's slot holds
// that peer's data of the phase read (a slot overwritten early fails it).
TEST(RunAheadTest, FastRankGetsAheadOfASlowReaderByTheLeadAndNoFurther) {
  constexpr int64_t kPhases = 40;
  constexpr int64_t kSlotBytes = 256;
  for (int slots : {2, 3, 4, 8}) {
    for (bool load : {false, true}) {
      SCOPED_TRACE(::testing::Message() << slots << " slots" << (load ? ", foreign load" : ", idle"));
      const int lead = load && slots >= 4 ? slots / 2 : 1;
      auto store = c10::make_intrusive<c10d::HashStore>();
      const std::string job = test_support::UniqueJob("shmahead");
      std::atomic<int64_t> reads_done[2] = {0, 0};
      std::atomic<int64_t> max_gap{0};
      std::atomic<int64_t> bad{0};
      test_support::RunRankThreads(2, [&](int rank) {
        std::unique_ptr<Communicator> comm = Create(*store, job, rank, 2, kSlotBytes, slots, load);
        ASSERT_NE(comm, nullptr);
        for (uint32_t round = 1; round <= 2; ++round) {
          const OpSpec spec = Spec(2 * round, "custom", DataType::kUInt8, 0);
          const absl::Status s = internal::RunPhases(
              *comm, spec, MakeHeader(spec, OpKind::kAllgather, ReduceKind{}, -1, true), kPhases,
              [&](int64_t i, void* slot) {
                if (rank == 0 && round == 1) {
                  const int64_t gap = i - reads_done[1].load();
                  int64_t seen = max_gap.load();
                  while (gap > seen && !max_gap.compare_exchange_weak(seen, gap)) {
                  }
                }
                for (int64_t b = 0; b < kSlotBytes; ++b) static_cast<char*>(slot)[b] = Pattern(rank, i, b);
              },
              [&](int64_t i) {
                if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                for (int r = 0; r < 2; ++r) {
                  const char* p = static_cast<const char*>(comm->peer_data(r));
                  for (int64_t b = 0; b < kSlotBytes; ++b) bad += p[b] != Pattern(r, i, b);
                }
                if (round == 1) reads_done[rank] = i + 1;
                return absl::OkStatus();
              });
          ASSERT_TRUE(s.ok()) << s;
          // A lock-step op right after: the slot protocol must be intact.
          ASSERT_TRUE(Barrier(*comm, Spec(2 * round + 1, "barrier", DataType::kUInt8, 0)).ok());
        }
      });
      EXPECT_EQ(bad.load(), 0);
      EXPECT_LE(max_gap.load(), 2 * lead - 1);
      if (lead > 1) EXPECT_GE(max_gap.load(), lead) << "rank 0 never ran ahead";
    }
  }
}

void Fill(std::vector<float>& v, int rank, int salt) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank * 5 + salt + static_cast<int64_t>(i) * 3) % 17);
}

// Each op next to a (pretended) foreign load, 8 slots of 1 KiB (lead 4),
// many phases with a ragged last one; the last rank enters every op late.
TEST(RunAheadTest, OpsMatchTheReferenceWithALaggingRank) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = test_support::UniqueJob("shmaheadops");
    test_support::RunRankThreads(world, [&](int rank) {
      std::unique_ptr<Communicator> comm = Create(*store, job, rank, world, 1024, 8, true);
      ASSERT_NE(comm, nullptr);
      uint32_t seq = 0;
      auto lag = [&] {
        if (rank == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      };
      const int64_t n = 5 * 1024 + 37;  // elements per rank: ~20 KiB of fp32
      std::vector<std::vector<float>> in(world, std::vector<float>(n));  // [world][n]
      for (int r = 0; r < world; ++r) Fill(in[r], r, 0);
      // all_reduce (pipelined) and reduce to rank 1 % world.
      for (int root : {-1, 1 % world}) {
        std::vector<float> buf = in[rank];
        lag();
        const absl::Status s =
            root < 0 ? AllReduce(*comm, Spec(++seq, "allreduce", DataType::kFloat32, n), ReduceKind::kSum,
                                 buf.data(), /*small_bytes=*/0)
                     : Reduce(*comm, Spec(++seq, "reduce", DataType::kFloat32, n), ReduceKind::kSum, root,
                              buf.data());
        ASSERT_TRUE(s.ok()) << s;
        if (root >= 0 && rank != root) continue;
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int r = 0; r < world; ++r) want += in[r][i];
          bad += buf[i] != want;
        }
        EXPECT_EQ(bad, 0) << (root < 0 ? "all_reduce" : "reduce") << " rank " << rank;
      }
      // reduce_scatter: rank r's inputs[j] is block j of [world * n].
      {
        std::vector<float> all(world * n);  // [world, n]
        for (int j = 0; j < world; ++j) {
          std::vector<float> b(n);
          Fill(b, rank, j + 1);
          std::copy(b.begin(), b.end(), all.begin() + j * n);
        }
        std::vector<const void*> inputs(world);
        for (int j = 0; j < world; ++j) inputs[j] = all.data() + j * n;
        std::vector<float> out(n);
        lag();
        ASSERT_TRUE(ReduceScatter(*comm, Spec(++seq, "reduce_scatter", DataType::kFloat32, n), ReduceKind::kMax,
                                  inputs, out.data())
                        .ok());
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          float want = -1;
          for (int r = 0; r < world; ++r) {
            std::vector<float> b(n);
            Fill(b, r, rank + 1);
            want = std::max(want, b[i]);
          }
          bad += out[i] != want;
        }
        EXPECT_EQ(bad, 0) << "reduce_scatter rank " << rank;
      }
      // all_gather and gather to the last rank.
      for (int root : {-1, world - 1}) {
        std::vector<std::vector<float>> got(world, std::vector<float>(n, -1));
        std::vector<void*> outs(world);
        for (int r = 0; r < world; ++r) outs[r] = got[r].data();
        lag();
        const int64_t bytes = n * 4;
        const absl::Status s =
            root < 0 ? AllGather(*comm, Spec(++seq, "allgather", DataType::kUInt8, bytes), in[rank].data(), bytes, outs)
                     : Gather(*comm, Spec(++seq, "gather", DataType::kUInt8, bytes), root, in[rank].data(), bytes, outs);
        ASSERT_TRUE(s.ok()) << s;
        if (root >= 0 && rank != root) continue;
        for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], in[r]) << "from rank " << r << " at rank " << rank;
      }
      // scatter from rank 0: rank r gets in[r].
      {
        std::vector<const void*> ins(world);
        for (int r = 0; r < world; ++r) ins[r] = in[r].data();
        std::vector<float> out(n, -1);
        lag();
        ASSERT_TRUE(Scatter(*comm, Spec(++seq, "scatter", DataType::kUInt8, n * 4), 0, ins, out.data(), n * 4).ok());
        EXPECT_EQ(out, in[rank]) << "scatter rank " << rank;
      }
      // all_to_all with uneven blocks: src sends (src + dst + 1) * 3000 + 5 bytes to dst.
      {
        auto bytes = [](int src, int dst) { return int64_t{(src + dst + 1) * 3000 + 5}; };
        auto value = [](int src, int dst, int64_t i) { return static_cast<char>(src * 13 + dst * 7 + i); };
        const test_support::AllToAllBuffers b = test_support::MakeAllToAllBuffers(world, rank, bytes, value);
        lag();
        ASSERT_TRUE(AllToAll(*comm, Spec(++seq, "alltoall", DataType::kUInt8, 0), b.ins, b.in_bytes, b.outs,
                             b.out_bytes)
                        .ok());
        for (int src = 0; src < world; ++src) {
          EXPECT_EQ(b.Mismatches(rank, src, value), 0) << "all_to_all from " << src << " at rank " << rank;
        }
      }
      ASSERT_TRUE(Barrier(*comm, Spec(++seq, "barrier", DataType::kUInt8, 0)).ok());
    });
  }
}

}  // namespace
}  // namespace tpudist::collectives::shm
