// Collective latency / bandwidth of the tpu_dist process group, side by side
// with Gloo on the same ranks, and the memcpy of the same bytes measured in
// the same run as the memory-bound limit.
//
// One run forks --world ranks over a FileStore; every rank registers the
// same Google Benchmark cases with fixed iteration counts so that the
// collectives line up, and only rank 0 reports: Google Benchmark's console
// output, then a table (bench_report.h) with time, algBw, busBw (nccl-tests
// conventions, bench_math.h), Gloo's time and busBw, the Gloo/tpu_dist
// speedup and the fraction of the memcpy limit; then the goals as
// measured (never asserted; with --hosts > 1 also the cross-host goal and
// the loopback TCP bandwidth as its limit); --json_out writes the rows as JSON.
//
// Ops: all_reduce (SUM), all_gather (_allgather_base; Gloo: allgather into
// views of the output), reduce_scatter (_reduce_scatter_base; Gloo:
// reduce_scatter from views of the input, if it has one), broadcast (root 0), all_to_all (alltoall_base,
// even splits). After start-up the group settles (--settle_ms of 8-byte
// all_reduces, bench/collective_case.h SettleGroup), then each case: barrier,
// one warm-up op, barrier, timed loop.
// An (op, dtype) that Gloo rejects on a probe at start-up is shown as "-".
//
//   collectives_bench                          # world 2, 8 B .. 64 MiB, fp32+bf16
//   collectives_bench --world=16 --json_out=w16.json
//   collectives_bench --quick                  # seconds (ctest smoke); --smoke = --quick
//   collectives_bench --ops=all_reduce --dtypes=fp32 --min_bytes=8 --max_bytes=16777216
//   collectives_bench --gloo=0 | --gloo_max_bytes=N   # skip Gloo (above N)
//   collectives_bench --slot_bytes=N --slots=K --spin=N --yield=M  # shm experiments
//   collectives_bench --adaptive_yield=0 --slow_yield_us=N --slow_stages=K --yield_backoff_ms=M
//                                              # plain yields / adaptive thresholds
//   collectives_bench --floor_rounds=N         # bare futex barriers timed (latency floor)
//   collectives_bench --settle_ms=N            # settling ops before the first case (1500)
//   collectives_bench --sizes=8,4096,1048576 --max_iters=200 --stat=median
//                                              # exact sizes, at most 200 timed ops, the
//                                              # median of per-op times (bench/peers/run.py)
//   collectives_bench --flight_recorder=0      # groups without a flight recorder (its cost)
//   collectives_bench --shm_sync=arrivals|poll --fastbox=0|1  # the shm sync and fastbox, A/B
//   collectives_bench --busy_threads_per_core=2  # with a competing load that the
//                                              # bench starts and stops itself
//   collectives_bench --world=4 --hosts=2      # 2 emulated hosts x 2 ranks (host id
//                                              # per rank, as TPU_DIST_HOST_ID): shm
//                                              # inside a host, TCP between hosts
//   collectives_bench --world=4 --hosts=2 --multi_rail_min_bytes=1099511627776
//                                              # leaders path only (no multi-rail)
//   collectives_bench --world=4 --hosts=2 --rail_chunk_bytes=N  # multi-rail chunk size
//   tools/bench.sh                             # all worlds, table + JSON
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/bench_math.h"
#include "bench/bench_report.h"
#include "bench/busy_load.h"
#include "bench/collective_case.h"
#include "bench/collectives_bench_flags.h"
#include "bench/futex_barrier.h"
#include "bench/proc_stats.h"
#include "bench/tcp_loopback.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/shm/wait.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace {

using tpudist::bench::LoadAverage;
using tpudist::bench::ProcessCpuSeconds;

namespace tb = tpudist::bench;
using tb::Buffers;
using tb::CollectiveOp;
using tb::MakeBuffers;
using tb::RunOp;
using tb::WaitedBarrier;
using tpudist::collectives::ProcessGroupTpuDist;
using Clock = std::chrono::steady_clock;

