// The shm phase protocol alone, without the c10d op around it: W forked ranks
// run small shm::AllReduce loops over four communicators that differ only in
// CommOptions::sync (arrivals count vs polling each peer's fastbox) and
// CommOptions::fastbox (payload and header digest in the slot's first line vs
// header and data lines), alternated round by round in ONE run, so every
// configuration sees the same placement of ranks on cores (on the 2-core KVM
// box a whole run lands in a fast or a slow mode; bench/README.md, "Why the
// torch.distributed rows swing"). Rank 0 prints, per configuration, the
// median and min over rounds of the mean time per op.
//
//   shm_sync_bench [--world=2] [--bytes=8] [--ops=N] [--rounds=R]
//
// The first configuration (arrivals, no fastbox) is the protocol before the
// fastbox; the ratio column is each one over it.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/alternated_configs.h"
#include "bench/proc_stats.h"
#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace {

namespace shm = tpudist::collectives::shm;
using tpudist::collectives::DataType;
using tpudist::collectives::OpSpec;
using tpudist::collectives::ReduceKind;

struct Config {
  const char* name;
  shm::CommOptions::Sync sync;
  bool fastbox;
};

constexpr Config kConfigs[] = {
    {"arrivals, no fastbox", shm::CommOptions::Sync::kArrivals, false},
    {"arrivals + fastbox", shm::CommOptions::Sync::kArrivals, true},
    {"poll peers, no fastbox", shm::CommOptions::Sync::kPollPeers, false},
    {"poll peers + fastbox", shm::CommOptions::Sync::kPollPeers, true},
};
constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

// Mean seconds per op over `ops` fp32 MAX all_reduces (values stay finite) of `data` (count
// floats) on `comm`; *seq numbers the ops (the same on every rank).
double TimeLoop(shm::Communicator& comm, float* data, int64_t count, int64_t ops,
                uint32_t* seq) {
  OpSpec spec;
  spec.ctx.name = "allreduce";
  spec.ctx.bytes = count * 4;
  spec.ctx.start = absl::Now();
  spec.ctx.timeout = absl::Seconds(60);
  spec.dtype = DataType::kFloat32;
  spec.shape = {count};
  spec.count = count;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ops; ++i) {
    spec.seq = (*seq)++;
    if (absl::Status s = shm::AllReduce(comm, spec, ReduceKind::kMax, data, 32 << 10); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
  return d.count() / static_cast<double>(ops);
}

int Run(const tpudist::bench::AlternatedFlags& flags, int rank, const std::string& dir) {
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", flags.world);
  std::vector<std::unique_ptr<shm::Communicator>> comms;
  for (int c = 0; c < kNumConfigs; ++c) {
    shm::CommOptions o;
    o.job_id = "shm_sync_bench";
    o.group_name = absl::StrCat("config", c);
    o.sync = kConfigs[c].sync;
    o.fastbox = kConfigs[c].fastbox;
    c10d::PrefixStore keys(o.group_name, store);  // setup keys per group
    absl::StatusOr<std::unique_ptr<shm::Communicator>> comm =
        shm::Communicator::Create(keys, rank, flags.world, o);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(comm.status().message()).c_str());
      return 1;
    }
    comms.push_back(std::move(*comm));
  }
  const int64_t count = flags.bytes / 4;
  std::vector<float> data(count, 1.0f);
  std::vector<uint32_t> seqs(kNumConfigs, 0);
  const double load_before = tpudist::bench::LoadAverage();
  for (int c = 0; c < kNumConfigs; ++c) TimeLoop(*comms[c], data.data(), count, 2000, &seqs[c]);
  const std::vector<std::vector<double>> times =
      tpudist::bench::AlternateRounds(flags, kNumConfigs, [&](int c) {
        return TimeLoop(*comms[c], data.data(), count, flags.ops, &seqs[c]);
      });
  if (rank != 0) return 0;
  std::vector<std::string> names;
  for (const Config& c : kConfigs) names.push_back(c.name);
  tpudist::bench::PrintConfigTable(
      absl::StrCat("shm_sync_bench: ", flags.bytes, " B fp32 MAX all_reduce"), flags,
      load_before, names, times);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tpudist::bench::AlternatedFlags flags;
  if (!tpudist::bench::ParseAlternatedFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: shm_sync_bench [--world=N] [--bytes=N] [--ops=N] [--rounds=N]\n");
    return 2;
  }
  return tpudist::bench::RunForkedRanks(
      "shm_sync_bench", flags,
      [&](int rank, const std::string& dir, const std::string&) { return Run(flags, rank, dir); });
}
