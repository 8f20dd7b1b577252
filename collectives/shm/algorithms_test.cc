// shm::AllReduce on ranks as threads over a HashStore, both paths (one-shot
// and the pipelined one-phase-per-chunk reduce-scatter + all-gather), against
// a reference computed here in double in rank order: world sizes 1, 2, 3 and
// 16 (16 with the oversubscribed wait policy and slot count), element counts
// 0, 1, a prime, and several chunks with a ragged last one, fp32 / bf16 /
// int32 / fp64, every ReduceOp defined for the type. Inputs are small
// integers (products of +-1 and 2), so every reduction order gives exact
// results except AVG, which is compared to 1 ulp of the type. The Gloo
// oracle tests (process_group_gloo_oracle_test.cc) check the same ops through
// the process group against Gloo. shm::ReduceScatter with its output apart
// from and equal to the rank's own block, against the same reference;
// shm::AllToAll's blocks over several phases; shm::Broadcast's streamed
// chunks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/core/reduce_kernels.h"
#include "collectives/core/stream_copy.h"
#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "collectives/shm/phases.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives::shm {
namespace {

// Element i of rank r's input for `kind`: small integers ([-4, 4]; +-1 or 2
// for PRODUCT; a byte pattern for the bitwise ops).
int64_t InputValue(ReduceKind kind, int rank, int64_t i) {
  switch (kind) {
    case ReduceKind::kProduct: {
      const int64_t k = (rank + i) % 3;
      return k == 0 ? -1 : (k == 1 ? 1 : 2);
    }
    case ReduceKind::kBand:
    case ReduceKind::kBor:
    case ReduceKind::kBxor:
      return (rank * 37 + i * 11) & 0xff;
    default:
      return (rank * 7 + i * 3) % 9 - 4;
  }
}

void Store(DataType t, void* p, int64_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToBFloat16Bits(static_cast<float>(v));
      break;
    default: FAIL() << "type not used here";
  }
}

double Load(DataType t, const void* p, int64_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kBFloat16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
    default: return NAN;
  }
}

double Expected(ReduceKind kind, int world, int64_t i) {
  int64_t acc = InputValue(kind, 0, i);
  for (int r = 1; r < world; ++r) {
    const int64_t v = InputValue(kind, r, i);
    switch (kind) {
      case ReduceKind::kSum: case ReduceKind::kAvg: acc += v; break;
      case ReduceKind::kProduct: acc *= v; break;
      case ReduceKind::kMin: acc = std::min(acc, v); break;
      case ReduceKind::kMax: acc = std::max(acc, v); break;
      case ReduceKind::kBand: acc &= v; break;
      case ReduceKind::kBor: acc |= v; break;
      case ReduceKind::kBxor: acc ^= v; break;
    }
  }
  return kind == ReduceKind::kAvg ? static_cast<double>(acc) / world : static_cast<double>(acc);
}

// The spec of an all_reduce of [count] elements of `type`, 60 s timeout.
OpSpec AllReduceSpec(uint32_t seq, DataType type, int64_t count) {
  return test_support::ShmOpSpec(seq, "allreduce", type, count);
}

struct Case {
  int world;
  int64_t slot_bytes;
  bool oversubscribed;  // the wait policy and slot count of ranks > cores
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "world " << c.world << ", slot " << c.slot_bytes << (c.oversubscribed ? ", oversubscribed" : "");
}

class ShmAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShmAllReduceTest, MatchesTheReferenceOnEveryRank) {
  const Case param = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmar");
  const std::vector<ReduceKind> all = {ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kProduct,
                                       ReduceKind::kMin, ReduceKind::kMax, ReduceKind::kBand,
                                       ReduceKind::kBor, ReduceKind::kBxor};
  const std::vector<DataType> types = {DataType::kFloat32, DataType::kBFloat16,
                                       DataType::kInt32, DataType::kFloat64};
  test_support::RunRankThreads(param.world, [&](int rank) {
    CommOptions options;
    options.job_id = job;
    options.slot_bytes = param.slot_bytes;
    options.num_slots = 2;
    options.wait = ChooseWaitPolicy(param.world, param.oversubscribed ? 1 : param.world);
    options.setup_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Create(*store, rank, param.world, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    uint32_t seq = 0;
    for (DataType type : types) {
      const int64_t es = static_cast<int64_t>(ElementSize(type));
      // Several pipelined chunks plus a ragged one (prime); with this slot.
      const int64_t many = 3 * param.slot_bytes / es + 7;
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{12}, int64_t{37}, many}) {  // 12 fp32: a full fastbox
        for (ReduceKind kind : all) {
          if (!CheckReducible(type, kind).ok()) continue;
          for (int64_t small_bytes : {int64_t{-1}, int64_t{1} << 40}) {  // pipelined, one-shot
            SCOPED_TRACE(::testing::Message()
                         << DataTypeName(type) << " " << ReduceKindName(kind) << " count "
                         << count << (small_bytes < 0 ? " pipelined" : " one-shot")
                         << " rank " << rank);
            std::vector<char> buf(count * es + 1);  // [count] of type
            for (int64_t i = 0; i < count; ++i) Store(type, buf.data(), i, InputValue(kind, rank, i));
            const absl::Status s =
                AllReduce(**comm, AllReduceSpec(++seq, type, count), kind, buf.data(), small_bytes);
            ASSERT_TRUE(s.ok()) << s;
            int bad = 0;
            for (int64_t i = 0; i < count && bad < 3; ++i) {
              const double want = Expected(kind, param.world, i);
              const double got = Load(type, buf.data(), i);
              const double tol = kind != ReduceKind::kAvg ? 0
                                 : type == DataType::kBFloat16 ? std::abs(want) / 128 + 1e-30
                                 : type == DataType::kFloat32 ? std::abs(want) * 2e-7 : 1e-12;
              if (std::abs(got - want) > tol) {
                ++bad;
                ADD_FAILURE() << "element " << i << " of " << count << ": got " << got
                              << ", want " << want;
              }
            }
          }
        }
      }
    }
  });
}

// A result of >= kStreamCopyMinBytes is copied out with streaming stores
// (stream_copy.h); a ragged count over many pipelined chunks, fp32 and bf16.
TEST(ShmAllReduceLargeTest, StreamedResultMatchesTheReference) {
  constexpr int kWorld = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmarl");
  test_support::RunRankThreads(kWorld, [&](int rank) {
    CommOptions options;
    options.job_id = job;
    options.slot_bytes = 64 << 10;
    options.num_slots = 2;
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Create(*store, rank, kWorld, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    uint32_t seq = 0;
    for (DataType type : {DataType::kFloat32, DataType::kBFloat16}) {
      const int64_t es = static_cast<int64_t>(ElementSize(type));
      const int64_t count = kStreamCopyMinBytes / es + 13;
      ASSERT_TRUE(UseStreamCopy(count * es));
      for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMax}) {
        std::vector<char> buf(count * es);  // [count] of type
        for (int64_t i = 0; i < count; ++i) Store(type, buf.data(), i, InputValue(kind, rank, i));
        ASSERT_TRUE(AllReduce(**comm, AllReduceSpec(++seq, type, count), kind, buf.data(),
                              /*small_bytes=*/0)
                        .ok());
        int64_t bad = 0;
        for (int64_t i = 0; i < count; ++i) bad += Load(type, buf.data(), i) != Expected(kind, kWorld, i);
        EXPECT_EQ(bad, 0) << DataTypeName(type) << " " << ReduceKindName(kind) << " rank " << rank;
      }
    }
  });
}

// shm::ReduceScatter reads a rank's own block in place (not through its
// slot): the output in a buffer of its own and the output being the own
// block (in place); several chunks each.
TEST(ShmReduceScatterTest, OwnBlockInPlaceMatchesTheReference) {
  constexpr int kWorld = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmrs");
  test_support::RunRankThreads(kWorld, [&](int rank) {
    CommOptions options;
    options.job_id = job;
    options.slot_bytes = 4096;
    options.num_slots = 2;
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Create(*store, rank, kWorld, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    uint32_t seq = 0;
    for (DataType type : {DataType::kFloat32, DataType::kInt32}) {
      const int64_t es = static_cast<int64_t>(ElementSize(type));
      const int64_t count = 3 * options.slot_bytes / es + 7;  // several chunks, ragged
      for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMax}) {
        for (int placement = 0; placement < 2; ++placement) {  // separate, in place
          SCOPED_TRACE(::testing::Message() << DataTypeName(type) << " " << ReduceKindName(kind)
                                            << " placement " << placement << " rank " << rank);
          std::vector<char> buf(kWorld * count * es);  // [kWorld, count] of type
          std::vector<char> separate(count * es);  // [count] of type
          std::vector<const void*> inputs(kWorld);
          for (int j = 0; j < kWorld; ++j) {
            inputs[j] = buf.data() + j * count * es;
            for (int64_t i = 0; i < count; ++i) {
              Store(type, buf.data(), j * count + i, InputValue(kind, rank, j * count + i));
            }
          }
          char* out = placement == 0 ? separate.data() : buf.data() + rank * count * es;
          OpSpec spec = AllReduceSpec(++seq, type, count);
          spec.ctx.name = "reduce_scatter";
          const absl::Status s = ReduceScatter(**comm, spec, kind, inputs, out);
          ASSERT_TRUE(s.ok()) << s;
          int64_t bad = 0;
          for (int64_t i = 0; i < count; ++i) {
            bad += Load(type, out, i) != Expected(kind, kWorld, rank * count + i);
          }
          EXPECT_EQ(bad, 0) << "of " << count << " elements";
        }
      }
    }
  });
}

