// FlightRecorder's ring: bounded, oldest first, states, ids; torch's op names.
// The dump format is checked against torch's own analyzer in
// tests/python/test_flight_recorder.py.
#include "collectives/flight_recorder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace tpudist::collectives {
namespace {

FlightRecorder::Op AllReduce(uint64_t seq, int64_t n) {
  FlightRecorder::Op op;
  op.name = "all_reduce";
  op.collective_seq_id = seq;
  op.input_sizes = {{n}};
  op.output_sizes = {{n}};
  op.input_dtypes = {c10::kFloat};
  op.output_dtypes = {c10::kFloat};
  op.timeout_ms = 1000;
  return op;
}

FlightRecorder::Group TwoRanks() {
  FlightRecorder::Group g;
  g.name = "0";
  g.global_ranks = {0, 1};
  return g;
}

TEST(FlightRecorderTest, KeepsTheLastCapacityOpsOldestFirst) {
  FlightRecorder fr(3, TwoRanks());
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const uint64_t id = fr.Record(AllReduce(seq, static_cast<int64_t>(seq)));
    EXPECT_EQ(id, seq - 1);
  }
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].op.collective_seq_id, 3u);
  EXPECT_EQ(e[1].op.collective_seq_id, 4u);
  EXPECT_EQ(e[2].op.collective_seq_id, 5u);
  EXPECT_EQ(e[0].op_id, 2u);
  EXPECT_LT(e[0].record_id, e[1].record_id);
  EXPECT_LT(e[1].record_id, e[2].record_id);
  EXPECT_EQ(e[2].op.input_sizes, (std::vector<std::vector<int64_t>>{{5}}));
}

TEST(FlightRecorderTest, FewerOpsThanCapacity) {
  FlightRecorder fr(2000, TwoRanks());
  EXPECT_TRUE(fr.Entries().empty());
  fr.Record(AllReduce(1, 4));
  fr.Record(AllReduce(2, 4));
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].op.collective_seq_id, 1u);
  EXPECT_EQ(e[1].op.collective_seq_id, 2u);
}

TEST(FlightRecorderTest, StatesScheduledStartedCompleted) {
  FlightRecorder fr(4, TwoRanks());
  const uint64_t a = fr.Record(AllReduce(1, 4));
  const uint64_t b = fr.Record(AllReduce(2, 4));
  const uint64_t c = fr.Record(AllReduce(3, 4));
  fr.Started(a);
  fr.Finished(a, absl::OkStatus());
  fr.Started(b);
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  EXPECT_EQ(e[0].state, FlightRecorder::State::kCompleted);
  EXPECT_TRUE(e[0].retired);
  EXPECT_TRUE(e[0].time_started_ns.has_value());
  EXPECT_TRUE(e[0].time_completed_ns.has_value());
  EXPECT_GE(*e[0].time_completed_ns, *e[0].time_started_ns);
  EXPECT_GE(*e[0].time_started_ns, e[0].time_created_ns);
  EXPECT_EQ(e[1].state, FlightRecorder::State::kStarted);
  EXPECT_FALSE(e[1].retired);
  EXPECT_FALSE(e[1].time_completed_ns.has_value());
  EXPECT_EQ(e[2].state, FlightRecorder::State::kScheduled);
  EXPECT_FALSE(e[2].time_started_ns.has_value());
  FlightRecorder::Progress p = fr.progress();
  EXPECT_EQ(p.last_enqueued, 3);
  EXPECT_EQ(p.last_started, 2);
  EXPECT_EQ(p.last_completed, 1);
  (void)c;
}

// An op run inline is recorded as scheduled and started at one time.
TEST(FlightRecorderTest, RecordedAsStartedAtTheGivenTime) {
  FlightRecorder fr(4, TwoRanks());
  const int64_t t = 1'700'000'000'123'456'789;
  const uint64_t a = fr.RecordInPlace([](FlightRecorder::Op& op) { op = AllReduce(1, 4); }, t);
  const uint64_t b = fr.RecordInPlace([](FlightRecorder::Op& op) { op = AllReduce(2, 4); });
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].state, FlightRecorder::State::kStarted);
  EXPECT_EQ(e[0].time_created_ns, t);
  ASSERT_TRUE(e[0].time_started_ns.has_value());
  EXPECT_EQ(*e[0].time_started_ns, t);
  EXPECT_EQ(e[1].state, FlightRecorder::State::kScheduled);
  EXPECT_FALSE(e[1].time_started_ns.has_value());
  EXPECT_EQ(fr.progress().last_started, 1);
  EXPECT_EQ(fr.progress().last_enqueued, 2);
  fr.Finished(a, absl::OkStatus());
  EXPECT_EQ(fr.Entries()[0].state, FlightRecorder::State::kCompleted);
  (void)b;
}

