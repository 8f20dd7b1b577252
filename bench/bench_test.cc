// Unit tests of the benchmarks' pure math and report formatting, and of the
// forked-rank helper. The benchmarks themselves run as ctest smoke entries.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_math.h"
#include "bench/bench_report.h"
#include "bench/busy_load.h"
#include "bench/collectives_bench_flags.h"
#include "bench/flag_value.h"
#include "bench/proc_stats.h"
#include "bench/train_bench_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Our flags come out of argv; Google Benchmark's stay, in order.
TEST(CollectivesBenchFlagsTest, ParsesOursAndLeavesTheRest) {
  std::vector<std::string> args = {"bench", "--world=16", "--benchmark_filter=all_reduce",
                                   "--ops=all_reduce,broadcast", "--dtypes=fp32",
                                   "--hosts=2", "--rail_chunk_bytes=2097152",
                                   "--busy_threads_per_core=2", "--gloo=0", "--settle_ms=300",
                                   "--v=1"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  const CollectivesBenchFlags f = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_EQ(f.world, 16);
  EXPECT_THAT(f.ops, ElementsAre("all_reduce", "broadcast"));
  EXPECT_THAT(f.dtypes, ElementsAre("fp32"));
  EXPECT_EQ(f.hosts, 2);
  EXPECT_EQ(f.rail_chunk_bytes, 2097152);
  EXPECT_EQ(f.busy_per_core, 2);
  EXPECT_EQ(f.settle_ms, 300);
  EXPECT_FALSE(f.gloo);
  EXPECT_FALSE(f.quick);
  EXPECT_EQ(f.max_bytes, int64_t{64} << 20);
  ASSERT_EQ(argc, 3);
  EXPECT_STREQ(argv[0], "bench");
  EXPECT_STREQ(argv[1], "--benchmark_filter=all_reduce");
  EXPECT_STREQ(argv[2], "--v=1");
}

TEST(CollectivesBenchFlagsTest, QuickOverridesTheSizes) {
  std::vector<std::string> args = {"bench", "--max_bytes=1048576", "--quick",
                                   "--floor_rounds=500", "--settle_ms=3000"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  const CollectivesBenchFlags f = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_TRUE(f.quick);
  EXPECT_EQ(f.min_bytes, 8);
  EXPECT_EQ(f.max_bytes, 64 << 10);
  EXPECT_EQ(f.floor_rounds, 20);
  EXPECT_EQ(f.settle_ms, 50);
  EXPECT_EQ(argc, 1);
  std::vector<std::string> bad = {"bench", "--world=two"};
  std::vector<char*> bad_argv = {bad[0].data(), bad[1].data()};
  int bad_argc = 2;
  EXPECT_THROW(ParseCollectivesBenchFlags(&bad_argc, bad_argv.data()), std::invalid_argument);
}

// --flight_recorder=0 (the recorder's per-op cost, side by side); on by default.
TEST(CollectivesBenchFlagsTest, FlightRecorderOnUnlessTurnedOff) {
  std::vector<std::string> args = {"bench", "--flight_recorder=0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  EXPECT_FALSE(ParseCollectivesBenchFlags(&argc, argv.data()).flight_recorder);
  EXPECT_EQ(argc, 1);
  EXPECT_TRUE(ParseCollectivesBenchFlags(&argc, argv.data()).flight_recorder);
}

// --shm_sync= and --fastbox= (the shm protocol A/B); auto and on by
// default, and a mode that does not exist is an error.
TEST(CollectivesBenchFlagsTest, ShmSyncAndFastbox) {
  std::vector<std::string> args = {"bench", "--shm_sync=arrivals", "--fastbox=0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  const CollectivesBenchFlags f = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_EQ(f.shm_sync, "arrivals");
  EXPECT_FALSE(f.fastbox);
  EXPECT_EQ(argc, 1);
  const CollectivesBenchFlags d = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_EQ(d.shm_sync, "auto");
  EXPECT_TRUE(d.fastbox);
  std::vector<std::string> bad = {"bench", "--shm_sync=spin"};
  std::vector<char*> bad_argv;
  for (std::string& a : bad) bad_argv.push_back(a.data());
  int bad_argc = static_cast<int>(bad_argv.size());
  EXPECT_THROW(ParseCollectivesBenchFlags(&bad_argc, bad_argv.data()), std::invalid_argument);
}

// bench/peers/run.py's flags: exact sizes, an iteration cap, the median.
TEST(CollectivesBenchFlagsTest, SizesMaxItersAndMedian) {
  std::vector<std::string> args = {"bench", "--sizes=8,4096,16777216", "--max_iters=200",
                                   "--stat=median"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  const CollectivesBenchFlags f = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_THAT(f.sizes, ElementsAre(8, 4096, 16777216));
  EXPECT_EQ(f.max_iters, 200);
  EXPECT_TRUE(f.median);
  EXPECT_EQ(argc, 1);
  const CollectivesBenchFlags d = ParseCollectivesBenchFlags(&argc, argv.data());
  EXPECT_TRUE(d.sizes.empty());
  EXPECT_FALSE(d.median);
  std::vector<std::string> bad = {"bench", "--stat=mode"};
  std::vector<char*> bad_argv = {bad[0].data(), bad[1].data()};
  int bad_argc = 2;
  EXPECT_THROW(ParseCollectivesBenchFlags(&bad_argc, bad_argv.data()), std::invalid_argument);
}

// train_bench's flags come out of argv; Google Benchmark's stay. --quick
// wins over sizes given with it; rounds are clamped.
TEST(TrainBenchFlagsTest, ParsesOursAndLeavesTheRest) {
  std::vector<std::string> args = {"bench", "--world=4", "--benchmark_filter=fsdp", "--rounds=0",
                                   "--fsdp_dtype=bf16", "--fsdp_timers", "--seq=64", "--v=1"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  const TrainBenchFlags f = ParseTrainBenchFlags(&argc, argv.data());
  EXPECT_EQ(f.world, 4);
  EXPECT_EQ(f.rounds, 1);
  EXPECT_EQ(f.fsdp_dtype, "bf16");
  EXPECT_TRUE(f.fsdp_timers);
  EXPECT_EQ(f.seq, 64);
  EXPECT_EQ(f.warmup_rounds, 1);
  ASSERT_EQ(argc, 3);
  EXPECT_STREQ(argv[1], "--benchmark_filter=fsdp");
  EXPECT_STREQ(argv[2], "--v=1");
  std::vector<std::string> quick = {"bench", "--seq=512", "--quick"};
  std::vector<char*> qargv = {quick[0].data(), quick[1].data(), quick[2].data()};
  int qargc = 3;
  const TrainBenchFlags q = ParseTrainBenchFlags(&qargc, qargv.data());
  EXPECT_TRUE(q.quick);
  EXPECT_EQ(q.seq, 32);
  EXPECT_EQ(q.warmup_rounds, 0);
  EXPECT_EQ(qargc, 1);
  std::vector<std::string> bad = {"bench", "--steps=many"};
  std::vector<char*> bad_argv = {bad[0].data(), bad[1].data()};
  int bad_argc = 2;
  EXPECT_THROW(ParseTrainBenchFlags(&bad_argc, bad_argv.data()), std::invalid_argument);
}

// StripFlags keeps what `take` declines, in order, after argv[0].
TEST(FlagValueTest, StripFlagsKeepsTheRestInOrder) {
  std::vector<std::string> args = {"bin", "--a=1", "--keep", "--b=2", "--also_keep=x"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  std::vector<std::string> taken;
  StripFlags(&argc, argv.data(), [&](const std::string& a) {
    if (FlagValue(a, "--a=") == nullptr && FlagValue(a, "--b=") == nullptr) return false;
    taken.push_back(a);
    return true;
  });
  EXPECT_THAT(taken, ElementsAre("--a=1", "--b=2"));
  ASSERT_EQ(argc, 3);
  EXPECT_STREQ(argv[0], "bin");
  EXPECT_STREQ(argv[1], "--keep");
  EXPECT_STREQ(argv[2], "--also_keep=x");
  EXPECT_STREQ(FlagValue("--world=16", "--world="), "16");
  EXPECT_EQ(FlagValue("--worlds=16", "--world="), nullptr);
}

TEST(BenchMathTest, BusBwFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllReduce, 16), 2.0 * 15 / 16);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kBroadcast, 16), 1.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kMemcpy, 3), 1.0);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollectiveOp::kAllReduce, 1), 0.0);
}

