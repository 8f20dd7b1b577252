#include "bench/bench_math.h"

#include <algorithm>
#include <cassert>

namespace tpudist::bench {

std::string OpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kMemcpy: return "memcpy";
  }
  return "?";
}

std::optional<CollectiveOp> ParseOp(const std::string& name) {
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kAllGather,
                          CollectiveOp::kReduceScatter, CollectiveOp::kBroadcast,
                          CollectiveOp::kAllToAll, CollectiveOp::kMemcpy}) {
    if (OpName(op) == name) return op;
  }
  return std::nullopt;
}

double BusBwFactor(CollectiveOp op, int world) {
  assert(world >= 1);
  const double n = world;
  switch (op) {
    case CollectiveOp::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllToAll: return (n - 1) / n;
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kMemcpy: return 1.0;
  }
  return 1.0;
}

double AlgBw(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
}

double BusBw(CollectiveOp op, int world, int64_t bytes, double seconds) {
  return AlgBw(bytes, seconds) * BusBwFactor(op, world);
}

std::vector<int64_t> SweepSizes(int64_t min_bytes, int64_t max_bytes, int64_t step) {
  assert(min_bytes >= 1 && min_bytes <= max_bytes && step >= 2);
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s < max_bytes; s *= step) sizes.push_back(s);
  sizes.push_back(max_bytes);
  return sizes;
}

int64_t RoundToWorld(int64_t size, int world, int64_t elem_bytes) {
  assert(world >= 1 && elem_bytes >= 1);
  const int64_t unit = world * elem_bytes;
  return std::max(unit, size / unit * unit);
}

int64_t IterationsFor(int64_t bytes, int64_t budget_bytes, int64_t min_iters, int64_t max_iters) {
  const int64_t n = budget_bytes / std::max<int64_t>(bytes, 1);
  return std::clamp(n, min_iters, max_iters);
}

std::string SizeName(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  int64_t v = bytes;
  while (u < 3 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + units[u];
}

double DecoderStepFlops(double matmul_params, int64_t batch, int64_t seq, int64_t heads,
                        const std::vector<int64_t>& head_dims) {
  const double tokens = static_cast<double>(batch) * seq;
  double attn = 0;
  for (int64_t d : head_dims) {
    attn += 12.0 * batch * heads * static_cast<double>(seq) * seq * d;
  }
  return 6.0 * matmul_params * tokens + attn;
}

}  // namespace tpudist::bench
