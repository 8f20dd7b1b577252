// The CPU one c10d collective costs from C++ when there is nobody to wait for:
// torch's own no-op backend (c10d::FakeProcessGroup: a Work allocated and
// returned, nothing moved) against a world-1 ProcessGroupTpuDist (our whole
// op path: checks, Work, flight recorder, op worker or the inline path, the
// shm one-shot on one slot), in one process, alternated round by round.
// The first is the floor of any c10d backend: what the Backend contract
// (tensor vectors, an intrusive_ptr Work) costs before a byte moves; the gap
// between the two is our process group's own per-op work. Compared in
// bench/README.md with an MPI library's whole 2-rank op.
//
//   op_floor_bench [--ops=N] [--rounds=R] [--sizes=8,4096,65536]
//                  [--flight_recorder=0|1]
//
// Prints, per size and backend, the mean CPU-bound time per op over N
// back-to-back ops (wait() after each), the min and max over the R rounds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "collectives/process_group_tpu_dist.h"
#include "torch/csrc/distributed/c10d/FakeProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace {

using tpudist::collectives::ProcessGroupTpuDist;

struct Flags {
  int64_t ops = 200000;
  int rounds = 5;
  std::vector<int64_t> sizes = {8, 4096, 65536};
  bool flight_recorder = true;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    int64_t n = 0;
    if (key == "--ops" && absl::SimpleAtoi(value, &n) && n > 0) {
      f->ops = n;
    } else if (key == "--rounds" && absl::SimpleAtoi(value, &n) && n > 0) {
      f->rounds = static_cast<int>(n);
    } else if (key == "--flight_recorder" && (value == "0" || value == "1")) {
      f->flight_recorder = value == "1";
    } else if (key == "--sizes") {
      f->sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        if (!absl::SimpleAtoi(s, &n) || n < 4) return false;
        f->sizes.push_back(n);
      }
    } else {
      return false;
    }
  }
  return true;
}

// Seconds per op over `ops` back-to-back allreduce + wait of `t` on `pg`.
// t: [bytes / 4] fp32.
double TimeOps(c10d::Backend& pg, at::Tensor t, int64_t ops) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions opts;
  opts.asyncOp = false;  // the caller waits at once (dist.all_reduce's default)
  for (int i = 0; i < 1000; ++i) pg.allreduce(v, opts)->wait();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < ops; ++i) pg.allreduce(v, opts)->wait();
  const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
  return d.count() / static_cast<double>(ops);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: op_floor_bench [--ops=N] [--rounds=R] [--sizes=8,4096] "
                         "[--flight_recorder=0|1]\n");
    return 2;
  }
  at::set_num_threads(1);
  auto fake = c10d::FakeProcessGroup::_create_internal(0, 1);
  ProcessGroupTpuDist::Options options;
  options.timeout = std::chrono::seconds(60);
  options.job_id = "op_floor_" + std::to_string(getpid());
  if (!flags.flight_recorder) options.flight_recorder_entries = 0;
  auto ours = c10::make_intrusive<ProcessGroupTpuDist>(c10::make_intrusive<c10d::HashStore>(),
                                                       0, 1, options);
  std::printf("op_floor_bench: allreduce + wait, world 1, one process, %lld ops per round, "
              "%d rounds alternated; us per op, min - max over rounds\n",
              static_cast<long long>(flags.ops), flags.rounds);
  std::printf("%-10s %-24s %-24s %s\n", "bytes", "c10d FakeProcessGroup", "tpu_dist world 1",
              "tpu_dist - fake (min)");
  for (int64_t bytes : flags.sizes) {
    at::Tensor t = at::ones({bytes / 4}, at::kFloat);  // [bytes / 4]
    std::vector<double> f, o;
    for (int r = 0; r < flags.rounds; ++r) {
      f.push_back(TimeOps(*fake, t, flags.ops) * 1e6);
      o.push_back(TimeOps(*ours, t, flags.ops) * 1e6);
    }
    const auto [fmin, fmax] = std::minmax_element(f.begin(), f.end());
    const auto [omin, omax] = std::minmax_element(o.begin(), o.end());
    char fs[64], os[64];
    std::snprintf(fs, sizeof(fs), "%.3f - %.3f", *fmin, *fmax);
    std::snprintf(os, sizeof(os), "%.3f - %.3f", *omin, *omax);
    std::printf("%-10lld %-24s %-24s %.3f\n", static_cast<long long>(bytes), fs, os,
                *omin - *fmin);
  }
  ours->shutdown();
  return 0;
}
