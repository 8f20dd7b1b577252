#include "bench/collectives_bench_flags.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "absl/strings/str_split.h"
#include "bench/flag_value.h"

namespace tpudist::bench {

CollectivesBenchFlags ParseCollectivesBenchFlags(int* argc, char** argv) {
  CollectivesBenchFlags f;
  const auto value = FlagValue;
  StripFlags(argc, argv, [&](const std::string& a) {
    const char* v = nullptr;
    if ((v = value(a, "--world="))) f.world = std::stoi(v);
    else if ((v = value(a, "--min_bytes="))) f.min_bytes = std::stoll(v);
    else if ((v = value(a, "--max_bytes="))) f.max_bytes = std::stoll(v);
    else if ((v = value(a, "--step="))) f.step = std::stoll(v);
    else if ((v = value(a, "--ops="))) f.ops = absl::StrSplit(v, ',');
    else if ((v = value(a, "--dtypes="))) f.dtypes = absl::StrSplit(v, ',');
    else if ((v = value(a, "--gloo="))) f.gloo = std::stoi(v) != 0;
    else if ((v = value(a, "--gloo_max_bytes="))) f.gloo_max_bytes = std::stoll(v);
    else if ((v = value(a, "--json_out="))) f.json_out = v;
    else if ((v = value(a, "--hosts="))) f.hosts = std::stoi(v);
    else if ((v = value(a, "--multi_rail_min_bytes="))) f.multi_rail_min_bytes = std::stoll(v);
    else if ((v = value(a, "--rail_chunk_bytes="))) f.rail_chunk_bytes = std::stoll(v);
    else if ((v = value(a, "--slot_bytes="))) f.slot_bytes = std::stoll(v);
    else if ((v = value(a, "--slots="))) f.slots = std::stoi(v);
    else if ((v = value(a, "--spin="))) f.spin = std::stoi(v);
    else if ((v = value(a, "--yield="))) f.yield = std::stoi(v);
    else if ((v = value(a, "--adaptive_yield="))) f.adaptive_yield = std::stoi(v);
    else if ((v = value(a, "--slow_yield_us="))) f.slow_yield_us = std::stoi(v);
    else if ((v = value(a, "--slow_stages="))) f.slow_stages = std::stoi(v);
    else if ((v = value(a, "--yield_backoff_ms="))) f.yield_backoff_ms = std::stoi(v);
    else if ((v = value(a, "--busy_threads_per_core="))) f.busy_per_core = std::stoi(v);
    else if ((v = value(a, "--floor_rounds="))) f.floor_rounds = std::stoi(v);
    else if ((v = value(a, "--settle_ms="))) f.settle_ms = std::stoi(v);
    else if ((v = value(a, "--max_iters="))) f.max_iters = std::stoll(v);
    else if ((v = value(a, "--flight_recorder="))) f.flight_recorder = std::stoi(v) != 0;
    else if ((v = value(a, "--fastbox="))) f.fastbox = std::stoi(v) != 0;
    else if ((v = value(a, "--shm_sync="))) {
      f.shm_sync = v;
      if (f.shm_sync != "auto" && f.shm_sync != "arrivals" && f.shm_sync != "poll") {
        throw std::invalid_argument("--shm_sync= takes auto, arrivals or poll, got " + f.shm_sync);
      }
    }
    else if ((v = value(a, "--sizes="))) {
      f.sizes.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) f.sizes.push_back(std::stoll(std::string(s)));
    } else if ((v = value(a, "--stat="))) {
      const std::string stat = v;
      if (stat != "mean" && stat != "median") throw std::invalid_argument("--stat=" + stat);
      f.median = stat == "median";
    }
    else if (a == "--quick" || a == "--smoke") f.quick = true;
    else return false;
    return true;
  });
  if (f.quick) {
    f.min_bytes = 8;
    f.max_bytes = 64 << 10;
    f.step = 8192;  // 8 B and 64 KiB
    f.sizes.clear();
    f.floor_rounds = std::min(f.floor_rounds, 20);
    f.settle_ms = std::min(f.settle_ms, 50);
  }
  return f;
}

}  // namespace tpudist::bench