using Flags = tb::CollectivesBenchFlags;

// Everything one rank needs; owned by main, captured by the benchmarks.
struct Env {
  Flags flags;
  int rank = 0;
  c10::intrusive_ptr<ProcessGroupTpuDist> ours;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::set<std::pair<CollectiveOp, std::string>> gloo_ok;  // probed (op, dtype)
  std::map<std::string, double> seconds;                   // by benchmark name
  std::map<std::string, double> cpu_seconds;  // this rank's process CPU per op, by name
};

at::ScalarType DType(const std::string& name) {
  return name == "bf16" ? at::kBFloat16 : at::kFloat;
}

// Which (op, dtype) Gloo accepts: a tiny op each, same on every rank (the
// rejection is argument / dtype validation, identical everywhere).
void ProbeGloo(Env& env) {
  for (const std::string& op_name : env.flags.ops) {
    const std::optional<CollectiveOp> op = tb::ParseOp(op_name);
    for (const std::string& dt : env.flags.dtypes) {
      Buffers b = MakeBuffers(*op, 64 * env.flags.world, DType(dt), env.flags.world, env.rank);
      try {
        RunOp(*env.gloo, /*is_gloo=*/true, *op, b);
        env.gloo_ok.insert({*op, dt});
      } catch (const std::exception& e) {
        if (env.rank == 0) {
          const std::string what = e.what();
          std::fprintf(stderr, "gloo: no %s for %s (%s)\n", op_name.c_str(), dt.c_str(),
                       what.substr(0, what.find('\n')).c_str());
        }
      }
      env.ours->barrier()->wait();
    }
  }
}

int64_t Iterations(const Env& env, int64_t bytes, bool gloo) {
  if (env.flags.quick) return 2;
  const int64_t cap = env.flags.max_iters > 0 ? env.flags.max_iters : 2000;
  return gloo ? tb::IterationsFor(bytes, 64 << 20, 2, std::min<int64_t>(50, cap))
              : tb::IterationsFor(bytes, 512 << 20, std::min<int64_t>(5, cap), cap);
}

// The sizes of the run: --sizes as given, else the sweep.
std::vector<int64_t> Sizes(const Flags& flags) {
  if (!flags.sizes.empty()) return flags.sizes;
  return tb::SweepSizes(flags.min_bytes, flags.max_bytes, flags.step);
}

std::string CaseName(const std::string& op, const std::string& dt, int64_t bytes, int world,
                     const std::string& impl) {
  return op + "/" + dt + "/" + tb::SizeName(bytes) + "/world" + std::to_string(world) + "/" + impl;
}

void RegisterCase(Env& env, CollectiveOp op, const std::string& dt, int64_t bytes,
                  const std::string& impl) {
  const std::string name = CaseName(tb::OpName(op), dt, bytes, env.flags.world, impl);
  const bool is_gloo = impl == "gloo";
  const int64_t iters = Iterations(env, bytes, is_gloo);
  auto* bm = benchmark::RegisterBenchmark(
      name.c_str(), [&env, name, op, dt, bytes, impl, is_gloo](benchmark::State& state) {
        Buffers b = MakeBuffers(op, bytes, DType(dt), env.flags.world, env.rank);
        c10d::Backend& pg = is_gloo ? static_cast<c10d::Backend&>(*env.gloo)
                                         : static_cast<c10d::Backend&>(*env.ours);
        WaitedBarrier(*env.ours);
        RunOp(pg, is_gloo, op, b);  // warm-up: page faults, lazy set-up
        WaitedBarrier(*env.ours);
        const auto start = Clock::now();
        const double cpu_start = ProcessCpuSeconds();
        std::vector<double> per_op;  // --stat=median: each op's own time
        if (env.flags.median) {
          per_op.reserve(state.max_iterations);
          for (auto _ : state) {
            const auto t0 = Clock::now();
            RunOp(pg, is_gloo, op, b);
            per_op.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          }
        } else {
          for (auto _ : state) RunOp(pg, is_gloo, op, b);
        }
        const double secs = std::chrono::duration<double>(Clock::now() - start).count();
        if (!per_op.empty()) {
          std::sort(per_op.begin(), per_op.end());
          const size_t n = per_op.size();
          env.seconds[name] = n % 2 ? per_op[n / 2] : (per_op[n / 2 - 1] + per_op[n / 2]) / 2;
        } else {
          env.seconds[name] = secs / std::max<int64_t>(state.iterations(), 1);
        }
        env.cpu_seconds[name] =
            (ProcessCpuSeconds() - cpu_start) / std::max<int64_t>(state.iterations(), 1);
        state.SetBytesProcessed(state.iterations() * bytes);
      });
  bm->Iterations(iters)->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// The case sizes of `op` for nominal `size`: split ops round to the world.
int64_t CaseBytes(CollectiveOp op, int64_t size, const std::string& dt, int world) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(DType(dt)));
  if (op == CollectiveOp::kAllReduce || op == CollectiveOp::kBroadcast) {
    return std::max(elem, size / elem * elem);
  }
  return tb::RoundToWorld(size, world, elem);
}