TEST(BenchMathTest, Bandwidths) {
  EXPECT_DOUBLE_EQ(AlgBw(1 << 20, 0.5), 2.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(AlgBw(100, 0.0), 0.0);
  // 16 MiB all_reduce on 4 ranks in 10 ms: algBw 1.6777 GB/s, busBw x1.5.
  EXPECT_DOUBLE_EQ(BusBw(CollectiveOp::kAllReduce, 4, 16 << 20, 0.01), 1.5 * (16 << 20) / 0.01);
}

TEST(BenchMathTest, OpNamesRoundTrip) {
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                          CollectiveOp::kReduceScatter, CollectiveOp::kBroadcast,
                          CollectiveOp::kAllToAll, CollectiveOp::kMemcpy}) {
    EXPECT_EQ(ParseOp(OpName(op)), op);
  }
  EXPECT_EQ(ParseOp("allreduce"), std::nullopt);
}

TEST(BenchMathTest, SweepSizes) {
  EXPECT_THAT(SweepSizes(8, 64 << 20, 8),
              ElementsAre(8, 64, 512, 4096, 32768, 262144, 2 << 20, 16 << 20, 64 << 20));
  EXPECT_THAT(SweepSizes(8, 100, 4), ElementsAre(8, 32, 100));
  EXPECT_THAT(SweepSizes(5, 5, 2), ElementsAre(5));
}

TEST(BenchMathTest, RoundToWorld) {
  EXPECT_EQ(RoundToWorld(8, 16, 4), 64);         // at least one element per rank
  EXPECT_EQ(RoundToWorld(1000, 3, 4), 996);      // 83 elements per rank
  EXPECT_EQ(RoundToWorld(64 << 20, 16, 2), 64 << 20);
}

