// Executes a redistribution plan (fsdp/redistribute_plan.h) on a local
// tensor, with and without autograd. DTensor::Redistribute, ToLocal and the
// tensor-parallel styles all go through RedistributeLocalAutograd.
//
// Gradients. A redistribution never changes the logical value, so its
// gradient is the incoming gradient re-laid-out: backward redistributes the
// output gradient from `grad_placements` (default: DefaultGradPlacements(dst))
// to DefaultGradPlacements(src). Hence the duals, as in PyTorch:
//   S->R all_gather      <-> R->S chunk (or P->S reduce_scatter when the
//                            caller declares the output grad Partial)
//   R->S chunk           <-> S->R all_gather
//   P->R all_reduce      <-> identity (R->R)
//   P->S reduce_scatter  <-> S->R all_gather
//   S(a)->S(b) all_to_all<-> S(b)->S(a) all_to_all
//   S->P(sum) embed      <-> R->S chunk (the gradient of a Partial is
//                            Replicate)
//   R->P partition       <-> identity; and ToLocal(grad = Partial) of a
//                            Replicate tensor backs off with an all_reduce.
// Partial(avg|max|min) inputs are forward-only: backward raises.
//
// Thread-safety: collective; all members of the involved groups must call
// in the same order. Backward collectives run in the backward pass, in the
// thread that calls backward() (CPU autograd), in reverse order on all ranks.
#ifndef TPU_DIST_FSDP_REDISTRIBUTE_H_
#define TPU_DIST_FSDP_REDISTRIBUTE_H_

#include <cstdint>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fsdp/device_mesh.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

// `local` is the piece of a tensor of `global_shape` placed as `src` on this
// rank; returns its piece placed as `dst`. No autograd history is recorded.
// InvalidArgument when local's shape is not the one `src` implies.
// REQUIRES: src, dst normalized, mesh.ndim() entries each.
// local: LocalShape(global, src) -> LocalShape(global, dst)
absl::StatusOr<at::Tensor> RedistributeLocal(const at::Tensor& local, const DeviceMesh& mesh,
                                             absl::Span<const int64_t> global_shape,
                                             absl::Span<const Placement> src,
                                             absl::Span<const Placement> dst);

// Same forward, recorded on the autograd tape when `local` requires grad;
// backward as described above. `grad_placements` empty means the default.
absl::StatusOr<at::Tensor> RedistributeLocalAutograd(const at::Tensor& local,
                                                     const DeviceMesh& mesh,
                                                     absl::Span<const int64_t> global_shape,
                                                     absl::Span<const Placement> src,
                                                     absl::Span<const Placement> dst,
                                                     absl::Span<const Placement> grad_placements);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_REDISTRIBUTE_H_