void RegisterAll(Env& env) {
  const int world = env.flags.world;
  const std::vector<int64_t> sizes = Sizes(env.flags);
  std::set<int64_t> memcpy_done;
  for (int64_t size : sizes) {
    for (const std::string& op_name : env.flags.ops) {
      const CollectiveOp op = *tb::ParseOp(op_name);
      for (const std::string& dt : env.flags.dtypes) {
        const int64_t bytes = CaseBytes(op, size, dt, world);
        if (memcpy_done.insert(bytes).second) {
          RegisterCase(env, CollectiveOp::kMemcpy, "fp32", bytes, "memcpy");
        }
        RegisterCase(env, op, dt, bytes, "tpu_dist");
        if (env.flags.gloo && env.gloo_ok.count({op, dt}) && bytes <= env.flags.gloo_max_bytes) {
          RegisterCase(env, op, dt, bytes, "gloo");
        }
      }
    }
  }
}

// Rank 0: the rows, in sweep order, from what was measured.
std::vector<tb::CollectiveRow> CollectRows(const Env& env) {
  const int world = env.flags.world;
  std::vector<tb::CollectiveRow> rows;
  auto get = [&](const std::string& name) {
    auto it = env.seconds.find(name);
    return it == env.seconds.end() ? -1.0 : it->second;
  };
  for (const std::string& op_name : env.flags.ops) {
    const CollectiveOp op = *tb::ParseOp(op_name);
    for (const std::string& dt : env.flags.dtypes) {
      for (int64_t size : Sizes(env.flags)) {
        const int64_t bytes = CaseBytes(op, size, dt, world);
        tb::CollectiveRow r;
        r.op = op;
        r.dtype = dt;
        r.world = world;
        r.bytes = bytes;
        r.tpu_dist_s = get(CaseName(op_name, dt, bytes, world, "tpu_dist"));
        if (r.tpu_dist_s < 0) continue;  // filtered out
        r.gloo_s = get(CaseName(op_name, dt, bytes, world, "gloo"));
        r.memcpy_s = std::max(0.0, get(CaseName("memcpy", "fp32", bytes, world, "memcpy")));
        r.iters = Iterations(env, bytes, false);
        rows.push_back(r);
      }
    }
  }
  return rows;
}

// The collectives issue's goals, as measured in this run.
void PrintGoals(const std::vector<tb::CollectiveRow>& rows, int world) {
  std::printf("\n== goals (measured, %d ranks, fp32 all_reduce) ==\n", world);
  for (const tb::CollectiveRow& r : rows) {
    if (r.op != CollectiveOp::kAllReduce || r.dtype != "fp32") continue;
    if (r.bytes != 8 && r.bytes != (16 << 20)) continue;
    const tb::DerivedRow d = tb::Derive(r);
    std::string gloo = "gloo not run (--gloo=0)";
    if (r.gloo_s > 0) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "gloo %10.2f us | gloo/tpu_dist %6.1fx (goal %s)",
                    r.gloo_s * 1e6, d.speedup_vs_gloo, r.bytes == 8 ? ">=30x" : ">=5x");
      gloo = buf;
    }
    std::printf("%-6s tpu_dist %10.2f us | %s | memcpy %9.2f us = %5.1f%% of tpu_dist time%s\n",
                tb::SizeName(r.bytes).c_str(), r.tpu_dist_s * 1e6, gloo.c_str(),
                r.memcpy_s * 1e6, 100.0 * d.fraction_of_memcpy,
                r.bytes == 8 ? "" : " (goal >=50%)");
  }
}