TEST(FlightRecorderTest, AFailedOpStaysStartedWithItsError) {
  FlightRecorder fr(4, TwoRanks());
  const uint64_t a = fr.Record(AllReduce(1, 4));
  fr.Started(a);
  fr.Finished(a, absl::DeadlineExceededError("allreduce timed out after 1s"));
  const uint64_t b = fr.Record(AllReduce(2, 4));
  fr.Finished(b, absl::AbortedError("aborted"));  // never started: ran briefly
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  EXPECT_EQ(e[0].state, FlightRecorder::State::kStarted);
  EXPECT_TRUE(e[0].retired);
  EXPECT_FALSE(e[0].time_completed_ns.has_value());
  EXPECT_EQ(e[0].error, "allreduce timed out after 1s");
  EXPECT_EQ(e[1].state, FlightRecorder::State::kStarted);
  EXPECT_EQ(e[1].error, "aborted");
  EXPECT_EQ(fr.progress().last_completed, -1);
}

TEST(FlightRecorderTest, UpdatesOfOverwrittenOpsAreIgnored) {
  FlightRecorder fr(2, TwoRanks());
  const uint64_t old = fr.Record(AllReduce(1, 4));
  fr.Record(AllReduce(2, 4));
  const uint64_t last = fr.Record(AllReduce(3, 4));  // overwrites `old`'s slot
  fr.Started(old);
  fr.Finished(old, absl::OkStatus());
  fr.Finished(old + 100, absl::OkStatus());  // never recorded
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].op_id, last);
  EXPECT_EQ(e[1].state, FlightRecorder::State::kScheduled);
  EXPECT_EQ(e[0].state, FlightRecorder::State::kScheduled);
}

TEST(FlightRecorderTest, ConcurrentRecordersStayBoundedAndOrdered) {
  FlightRecorder fr(64, TwoRanks());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&fr] {
      for (int i = 0; i < 1000; ++i) {
        const uint64_t id = fr.Record(AllReduce(1, 1));
        fr.Started(id);
        fr.Finished(id, absl::OkStatus());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<FlightRecorder::Entry> e = fr.Entries();
  ASSERT_EQ(e.size(), 64u);
  for (size_t i = 1; i < e.size(); ++i) EXPECT_EQ(e[i].op_id, e[i - 1].op_id + 1);
  EXPECT_EQ(e.back().op_id, 3999u);
}

// The recorder's share of an op's cost (what ProcessGroupTpuDist adds per
// op: build the Op from the tensors' sizes, record, start, finish), printed
// for docs/fault_tolerance.md; no bound asserted (shared CI machines).
TEST(FlightRecorderTest, CostPerOp) {
  FlightRecorder fr(2000, TwoRanks());
  const at::Tensor t = at::ones({4});
  constexpr int kOps = 200000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) {
    FlightRecorder::Op op;
    op.name = "all_reduce";
    op.collective_seq_id = static_cast<uint64_t>(i);
    op.input_sizes.push_back(t.sizes().vec());
    op.input_dtypes.push_back(t.scalar_type());
    op.output_sizes.push_back(t.sizes().vec());
    op.output_dtypes.push_back(t.scalar_type());
    const uint64_t id = fr.Record(std::move(op));
    fr.Started(id);
    fr.Finished(id, absl::OkStatus());
  }
  const double ns = std::chrono::duration<double, std::nano>(
                        std::chrono::steady_clock::now() - start).count() / kOps;
  std::printf("flight recorder: %.0f ns per op (record + started + completed)\n", ns);
  EXPECT_EQ(fr.Entries().size(), 2000u);
}

TEST(FlightRecorderTest, RenameKeepsWhatIsNotGiven) {
  FlightRecorder fr(2, TwoRanks());
  fr.Rename("", "default_pg");
  EXPECT_EQ(fr.group().name, "0");
  EXPECT_EQ(fr.group().desc, "default_pg");
  fr.Rename("5", "");
  EXPECT_EQ(fr.group().name, "5");
  EXPECT_EQ(fr.group().desc, "default_pg");
}

TEST(FlightRecorderTest, TorchOpNames) {
  // torch/distributed/flight_recorder/components/types.py COLLECTIVES.
  EXPECT_EQ(TorchOpName("allreduce"), "all_reduce");
  EXPECT_EQ(TorchOpName("allgather"), "all_gather");
  EXPECT_EQ(TorchOpName("_allgather_base"), "_all_gather_base");
  EXPECT_EQ(TorchOpName("_reduce_scatter_base"), "_reduce_scatter_base");
  EXPECT_EQ(TorchOpName("alltoall_base"), "all_to_all_single");
  EXPECT_EQ(TorchOpName("alltoall"), "all_to_all");
  EXPECT_EQ(TorchOpName("broadcast"), "broadcast");
  EXPECT_EQ(TorchOpName("barrier"), "barrier");
}

}  // namespace
}  // namespace tpudist::collectives