// shm::AllToAll with uneven byte counts per (src, dst) pair, several phases
// of a small slot, zero-byte pairs, and a round where only the own block is
// non-empty: every rank receives exactly each source's block for it, and
// the own block arrives although it takes no slot space.
TEST(ShmAllToAllTest, UnevenBlocksOverSeveralPhasesArriveIntact) {
  for (int world : {1, 2, 3, 4}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = test_support::UniqueJob("shma2a");
    test_support::RunRankThreads(world, [&](int rank) {
      CommOptions options;
      options.job_id = job;
      options.slot_bytes = 64 * 4 * 4;  // 1 KiB: 256..1024 B per pair and phase
      options.num_slots = 2;
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          Communicator::Create(*store, rank, world, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      for (int round = 0; round < 2; ++round) {
        // Bytes rank src sends to rank dst; round 1: only the own block.
        auto bytes = [&](int src, int dst) -> int64_t {
          if (round == 1) return src == dst ? 5000 : 0;
          return (src * 5 + dst * 3) % 4 == 0 ? 0 : 97 * (src + 2 * dst + 1) + (src == dst ? 2100 : 0);
        };
        auto value = [](int src, int dst, int64_t i) { return static_cast<char>(src * 31 + dst * 7 + i * 13); };
        const test_support::AllToAllBuffers b = test_support::MakeAllToAllBuffers(world, rank, bytes, value);
        OpSpec spec = AllReduceSpec(round + 1, DataType::kUInt8, 0);
        spec.ctx.name = "alltoall";
        const absl::Status s = AllToAll(**comm, spec, b.ins, b.in_bytes, b.outs, b.out_bytes);
        ASSERT_TRUE(s.ok()) << s;
        for (int src = 0; src < world; ++src) {
          EXPECT_EQ(b.Mismatches(rank, src, value), 0)
              << "world " << world << " round " << round << ": rank " << rank << " from " << src << ", "
              << b.out_bytes[src] << " bytes (or the guard byte after them)";
        }
      }
    });
  }
}

// shm::Broadcast, streamed (chunks 1.. without a barrier per chunk, as next
// to a busy load) and lock-step: many chunks of a small slot, 2 and 3 slots (the root waits for readers before
// reusing a slot), every root in turn, a reader that sleeps now and then
// (the root fills the ring and waits), and an all_reduce between broadcasts
// (the closing barrier must leave the lock-step protocol intact).
TEST(ShmBroadcastTest, StreamedChunksArriveIntactFromEveryRoot) {
  for (int world : {1, 2, 3, 4}) {
    for (int slots : {2, 3}) {
      for (bool stream : {true, false}) {
        auto store = c10::make_intrusive<c10d::HashStore>();
        const std::string job = test_support::UniqueJob("shmbc");
        test_support::RunRankThreads(world, [&](int rank) {
          CommOptions options;
          options.job_id = job;
          options.slot_bytes = 1024;
          options.num_slots = slots;
          options.assume_foreign_load = stream;
          absl::StatusOr<std::unique_ptr<Communicator>> comm =
              Communicator::Create(*store, rank, world, options);
          ASSERT_TRUE(comm.ok()) << comm.status();
          uint32_t seq = 0;
          for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1024}, int64_t{1025}, int64_t{9 * 1024 + 13}}) {
            for (int root = 0; root < world; ++root) {
              auto value = [&](int64_t i) { return static_cast<char>(root * 29 + i * 7 + bytes); };
              std::vector<char> buf(bytes + 1, 0);  // [bytes] + a guard byte
              if (rank == root) {
                for (int64_t i = 0; i < bytes; ++i) buf[i] = value(i);
              }
              if (rank == (root + 1) % world && bytes > 4096 && root % 2 == 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a late reader
              }
              OpSpec spec = AllReduceSpec(++seq, DataType::kUInt8, bytes);
              spec.ctx.name = "broadcast";
              const absl::Status s = Broadcast(**comm, spec, root, buf.data(), bytes);
              ASSERT_TRUE(s.ok()) << s;
              int64_t bad = 0;
              for (int64_t i = 0; i < bytes; ++i) bad += buf[i] != value(i);
              EXPECT_EQ(bad, 0) << "world " << world << " slots " << slots << (stream ? " streamed" : " lock-step")
                                << " root " << root << " rank " << rank << ", " << bytes << " bytes";
              EXPECT_EQ(buf[bytes], 0) << "wrote past the end";
              std::vector<char> sum(4 * 300);  // [300] fp32: a lock-step op in between
              for (int i = 0; i < 300; ++i) Store(DataType::kFloat32, sum.data(), i, rank + i);
              ASSERT_TRUE(AllReduce(**comm, AllReduceSpec(++seq, DataType::kFloat32, 300), ReduceKind::kSum,
                                    sum.data(), /*small_bytes=*/-1)
                              .ok());
              for (int i = 0; i < 300; ++i) {
                ASSERT_EQ(Load(DataType::kFloat32, sum.data(), i), world * (world - 1) / 2 + world * i) << i;
              }
            }
          }
        });
      }
    }
  }
}

