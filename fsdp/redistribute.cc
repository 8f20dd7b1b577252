#include "fsdp/redistribute.h"

#include <stdexcept>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/exception_message.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/redistribute_plan.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {
namespace {

absl::StatusOr<at::Tensor> RunStep(const RedistributeStep& step, const at::Tensor& t,
                                   const DeviceMesh& mesh, absl::Span<const int64_t> global_shape,
                                   absl::Span<const Placement> cur) {
  const int m = step.mesh_dim;
  const int64_t n = mesh.size(m);
  switch (step.kind) {
    case StepKind::kAllGather: {
      const int64_t d = step.from.dim();
      const int64_t logical =
          LocalExtents(global_shape, mesh.shape(), mesh.coordinate(), cur, m)[d].size;
      return AllGatherAlongDim(mesh, m, t, d, logical);
    }
    case StepKind::kAllReduce:
      return AllReduceAlongDim(mesh, m, t, step.from.reduce_op());
    case StepKind::kReduceScatter:
      return ReduceScatterAlongDim(mesh, m, t, step.to.dim(), step.from.reduce_op());
    case StepKind::kLocalChunk: {
      const int64_t d = step.to.dim();
      const ChunkExtent e = ChunkOf(t.size(d), n, mesh.LocalRank(m));
      return t.narrow(d, e.offset, e.size).clone(at::MemoryFormat::Contiguous);
    }
    case StepKind::kAllToAll: {
      const int64_t a = step.from.dim();
      const int64_t logical =
          LocalExtents(global_shape, mesh.shape(), mesh.coordinate(), cur, m)[a].size;
      return AllToAllAlongDim(mesh, m, t, a, logical, step.to.dim());
    }
    case StepKind::kEmbed: {
      // torch's Shard._to_partial_tensor: this rank's piece at its torch.chunk
      // offset, zeros elsewhere; the sum over the mesh dim is the tensor.
      const int64_t d = step.from.dim();
      const int64_t logical =
          LocalExtents(global_shape, mesh.shape(), mesh.coordinate(), cur, m)[d].size;
      const ChunkExtent e = ChunkOf(logical, n, mesh.LocalRank(m));
      if (t.size(d) != e.size) {
        return absl::InternalError(absl::StrCat("embed along dim ", d, ": piece of ", t.size(d),
                                                " where torch.chunk gives ", e.size));
      }
      std::vector<int64_t> shape = t.sizes().vec();
      shape[d] = logical;
      at::Tensor out = at::zeros(shape, t.options());
      out.narrow(d, e.offset, e.size).copy_(t);
      return out;
    }
    case StepKind::kPartition:
      // PyTorch's Replicate -> Partial: sum splits the value evenly over the
      // mesh dim; avg/max/min are already exact on every coordinate.
      if (step.to.reduce_op() == ReduceOp::kSum) return t / static_cast<double>(n);
      return t.clone();
  }
  return absl::InternalError("unknown redistribute step");
}

// Carries what backward needs; lives in the autograd context as a capsule.
struct RedistributeSpec : torch::CustomClassHolder {
  RedistributeSpec(DeviceMesh m, std::vector<int64_t> g, Placements s, Placements d, Placements gp)
      : mesh(std::move(m)), global_shape(std::move(g)), src(std::move(s)), dst(std::move(d)),
        grad(std::move(gp)) {}
  DeviceMesh mesh;
  std::vector<int64_t> global_shape;
  Placements src, dst, grad;
};

class RedistributeFunction : public torch::autograd::Function<RedistributeFunction> {
 public:
  // local: LocalShape(global, src) -> LocalShape(global, dst)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            const c10::intrusive_ptr<RedistributeSpec>& spec) {
    ctx->saved_data["spec"] = c10::IValue::make_capsule(spec);
    absl::StatusOr<at::Tensor> out =
        RedistributeLocal(local, spec->mesh, spec->global_shape, spec->src, spec->dst);
    if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
    return *out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto spec = c10::static_intrusive_pointer_cast<RedistributeSpec>(
        ctx->saved_data["spec"].toCapsule());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    for (const Placement& p : spec->src) {
      if (p.is_partial() && p.reduce_op() != ReduceOp::kSum) {
        throw std::runtime_error(absl::StrCat("redistribute from ", p.ToString(),
                                              " is not differentiable (only Partial(sum) is)"));
      }
    }
    absl::StatusOr<at::Tensor> g =
        RedistributeLocal(grads[0].contiguous(), spec->mesh, spec->global_shape, spec->grad,
                          DefaultGradPlacements(spec->src));
    if (!g.ok()) throw std::runtime_error(std::string(g.status().message()));
    return {*g, at::Tensor()};
  }
};

}  // namespace

absl::StatusOr<at::Tensor> RedistributeLocal(const at::Tensor& local, const DeviceMesh& mesh,
                                             absl::Span<const int64_t> global_shape,
                                             absl::Span<const Placement> src,
                                             absl::Span<const Placement> dst) {
  const std::vector<int64_t> expected =
      LocalShape(global_shape, mesh.shape(), mesh.coordinate(), src);
  if (local.sizes().vec() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", mesh.global_rank(), ": local tensor has shape (",
        absl::StrJoin(local.sizes(), ", "), ") but a global (", absl::StrJoin(global_shape, ", "),
        ") placed ", PlacementsToString(src), " needs (", absl::StrJoin(expected, ", "), ")"));
  }
  std::vector<Placement> cur(src.begin(), src.end());
  at::Tensor t = local;
  for (const RedistributeStep& step : PlanRedistribute(src, dst)) {
    absl::StatusOr<at::Tensor> next = RunStep(step, t, mesh, global_shape, cur);
    if (!next.ok()) {
      return absl::Status(next.status().code(),
                          absl::StrCat("redistribute ", PlacementsToString(src), " -> ",
                                       PlacementsToString(dst), ": ", next.status().message()));
    }
    t = *next;
    cur[step.mesh_dim] = step.to;
  }
  return t;
}

absl::StatusOr<at::Tensor> RedistributeLocalAutograd(const at::Tensor& local,
                                                     const DeviceMesh& mesh,
                                                     absl::Span<const int64_t> global_shape,
                                                     absl::Span<const Placement> src,
                                                     absl::Span<const Placement> dst,
                                                     absl::Span<const Placement> grad_placements) {
  Placements grad = grad_placements.empty() ? DefaultGradPlacements(dst)
                                            : Placements(grad_placements.begin(),
                                                         grad_placements.end());
  if (grad.size() != dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("grad placements ", PlacementsToString(grad),
                                                   " do not match ", PlacementsToString(dst)));
  }
  if (!local.requires_grad() || !at::GradMode::is_enabled()) {
    return RedistributeLocal(local, mesh, global_shape, src, dst);
  }
  if (src == dst && grad == DefaultGradPlacements(src)) return local;
  auto spec = c10::make_intrusive<RedistributeSpec>(
      mesh, std::vector<int64_t>(global_shape.begin(), global_shape.end()),
      Placements(src.begin(), src.end()), Placements(dst.begin(), dst.end()), std::move(grad));
  try {
    return RedistributeFunction::apply(local, spec);
  } catch (const std::exception& e) {
    return absl::InternalError(::tpudist::collectives::ExceptionMessage(e));
  }
}

}  // namespace tpudist::fsdp
