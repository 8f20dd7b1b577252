// Results of the collective benchmarks as rows, printed as an aligned text
// table (nccl-tests style, one line per op/dtype/size with tpu_dist, Gloo and
// the memcpy limit side by side) and as JSON for tools/bench.sh.
//
// Thread-safety: values and pure functions.
#ifndef TPU_DIST_BENCH_BENCH_REPORT_H_
#define TPU_DIST_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_math.h"
#include "nlohmann/json.hpp"

namespace tpudist::bench {

// One measured (op, dtype, size, world) point.
struct CollectiveRow {
  CollectiveOp op = CollectiveOp::kAllReduce;
  std::string dtype;           // "fp32", "bf16"
  int world = 0;
  int64_t bytes = 0;           // nccl-tests size (bench_math.h)
  double tpu_dist_s = 0;       // seconds per op, rank 0's mean
  double gloo_s = -1;          // < 0: Gloo lacks the op / dtype (or skipped)
  double memcpy_s = 0;         // memcpy of `bytes` in the same run
  int64_t iters = 0;           // timed tpu_dist iterations
};

// Derived columns: algBw/busBw (bytes/s) of tpu_dist and Gloo, the
// Gloo/tpu_dist speedup (0 without Gloo) and busBw as a fraction of the
// memcpy bandwidth.
struct DerivedRow {
  double alg_bw = 0, bus_bw = 0;
  double gloo_alg_bw = 0, gloo_bus_bw = 0;
  double speedup_vs_gloo = 0;
  double fraction_of_memcpy = 0;  // memcpy_s / tpu_dist_s (time-based limit)
};
DerivedRow Derive(const CollectiveRow& row);

// Header + one line per row; times in us, bandwidths in GB/s (1e9).
std::string FormatTable(const std::vector<CollectiveRow>& rows);

// {"op":..., "dtype":..., "world":..., "bytes":..., "time_us":...,
//  "algbw_GBps":..., "busbw_GBps":..., "gloo_time_us": (null without Gloo),
//  "gloo_busbw_GBps":..., "memcpy_time_us":..., "speedup_vs_gloo":...,
//  "fraction_of_memcpy":..., "iters":...}
nlohmann::json ToJson(const CollectiveRow& row);
nlohmann::json ToJson(const std::vector<CollectiveRow>& rows);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_BENCH_REPORT_H_
