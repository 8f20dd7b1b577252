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
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/proc_stats.h"
#include "collectives/shm/algorithms.h"
#include "collectives/shm/communicator.h"
#include "testing/forked_ranks.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace {

namespace shm = tpudist::collectives::shm;
using tpudist::collectives::DataType;
using tpudist::collectives::OpSpec;
using tpudist::collectives::ReduceKind;

struct Flags {
  int world = 2;
  int64_t bytes = 8;
  int64_t ops = 50000;
  int rounds = 9;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    int64_t n = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(a.substr(eq + 1), &n) || n <= 0) return false;
    if (key == "--world") {
      f->world = static_cast<int>(n);
    } else if (key == "--bytes" && n % 4 == 0) {
      f->bytes = n;
    } else if (key == "--ops") {
      f->ops = n;
    } else if (key == "--rounds") {
      f->rounds = static_cast<int>(n);
    } else {
      return false;
    }
  }
  return true;
}

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

int Run(const Flags& flags, int rank, const std::string& dir) {
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
  std::vector<std::vector<double>> times(kNumConfigs);
  const double load_before = tpudist::bench::LoadAverage();
  for (int c = 0; c < kNumConfigs; ++c) TimeLoop(*comms[c], data.data(), count, 2000, &seqs[c]);
  for (int round = 0; round < flags.rounds; ++round) {
    for (int c = 0; c < kNumConfigs; ++c) {
      times[c].push_back(TimeLoop(*comms[c], data.data(), count, flags.ops, &seqs[c]));
    }
  }
  if (rank != 0) return 0;
  std::printf("shm_sync_bench: %lld B fp32 MAX all_reduce, world %d, %lld ops x %d rounds "
              "alternated; load average %.2f -> %.2f; us per op\n",
              static_cast<long long>(flags.bytes), flags.world,
              static_cast<long long>(flags.ops), flags.rounds, load_before,
              tpudist::bench::LoadAverage());
  std::printf("%-24s %10s %10s %14s\n", "configuration", "median", "min", "median / first");
  double first = 0;
  for (int c = 0; c < kNumConfigs; ++c) {
    std::vector<double> t = times[c];
    std::sort(t.begin(), t.end());
    const double median = t[t.size() / 2] * 1e6;
    if (c == 0) first = median;
    std::printf("%-24s %10.3f %10.3f %14.2f\n", kConfigs[c].name, median, t.front() * 1e6,
                median / first);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: shm_sync_bench [--world=N] [--bytes=N] [--ops=N] [--rounds=N]\n");
    return 2;
  }
  char tmpl[] = "/tmp/shm_sync_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const tpudist::test_support::ForkedRanks ranks = tpudist::test_support::ForkRanks(flags.world);
  const int rc = Run(flags, ranks.rank, dir);
  if (ranks.rank != 0) _exit(rc);
  const absl::Status all = tpudist::test_support::WaitForRanks(ranks, absl::Minutes(10));
  std::remove((dir + "/store").c_str());
  rmdir(dir.c_str());
  if (!all.ok()) {
    std::fprintf(stderr, "%s\n", std::string(all.message()).c_str());
    return 1;
  }
  return rc;
}
