// Flags of bench/collectives_bench.cc, parsed out of argv by a pure
// function (Google Benchmark's own flags are left in argv for it), so the
// parser has unit tests (bench_test). The binary's header comment lists what
// each flag does.
//
// Thread-safety: pure function.
#ifndef TPU_DIST_BENCH_COLLECTIVES_BENCH_FLAGS_H_
#define TPU_DIST_BENCH_COLLECTIVES_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tpudist::bench {

struct CollectivesBenchFlags {
  int world = 2;
  bool quick = false;
  int64_t min_bytes = 8;
  int64_t max_bytes = 64 << 20;
  int64_t step = 8;
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "all_to_all"};
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  bool gloo = true;
  int64_t gloo_max_bytes = int64_t{1} << 40;
  std::string json_out;
  int hosts = 1;           // emulated hosts (host id per rank), multi-host path
  int64_t multi_rail_min_bytes = -1;  // -1: the group's default; huge: leaders path only
  int64_t rail_chunk_bytes = -1;      // -1: the group's default
  int64_t slot_bytes = 0;  // 0: the group's default
  int slots = 0;           // 0: the group's default
  int spin = -1;           // -1: the group's default
  int yield = -1;
  int adaptive_yield = -1;  // -1: the group's default
  int slow_yield_us = -1;
  int slow_stages = -1;
  int yield_backoff_ms = -1;
  int busy_per_core = 0;   // busy processes per usable core (bench/busy_load.h)
  int floor_rounds = 2000; // bare futex barriers timed as the latency floor (0: none)
  int settle_ms = 1500;    // small all_reduces after start-up, before the first case
  std::vector<int64_t> sizes;  // --sizes=8,4096,...: exactly these (else the sweep)
  int64_t max_iters = 0;   // > 0: at most this many timed ops per case
  bool median = false;     // --stat=median: median of per-op times (else the loop's mean)
  bool flight_recorder = true;  // --flight_recorder=0: groups without one (its per-op cost)
  std::string shm_sync = "auto";  // --shm_sync=auto|arrivals|poll (shm::CommOptions::sync)
  bool fastbox = true;            // --fastbox=0: payloads and headers in the slots only
};

// Parses our flags out of argv (argv[1..*argc)), moving the rest (Google
// Benchmark's) to the front and updating *argc. --quick (or --smoke) sets
// 8 B and 64 KiB cases and at most 20 floor rounds, whatever else is given.
// --stat= takes mean (the default) or median; anything else throws
// std::invalid_argument, as does a malformed number (std::stoi's).
// REQUIRES: argv holds *argc entries.
CollectivesBenchFlags ParseCollectivesBenchFlags(int* argc, char** argv);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_COLLECTIVES_BENCH_FLAGS_H_
