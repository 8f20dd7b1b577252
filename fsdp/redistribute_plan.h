// Plans a redistribution from one list of placements to another as a
// sequence of single-mesh-dim steps, each one collective (or a local op).
// Pure functions, thread-safe; the executor is fsdp/redistribute.h.
//
// Per mesh dim the transitions are (PyTorch 2.x DTensor):
//   S(d) -> R      all_gather along d (pad to ceil(n/k), unpad after)
//   P    -> R      all_reduce
//   P    -> S(d)   reduce_scatter along d
//   R    -> S(d)   local torch.chunk, no communication
//   S(a) -> S(b)   all_to_all
//   R    -> P      partition: sum divides by the mesh-dim size, avg/max/min
//                  keep the value (the reduction gives it back exactly)
//   S(d) -> P(sum) embed: the shard placed at its offset in zeros of the
//                  logical size along d, no communication (torch 2.15's
//                  Shard._to_partial_tensor; torch refuses R -> P and
//                  S -> P(avg|max|min), which run here as below)
//   S -> P(avg|max|min)  S -> R then R -> P;   P(op1) -> P(op2): P -> R -> P.
//
// Order. A local tensor is the result of chunking in mesh-dim order, so a
// Shard on mesh dim j is "inside" any Shard of the same tensor dim on a mesh
// dim i < j. The plan therefore runs in two passes:
//   1. right to left: embed every S(d) -> P(sum) (the inner shards of d are
//      gone by then, the outer ones still frame it: afterwards this mesh dim
//      shards nothing); all_gather every other Shard that changes, or whose
//      tensor dim is touched (as source or target Shard) by a mesh dim to its
//      left that changes. An S(a)->S(b) whose a and b no other mesh dim
//      touches stays for an all_to_all.
//   2. left to right: every remaining difference, one step each.
// After pass 1 no inner Shard can disturb an outer step, so each step sees
// the torch.chunk layout it expects.
#ifndef TPU_DIST_FSDP_REDISTRIBUTE_PLAN_H_
#define TPU_DIST_FSDP_REDISTRIBUTE_PLAN_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

enum class StepKind {
  kAllGather,      // S(d) -> R
  kAllReduce,      // P -> R
  kReduceScatter,  // P -> S(d)
  kLocalChunk,     // R -> S(d)
  kAllToAll,       // S(a) -> S(b)
  kPartition,      // R -> P
  kEmbed,          // S(d) -> P(sum)
};
const char* StepKindName(StepKind kind);

struct RedistributeStep {
  int mesh_dim = 0;
  Placement from = Placement::Replicate();
  Placement to = Placement::Replicate();
  StepKind kind = StepKind::kAllGather;
  bool operator==(const RedistributeStep& o) const {
    return mesh_dim == o.mesh_dim && from == o.from && to == o.to && kind == o.kind;
  }
};

// The steps that turn `src` into `dst`, in execution order. Empty when equal.
// REQUIRES: both normalized and of the same length.
std::vector<RedistributeStep> PlanRedistribute(absl::Span<const Placement> src,
                                               absl::Span<const Placement> dst);

// "gather@1 S(0)->R; chunk@1 R->S(0)" for logs and test failure messages.
std::string PlanToString(absl::Span<const RedistributeStep> plan);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_REDISTRIBUTE_PLAN_H_