// Cross-host goal (issue #16 goal 3: every op >= 2x Gloo at 16 MiB across
// emulated hosts), with the loopback TCP bandwidth measured now as the limit:
// every cross-host byte goes through a loopback socket. Rank 0 only, after
// the other ranks have finished their cases.
std::optional<tb::TcpLoopback> PrintCrossHostGoal(const std::vector<tb::CollectiveRow>& rows,
                                                  const Env& env) {
  const Flags& flags = env.flags;
  if (flags.hosts <= 1) return std::nullopt;
  const absl::StatusOr<tb::TcpLoopback> lo = tb::MeasureTcpLoopback(16 << 20, flags.quick ? 2 : 8);
  std::printf("\n== goal 3 (measured, %d ranks on %d emulated hosts, fp32, 16 MiB) ==\n",
              flags.world, flags.hosts);
  if (lo.ok()) {
    std::printf("tcp loopback: one socket pair, 16 MiB x %d: %.2f ms per 16 MiB = %.2f GB/s "
                "(the limit for cross-host bytes)\n",
                lo->repeats, lo->seconds_per_copy * 1e3, lo->gbytes_per_s);
  } else {
    std::printf("tcp loopback: not measured (%s)\n", lo.status().ToString().c_str());
  }
  for (const tb::CollectiveRow& r : rows) {
    if (r.dtype != "fp32" || r.bytes != CaseBytes(r.op, 16 << 20, "fp32", flags.world)) continue;
    const tb::DerivedRow d = tb::Derive(r);
    std::printf("%-14s tpu_dist %10.2f us | gloo %10.2f us | gloo/tpu_dist %5.2fx (goal >=2x)\n",
                tb::OpName(r.op).c_str(), r.tpu_dist_s * 1e6, r.gloo_s * 1e6,
                d.speedup_vs_gloo);
    // CPU per op is less at the mercy of the load than wall time: on a box
    // whose cores are all busy, wall time follows the CPU the ranks need.
    const auto cpu = [&](const char* impl) {
      auto it = env.cpu_seconds.find(
          CaseName(tb::OpName(r.op), "fp32", r.bytes, flags.world, impl));
      return it == env.cpu_seconds.end() ? -1.0 : it->second;
    };
    const double ours = cpu("tpu_dist"), gloo = cpu("gloo");
    std::printf("  cpu of rank 0's process per op: tpu_dist %.2f ms | gloo %.2f ms | %.2fx\n",
                ours * 1e3, gloo * 1e3, ours > 0 && gloo > 0 ? gloo / ours : 0.0);
  }
  return lo.ok() ? std::optional<tb::TcpLoopback>(*lo) : std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Env env;
  env.flags = tb::ParseCollectivesBenchFlags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  const double load_before = LoadAverage();
  // Before ForkRanks: no threads yet. Only rank 0 owns (and stops) it.
  absl::StatusOr<tb::BusyLoad> busy = tb::BusyLoad::Start(env.flags.busy_per_core);
  if (!busy.ok()) {
    std::fprintf(stderr, "%s\n", busy.status().ToString().c_str());
    return 2;
  }
  // The latency floor (one bare futex barrier of all ranks), mapped before
  // the fork so that every rank shares it.
  absl::StatusOr<tb::FutexBarrier> floor_barrier = tb::FutexBarrier::Create(env.flags.world);
  if (!floor_barrier.ok()) {
    std::fprintf(stderr, "%s\n", floor_barrier.status().ToString().c_str());
    return 2;
  }
  // The FileStore's directory, removed when this (the parent) process
  // returns from main; the forked ranks' copies leave it alone.
  const tpudist::test_support::ScopedTempDir run_dir("tpud_bench");
  if (run_dir.path().empty()) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = run_dir.path();
  const std::string job = "bench" + std::to_string(getpid());
  const tpudist::test_support::ForkedRanks ranks = tpudist::test_support::ForkRanks(env.flags.world);  // before any at:: op
  env.rank = ranks.rank;
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", env.flags.world);
  ProcessGroupTpuDist::Options options;
  options.timeout = std::chrono::seconds(120);
  options.job_id = job;
  if (env.flags.hosts > 1) {  // rank-major blocks of world / hosts ranks per host
    const int per_host = std::max(1, env.flags.world / env.flags.hosts);
    options.host_id = "bench_host" + std::to_string(env.rank / per_host);
    options.bind_address = "127.0.0.1";  // emulated hosts share loopback
    if (env.flags.multi_rail_min_bytes >= 0) {
      options.multi_rail_min_bytes = env.flags.multi_rail_min_bytes;
    }
    if (env.flags.rail_chunk_bytes > 0) options.rail_chunk_bytes = env.flags.rail_chunk_bytes;
  }
  if (!env.flags.flight_recorder) options.flight_recorder_entries = 0;
  options.shm_fastbox = env.flags.fastbox;
  if (env.flags.shm_sync == "arrivals") options.shm_sync = tpudist::collectives::shm::CommOptions::Sync::kArrivals;
  if (env.flags.shm_sync == "poll") options.shm_sync = tpudist::collectives::shm::CommOptions::Sync::kPollPeers;
  if (env.flags.slot_bytes > 0) options.shm_slot_bytes = env.flags.slot_bytes;
  if (env.flags.slots > 0) options.shm_num_slots = env.flags.slots;
  if (env.flags.spin >= 0 || env.flags.yield >= 0 || env.flags.adaptive_yield >= 0 ||
      env.flags.slow_yield_us >= 0 || env.flags.slow_stages >= 0 ||
      env.flags.yield_backoff_ms >= 0) {  // else the group chooses
    namespace shm = tpudist::collectives::shm;
    shm::WaitPolicy wait = shm::ChooseWaitPolicy(env.flags.world, shm::UsableCores());
    if (env.flags.spin >= 0) wait.spin_iters = env.flags.spin;
    if (env.flags.yield >= 0) wait.yield_iters = env.flags.yield;
    if (env.flags.adaptive_yield >= 0) wait.adaptive_yield = env.flags.adaptive_yield != 0;
    if (env.flags.slow_yield_us >= 0) wait.slow_yield = absl::Microseconds(env.flags.slow_yield_us);
    if (env.flags.slow_stages >= 0) wait.slow_stages_to_close = env.flags.slow_stages;
    if (env.flags.yield_backoff_ms >= 0) {
      wait.yield_backoff_min = absl::Milliseconds(env.flags.yield_backoff_ms);
    }
    options.wait = wait;
  }
  env.ours = c10::make_intrusive<ProcessGroupTpuDist>(store, env.rank, env.flags.world, options);
  auto gloo_opts = c10d::ProcessGroupGloo::Options::create();
  gloo_opts->timeout = std::chrono::seconds(120);
  gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  env.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), env.rank, env.flags.world,
      gloo_opts);
  for (const std::string& op : env.flags.ops) {
    if (!tb::ParseOp(op) || op == "memcpy") {
      std::fprintf(stderr, "unknown --ops entry %s\n", op.c_str());
      return 2;
    }
  }
  if (env.flags.gloo) ProbeGloo(env);
  const int64_t settle_ops = tb::SettleGroup(*env.ours, env.rank,
                                             std::chrono::milliseconds(env.flags.settle_ms));
  RegisterAll(env);
  benchmark::RunSpecifiedBenchmarks();
  env.ours->barrier()->wait();
  // Same policy as the group's waits: no spin when ranks outnumber cores.
  namespace shm = tpudist::collectives::shm;
  // Two floors: futex only, and with up to 64 plain sched_yields first (the
  // floor of the adaptive yield stage when only our ranks compete).
  const int floor_spin = shm::ChooseWaitPolicy(env.flags.world, shm::UsableCores()).spin_iters;
  constexpr int kFloorYields = 64;
  const double floor_s =
      env.flags.floor_rounds > 0 ? floor_barrier->TimeRounds(env.flags.floor_rounds, floor_spin, 0)
                                 : -1;
  const double floor_yield_s =
      env.flags.floor_rounds > 0
          ? floor_barrier->TimeRounds(env.flags.floor_rounds, floor_spin, kFloorYields)
          : -1;
  if (env.rank != 0) {
    env.gloo.reset();
    env.ours.reset();
    _exit(0);
  }
  const std::vector<tb::CollectiveRow> rows = CollectRows(env);
  const double load_after = LoadAverage();
  if (busy->processes() > 0) {
    std::printf("\nbusy load: %d spinning processes (%d per core x %d usable cores), "
                "started and stopped by this run\n",
                busy->processes(), env.flags.busy_per_core,
                tpudist::collectives::shm::UsableCores());
  }
  const std::string hosts =
      env.flags.hosts > 1 ? " on " + std::to_string(env.flags.hosts) + " emulated hosts" : "";
  std::printf("\n== collectives, %d ranks%s (load average %.2f -> %.2f; settled with %lld "
              "8-byte all_reduces in %d ms first) ==\n%s",
              env.flags.world, hosts.c_str(), load_before, load_after,
              static_cast<long long>(settle_ops), env.flags.settle_ms,
              tb::FormatTable(rows).c_str());
  PrintGoals(rows, env.flags.world);
  if (floor_s > 0) {
    std::printf("latency floor: one bare futex barrier of %d processes (one arrival word, one "
                "FUTEX_WAKE of all sleepers, %d spins): %.2f us (mean of %d)\n",
                env.flags.world, floor_spin, floor_s * 1e6, env.flags.floor_rounds);
  }
  if (floor_yield_s > 0) {
    std::printf("latency floor with yields: the same barrier, %d spins then up to %d "
                "sched_yield before the futex: %.2f us (mean of %d)\n",
                floor_spin, kFloorYields, floor_yield_s * 1e6, env.flags.floor_rounds);
  }
  const std::optional<tb::TcpLoopback> loopback = PrintCrossHostGoal(rows, env);
  if (!env.flags.json_out.empty()) {
    nlohmann::json j = {{"bench", "collectives"},
                        {"world", env.flags.world},
                        {"hosts", env.flags.hosts},
                        {"load_before", load_before},
                        {"load_after", load_after},
                        {"busy_processes", busy->processes()},
                        {"quick", env.flags.quick},
                        {"stat", env.flags.median ? "median" : "mean"},
                        {"rows", tb::ToJson(rows)}};
    if (loopback) j["tcp_loopback_gbytes_per_s"] = loopback->gbytes_per_s;
    std::ofstream(env.flags.json_out) << j.dump(1) << "\n";
  }
  benchmark::Shutdown();
  busy->Stop();
  const absl::Status waited = tpudist::test_support::WaitForRanks(ranks, absl::Seconds(60));
  if (!waited.ok()) std::fprintf(stderr, "%s\n", waited.ToString().c_str());
  env.gloo.reset();
  env.ours.reset();
  store.reset();  // run_dir (the store's directory) goes when main returns
  // Must run, not meet a number: fail only when nothing was measured.
  bool measured = !rows.empty();
  for (const tb::CollectiveRow& r : rows) measured = measured && r.tpu_dist_s > 0;
  if (!measured) std::fprintf(stderr, "collectives_bench: no tpu_dist case measured\n");
  return waited.ok() && measured ? 0 : 1;
}