TEST(BenchMathTest, IterationsFor) {
  EXPECT_EQ(IterationsFor(8, 512 << 20, 5, 2000), 2000);
  EXPECT_EQ(IterationsFor(16 << 20, 512 << 20, 5, 2000), 32);
  EXPECT_EQ(IterationsFor(1 << 30, 512 << 20, 5, 2000), 5);
  EXPECT_EQ(IterationsFor(0, 10, 1, 3), 3);
}

TEST(BenchMathTest, SizeName) {
  EXPECT_EQ(SizeName(8), "8B");
  EXPECT_EQ(SizeName(4096), "4KiB");
  EXPECT_EQ(SizeName(64 << 20), "64MiB");
  EXPECT_EQ(SizeName(int64_t{1} << 30), "1GiB");
  EXPECT_EQ(SizeName(996), "996B");
  EXPECT_EQ(SizeName(3 << 10), "3KiB");
}

TEST(BenchMathTest, DecoderStepFlopsByHand) {
  // 6 * 1000 params * (2 * 4 tokens) = 48000; attention per layer
  // 12 * B2 * H3 * S4^2 * D: D=8 -> 9216, D=16 -> 18432.
  EXPECT_DOUBLE_EQ(DecoderStepFlops(1000, 2, 4, 3, {8, 16}), 48000.0 + 9216.0 + 18432.0);
  EXPECT_DOUBLE_EQ(DecoderStepFlops(10, 1, 1, 1, {}), 60.0);
}

TEST(BenchReportTest, DeriveAndJson) {
  CollectiveRow r;
  r.op = CollectiveOp::kAllReduce;
  r.dtype = "fp32";
  r.world = 2;
  r.bytes = 16 << 20;
  r.tpu_dist_s = 0.004;
  r.gloo_s = 0.016;
  r.memcpy_s = 0.002;
  const DerivedRow d = Derive(r);
  EXPECT_DOUBLE_EQ(d.alg_bw, (16 << 20) / 0.004);
  EXPECT_DOUBLE_EQ(d.bus_bw, d.alg_bw);  // factor 1 at world 2
  EXPECT_DOUBLE_EQ(d.speedup_vs_gloo, 4.0);
  EXPECT_DOUBLE_EQ(d.fraction_of_memcpy, 0.5);
  const nlohmann::json j = ToJson(r);
  EXPECT_EQ(j["op"], "all_reduce");
  EXPECT_EQ(j["bytes"], 16 << 20);
  EXPECT_DOUBLE_EQ(j["time_us"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(j["speedup_vs_gloo"].get<double>(), 4.0);
  r.gloo_s = -1;  // Gloo lacks the op
  EXPECT_TRUE(ToJson(r)["gloo_time_us"].is_null());
  EXPECT_DOUBLE_EQ(Derive(r).speedup_vs_gloo, 0.0);
}

TEST(BenchReportTest, TableHasOneLinePerRowAndDashWithoutGloo) {
  CollectiveRow a;
  a.op = CollectiveOp::kReduceScatter;
  a.dtype = "bf16";
  a.world = 4;
  a.bytes = 4096;
  a.tpu_dist_s = 1e-5;
  CollectiveRow b = a;
  b.op = CollectiveOp::kBroadcast;
  b.gloo_s = 2e-5;
  const std::string t = FormatTable({a, b});
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 3);
  EXPECT_THAT(t, HasSubstr("reduce_scatter bf16      4     4KiB |       10.00"));
  EXPECT_THAT(t, HasSubstr("2.0x"));
  EXPECT_THAT(t, HasSubstr("busBw"));
}

// The load really runs (one busy process per usable core and per_core) and
// Stop() leaves none behind, reaped (kill(pid, 0) then fails with ESRCH).
TEST(ForkedRanksTest, BusyLoadStartsAndStops) {
  absl::StatusOr<BusyLoad> load = BusyLoad::Start(1);
  ASSERT_TRUE(load.ok()) << load.status();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(load->processes(), CPU_COUNT(&set));
  const std::vector<pid_t> pids = load->pids();
  for (pid_t pid : pids) EXPECT_EQ(kill(pid, 0), 0) << pid;
  load->Stop();
  EXPECT_EQ(load->processes(), 0);
  for (pid_t pid : pids) EXPECT_NE(kill(pid, 0), 0) << pid;
  EXPECT_EQ(BusyLoad::Start(0)->processes(), 0);
}

// The load average parses /proc/loadavg; the process CPU time counts this
// thread's work.
TEST(ProcStatsTest, LoadAverageAndProcessCpuTime) {
  EXPECT_GE(LoadAverage(), 0.0);
  const double before = ProcessCpuSeconds();
  volatile double x = 0;
  for (int i = 0; i < 20000000; ++i) x = x + 1e-9 * i;
  EXPECT_GT(ProcessCpuSeconds() - before, 0.001);
}

}  // namespace
}  // namespace tpudist::bench
