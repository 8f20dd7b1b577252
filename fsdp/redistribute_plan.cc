#include "fsdp/redistribute_plan.h"

#include "absl/strings/str_cat.h"

namespace tpudist::fsdp {
namespace {

// Whether mesh dim `m` shards tensor dim `d` in `a` or `b`.
bool Touches(const Placement& a, const Placement& b, int64_t d) {
  return a.is_shard(d) || b.is_shard(d);
}

// An S(a)->S(b) at mesh dim `m` may run as one all_to_all only when no other
// mesh dim shards a or b, before or after.
bool AllToAllAllowed(absl::Span<const Placement> src, absl::Span<const Placement> dst, int m) {
  const int64_t a = src[m].dim();
  const int64_t b = dst[m].dim();
  for (int k = 0; k < static_cast<int>(src.size()); ++k) {
    if (k == m) continue;
    if (Touches(src[k], dst[k], a) || Touches(src[k], dst[k], b)) return false;
  }
  return true;
}

StepKind KindOf(const Placement& from, const Placement& to) {
  if (from.is_shard() && to.is_replicate()) return StepKind::kAllGather;
  if (from.is_partial() && to.is_replicate()) return StepKind::kAllReduce;
  if (from.is_partial() && to.is_shard()) return StepKind::kReduceScatter;
  if (from.is_replicate() && to.is_shard()) return StepKind::kLocalChunk;
  if (from.is_shard() && to.is_shard()) return StepKind::kAllToAll;
  if (from.is_shard() && to.is_partial()) return StepKind::kEmbed;  // to P(sum) only
  return StepKind::kPartition;  // R -> P
}

}  // namespace

const char* StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kAllGather: return "gather";
    case StepKind::kAllReduce: return "allreduce";
    case StepKind::kReduceScatter: return "reduce_scatter";
    case StepKind::kLocalChunk: return "chunk";
    case StepKind::kAllToAll: return "alltoall";
    case StepKind::kPartition: return "partition";
    case StepKind::kEmbed: return "embed";
  }
  return "?";
}

std::vector<RedistributeStep> PlanRedistribute(absl::Span<const Placement> src,
                                               absl::Span<const Placement> dst) {
  const int n = static_cast<int>(src.size());
  std::vector<Placement> cur(src.begin(), src.end());
  std::vector<RedistributeStep> plan;
  auto emit = [&](int m, const Placement& to) {
    plan.push_back(RedistributeStep{m, cur[m], to, KindOf(cur[m], to)});
    cur[m] = to;
  };
  // Pass 1, right to left: embed S -> P(sum), unshard what must change or
  // is invalidated.
  for (int m = n - 1; m >= 0; --m) {
    if (!src[m].is_shard()) continue;
    if (dst[m].is_partial() && dst[m].reduce_op() == ReduceOp::kSum) {
      emit(m, dst[m]);
      continue;
    }
    const int64_t d = src[m].dim();
    bool gather = false;
    if (src[m] != dst[m]) {
      gather = !(dst[m].is_shard() && AllToAllAllowed(src, dst, m));
    }
    for (int k = 0; k < m && !gather; ++k) {
      if (src[k] != dst[k] && Touches(src[k], dst[k], d)) gather = true;
    }
    if (gather) emit(m, Placement::Replicate());
  }
  // Pass 2, left to right: every remaining difference.
  for (int m = 0; m < n; ++m) {
    if (cur[m] == dst[m]) continue;
    if (cur[m].is_shard() && dst[m].is_partial()) emit(m, Placement::Replicate());
    if (cur[m].is_partial() && dst[m].is_partial()) emit(m, Placement::Replicate());
    if (cur[m] != dst[m]) emit(m, dst[m]);
  }
  return plan;
}

std::string PlanToString(absl::Span<const RedistributeStep> plan) {
  std::string out;
  for (const RedistributeStep& s : plan) {
    if (!out.empty()) out += "; ";
    absl::StrAppend(&out, StepKindName(s.kind), "@", s.mesh_dim, " ", s.from.ToString(), "->",
                    s.to.ToString());
  }
  return out;
}

}  // namespace tpudist::fsdp