// The receiving half of a 2-rank broadcast from rank 0, written out from
// communicator.h's streaming contract, sleeping before each chunk: a reader
// that is descheduled mid-stream.
absl::Status SlowReader(Communicator& comm, const OpSpec& spec, char* data, int64_t bytes) {
  const int64_t chunk = comm.slot_bytes();
  OpHeader header = MakeHeader(spec, OpKind::kBroadcast, ReduceKind{}, 0, true);
  header.saw_foreign_load = 1;  // every rank then streams
  absl::Status s = internal::RunPhases(
      comm, spec, header, 1, [](int64_t, void*) {},
      [&](int64_t) {
        std::memcpy(data, comm.peer_data(0), std::min(bytes, chunk));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  const uint64_t base = comm.phase();
  for (int64_t i = 1; i * chunk < bytes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (absl::Status w = comm.WaitPeerPublished(0, base + i, spec.ctx); !w.ok()) return w;
    std::memcpy(data + i * chunk, comm.peer_data_next(0), std::min(chunk, bytes - i * chunk));
    if (absl::Status p = comm.PublishNext(spec.ctx); !p.ok()) return p;
  }
  return comm.WaitAllPublished(spec.ctx);
}

// The streaming root must not write over a slot its reader has not read:
// against a reader that lags, every chunk still arrives intact.
TEST(ShmBroadcastTest, RootWaitsForALaggingReader) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmbcslow");
  constexpr int64_t kBytes = 12 * 1024 + 5;  // 13 chunks of 1 KiB
  test_support::RunRankThreads(2, [&](int rank) {
    CommOptions options;
    options.job_id = job;
    options.slot_bytes = 1024;
    options.num_slots = 2;
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Create(*store, rank, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<char> buf(kBytes, 0);  // [kBytes]
    if (rank == 0) {
      for (int64_t i = 0; i < kBytes; ++i) buf[i] = static_cast<char>(i * 13 + i / 1024);
    }
    OpSpec spec = AllReduceSpec(1, DataType::kUInt8, kBytes);
    spec.ctx.name = "broadcast";
    const absl::Status s =
        rank == 0 ? Broadcast(**comm, spec, 0, buf.data(), kBytes) : SlowReader(**comm, spec, buf.data(), kBytes);
    ASSERT_TRUE(s.ok()) << s;
    int64_t bad = 0;
    for (int64_t i = 0; i < kBytes; ++i) bad += buf[i] != static_cast<char>(i * 13 + i / 1024);
    EXPECT_EQ(bad, 0) << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ShmAllReduceTest,
    ::testing::Values(Case{1, 256, false}, Case{2, 256, false}, Case{3, 4096, false},
                      Case{3, 4100, true}, Case{16, 4096, true}, Case{16, 8192, false}),
    [](const auto& info) {
      return "w" + std::to_string(info.param.world) + "_slot" +
             std::to_string(info.param.slot_bytes) +
             (info.param.oversubscribed ? "_oversubscribed" : "");
    });

}  // namespace
}  // namespace tpudist::collectives::shm
