// One process-group option against another at world W, in ONE run: W forked
// ranks each make one ProcessGroupTpuDist per configuration (the defaults,
// then one option changed per configuration) and time back-to-back blocking
// all_reduces (allreduce + wait, asyncOp false: the inline path) on each,
// alternated round by round, so every configuration sees the same placement
// of ranks on cores. On the 2-core KVM box a whole run lands in a fast or a
// slow mode up to 2x apart (bench/README.md), which separate binaries run one
// after the other cannot tell from a 10% change; this can.
//
//   pg_options_bench [--world=2] [--bytes=8] [--ops=N] [--rounds=R]
//
// Configurations: the defaults; the inline op's bookkeeping made before the
// op, not while it waits; no flight recorder; the shm waits spinning 128 and
// 512 times before they yield (the default is 32 when ranks <= cores).
//
// Rank 0 prints, per configuration, the median and min over rounds of the
// mean time per op, and the median over the first configuration's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/alternated_configs.h"
#include "bench/proc_stats.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/shm/wait.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"

namespace {

namespace shm = tpudist::collectives::shm;
using tpudist::collectives::ProcessGroupTpuDist;

struct Config {
  const char* name;
  void (*apply)(ProcessGroupTpuDist::Options&, int world);
};

// The shm waits' policy for `world` ranks on this host with `spins` spins.
shm::WaitPolicy Spins(int world, int spins) {
  shm::WaitPolicy p = shm::ChooseWaitPolicy(world, shm::UsableCores());
  p.spin_iters = spins;
  return p;
}

const Config kConfigs[] = {
    {"defaults", [](ProcessGroupTpuDist::Options&, int) {}},
    {"bookkeeping before op",
     [](ProcessGroupTpuDist::Options& o, int) { o.bookkeeping_while_waiting = false; }},
    {"no flight recorder",
     [](ProcessGroupTpuDist::Options& o, int) { o.flight_recorder_entries = 0; }},
    {"spin 128", [](ProcessGroupTpuDist::Options& o, int w) { o.wait = Spins(w, 128); }},
    {"spin 512", [](ProcessGroupTpuDist::Options& o, int w) { o.wait = Spins(w, 512); }},
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

// Mean seconds per op over `ops` back-to-back allreduce + wait of `t` on pg.
// t: [bytes / 4] fp32.
double TimeOps(c10d::Backend& pg, const at::Tensor& t, int64_t ops) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.asyncOp = false;
  opts.reduceOp = c10d::ReduceOp::MAX;  // values stay finite
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ops; ++i) pg.allreduce(v, opts)->wait();
  const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
  return d.count() / static_cast<double>(ops);
}

int Run(const tpudist::bench::AlternatedFlags& flags, int rank, const std::string& dir,
        const std::string& job_id) {
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", flags.world);
  std::vector<c10::intrusive_ptr<ProcessGroupTpuDist>> groups;
  for (int c = 0; c < kNumConfigs; ++c) {
    ProcessGroupTpuDist::Options o;
    o.timeout = std::chrono::seconds(60);
    o.job_id = job_id;
    o.group_name = absl::StrCat("config", c);
    kConfigs[c].apply(o, flags.world);
    groups.push_back(c10::make_intrusive<ProcessGroupTpuDist>(store, rank, flags.world, o));
  }
  at::Tensor t = at::ones({flags.bytes / 4}, at::kFloat);  // [bytes / 4]
  const double load_before = tpudist::bench::LoadAverage();
  for (int c = 0; c < kNumConfigs; ++c) TimeOps(*groups[c], t, 2000);  // warm-up
  const std::vector<std::vector<double>> times = tpudist::bench::AlternateRounds(
      flags, kNumConfigs, [&](int c) { return TimeOps(*groups[c], t, flags.ops); });
  for (auto& g : groups) g->shutdown();
  if (rank != 0) return 0;
  std::vector<std::string> names;
  for (const Config& c : kConfigs) names.push_back(c.name);
  tpudist::bench::PrintConfigTable(
      absl::StrCat("pg_options_bench: ", flags.bytes, " B fp32 MAX allreduce + wait (asyncOp false)"),
      flags, load_before, names, times);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tpudist::bench::AlternatedFlags flags;
  if (!tpudist::bench::ParseAlternatedFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: pg_options_bench [--world=N] [--bytes=N] [--ops=N] [--rounds=N]\n");
    return 2;
  }
  return tpudist::bench::RunForkedRanks("pg_options_bench", flags,
                                        [&](int rank, const std::string& dir,
                                            const std::string& job_id) {
                                          return Run(flags, rank, dir, job_id);
                                        });
}
