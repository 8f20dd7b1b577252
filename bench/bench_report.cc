#include "bench/bench_report.h"

#include <cstdio>

namespace tpudist::bench {

DerivedRow Derive(const CollectiveRow& row) {
  DerivedRow d;
  d.alg_bw = AlgBw(row.bytes, row.tpu_dist_s);
  d.bus_bw = BusBw(row.op, row.world, row.bytes, row.tpu_dist_s);
  if (row.gloo_s > 0) {
    d.gloo_alg_bw = AlgBw(row.bytes, row.gloo_s);
    d.gloo_bus_bw = BusBw(row.op, row.world, row.bytes, row.gloo_s);
    if (row.tpu_dist_s > 0) d.speedup_vs_gloo = row.gloo_s / row.tpu_dist_s;
  }
  if (row.tpu_dist_s > 0) d.fraction_of_memcpy = row.memcpy_s / row.tpu_dist_s;
  return d;
}

std::string FormatTable(const std::vector<CollectiveRow>& rows) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-14s %-5s %5s %8s | %11s %8s %8s | %11s %8s %8s | %10s %7s\n",
                "op", "dtype", "world", "size", "tpu_dist us", "algBw", "busBw", "gloo us",
                "busBw", "gloo/td", "memcpy us", "limit%");
  out += line;
  for (const CollectiveRow& r : rows) {
    const DerivedRow d = Derive(r);
    char gloo_us[32] = "-", gloo_bus[32] = "-", speed[32] = "-";
    if (r.gloo_s > 0) {
      std::snprintf(gloo_us, sizeof(gloo_us), "%.2f", r.gloo_s * 1e6);
      std::snprintf(gloo_bus, sizeof(gloo_bus), "%.3f", d.gloo_bus_bw / 1e9);
      std::snprintf(speed, sizeof(speed), "%.1fx", d.speedup_vs_gloo);
    }
    std::snprintf(line, sizeof(line),
                  "%-14s %-5s %5d %8s | %11.2f %8.3f %8.3f | %11s %8s %8s | %10.2f %6.1f%%\n",
                  OpName(r.op).c_str(), r.dtype.c_str(), r.world, SizeName(r.bytes).c_str(),
                  r.tpu_dist_s * 1e6, d.alg_bw / 1e9, d.bus_bw / 1e9, gloo_us, gloo_bus, speed,
                  r.memcpy_s * 1e6, 100.0 * d.fraction_of_memcpy);
    out += line;
  }
  return out;
}

nlohmann::json ToJson(const CollectiveRow& r) {
  const DerivedRow d = Derive(r);
  nlohmann::json j = {
      {"op", OpName(r.op)},
      {"dtype", r.dtype},
      {"world", r.world},
      {"bytes", r.bytes},
      {"time_us", r.tpu_dist_s * 1e6},
      {"algbw_GBps", d.alg_bw / 1e9},
      {"busbw_GBps", d.bus_bw / 1e9},
      {"memcpy_time_us", r.memcpy_s * 1e6},
      {"fraction_of_memcpy", d.fraction_of_memcpy},
      {"iters", r.iters},
  };
  if (r.gloo_s > 0) {
    j["gloo_time_us"] = r.gloo_s * 1e6;
    j["gloo_busbw_GBps"] = d.gloo_bus_bw / 1e9;
    j["speedup_vs_gloo"] = d.speedup_vs_gloo;
  } else {
    j["gloo_time_us"] = nullptr;
    j["gloo_busbw_GBps"] = nullptr;
    j["speedup_vs_gloo"] = nullptr;
  }
  return j;
}

nlohmann::json ToJson(const std::vector<CollectiveRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const CollectiveRow& r : rows) a.push_back(ToJson(r));
  return a;
}

}  // namespace tpudist::bench
