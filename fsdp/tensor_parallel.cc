#include "fsdp/tensor_parallel.h"

#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fsdp/dtensor.h"
#include "fsdp/global_layout.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/shard_math.h"
#include "nn/layers.h"

namespace tpudist::fsdp {
namespace {

using Placements = std::vector<std::pair<std::string, TpParamPlacement>>;

// Replaces `param`'s data by its piece placed as `placement` (broadcast from
// the mesh's first rank first, so every rank starts from the same values)
// and records where the piece lives.
absl::Status PartitionParam(const std::string& name, at::Tensor& param, const DeviceMesh& mesh,
                            const Placement& placement, Placements* out) {
  if (!param.defined()) return absl::OkStatus();
  TpParamPlacement where;
  where.full_shape = param.sizes().vec();
  if (placement.is_shard()) {
    const int64_t d = placement.dim() < 0 ? placement.dim() + param.dim() : placement.dim();
    where.dim = d;
    where.offset = ChunkOf(param.size(d), mesh.size(0), mesh.LocalRank(0)).offset;
  }
  at::NoGradGuard no_grad;
  absl::StatusOr<DTensor> d = DistributeTensor(param.detach(), mesh, {placement}, mesh.ranks()[0]);
  if (!d.ok()) return d.status();
  param.set_data(d->local());
  if (placement.is_shard()) {
    // The checkpoint reads where this piece lives (fsdp/global_layout.h).
    std::vector<int64_t> offsets(where.full_shape.size(), 0);
    offsets[where.dim] = where.offset;
    absl::Status s = SetGlobalLayout(param, where.full_shape, std::move(offsets));
    if (!s.ok()) return s;
  }
  if (out != nullptr) out->emplace_back(name, std::move(where));
  return absl::OkStatus();
}

// A gradient hook making a replicated parameter's gradient the sum of every
// rank's contribution (used when the module only sees part of the data).
void AllReduceGradInBackward(at::Tensor& param, const DeviceMesh& mesh) {
  if (!param.defined() || !param.requires_grad()) return;
  DeviceMesh m = mesh;
  param.register_hook([m](const at::Tensor& grad) {
    absl::StatusOr<at::Tensor> sum = AllReduceAlongDim(m, 0, grad, ReduceOp::kSum);
    if (!sum.ok()) throw std::runtime_error(std::string(sum.status().message()));
    return *sum;
  });
}

// Replicates every parameter of `module`'s subtree; with `reduce_grads` each
// gradient is all-reduced over the mesh in backward.
absl::Status ReplicateAll(nn::HookableModule& module, const DeviceMesh& mesh, bool reduce_grads,
                          Placements* out) {
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    absl::Status s = PartitionParam(item.key(), p, mesh, Placement::Replicate(), out);
    if (!s.ok()) return s;
    if (reduce_grads) AllReduceGradInBackward(p, mesh);
  }
  return absl::OkStatus();
}

std::vector<int64_t> WithDim(std::vector<int64_t> shape, int64_t dim, int64_t size) {
  shape[dim < 0 ? dim + shape.size() : dim] = size;
  return shape;
}

// `x` declared `from` with `global` shape -> local piece placed `to`; the
// gradient flowing back into the result is read as `grad`.
absl::StatusOr<at::Tensor> Convert(const at::Tensor& x, const DeviceMesh& mesh,
                                   const Placement& from, const Placement& to,
                                   const Placement& grad,
                                   std::optional<std::vector<int64_t>> global = std::nullopt) {
  absl::StatusOr<DTensor> d = FromLocal(x, mesh, {from}, std::move(global));
  if (!d.ok()) return d.status();
  absl::StatusOr<DTensor> r = Redistribute(*d, {to}, {grad});
  if (!r.ok()) return r.status();
  return r->local();
}

// Hooks report through exceptions (the torch boundary).
at::Tensor OrThrow(absl::StatusOr<at::Tensor> t, const std::string& style,
                   const nn::HookableModule& m, const DeviceMesh& mesh) {
  if (t.ok()) return *std::move(t);
  throw std::runtime_error(absl::StrCat(style, " on ", m.name(), " (rank ", mesh.global_rank(),
                                        "): ", t.status().ToString()));
}

absl::Status Unsupported(const std::string& style, const torch::nn::Module& m) {
  return absl::InvalidArgumentError(
      absl::StrCat(style, " supports nn::Linear and nn::Embedding, not ", m.name()));
}

class Colwise : public ParallelStyle {
 public:
  explicit Colwise(ColwiseParallelOptions o) : o_(o) {}
  std::string Name() const override { return "ColwiseParallel"; }

  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                     Placements* out) const override {
    int64_t out_features = 0;
    bool is_linear = false;
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(&module)) {
      is_linear = true;
      out_features = linear->weight.size(0);
      absl::Status s = PartitionParam("weight", linear->weight, mesh, Placement::Shard(0), out);
      if (!s.ok()) return s;
      s = PartitionParam("bias", linear->bias, mesh, Placement::Shard(0), out);
      if (!s.ok()) return s;
    } else if (auto* emb = dynamic_cast<nn::EmbeddingImpl*>(&module)) {
      out_features = emb->weight.size(1);
      absl::Status s = PartitionParam("weight", emb->weight, mesh, Placement::Shard(1), out);
      if (!s.ok()) return s;
    } else {
      return Unsupported(Name(), module);
    }
    const ColwiseParallelOptions o = o_;
    const std::string name = Name();
    // The local input feeds a matmul with a weight shard: its gradient is a
    // Partial sum over the mesh.
    const Placement in_grad = is_linear ? Placement::Partial() : Placement::Replicate();
    module.RegisterPreForwardHook([=](nn::HookableModule& m, std::vector<at::Tensor>& in) {
      in.at(0) = OrThrow(Convert(in.at(0), mesh, o.input_layout, Placement::Replicate(), in_grad),
                         name, m, mesh);
    });
    module.RegisterPostForwardHook([=](nn::HookableModule& m, const std::vector<at::Tensor>&,
                                       std::vector<at::Tensor>& outs) {
      const at::Tensor& y = outs.at(0);  // [..., chunk(out)]
      outs[0] = OrThrow(Convert(y, mesh, Placement::Shard(-1), o.output_layout, o.output_layout,
                                WithDim(y.sizes().vec(), -1, out_features)),
                        name, m, mesh);
    });
    return absl::OkStatus();
  }

 private:
  ColwiseParallelOptions o_;
};

class Rowwise : public ParallelStyle {
 public:
  explicit Rowwise(RowwiseParallelOptions o) : o_(o) {}
  std::string Name() const override { return "RowwiseParallel"; }

  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                     Placements* out) const override {
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(&module)) return ApplyLinear(*linear, mesh, out);
    if (auto* emb = dynamic_cast<nn::EmbeddingImpl*>(&module)) return ApplyEmbedding(*emb, mesh, out);
    return Unsupported(Name(), module);
  }

 private:
  absl::Status ApplyLinear(nn::LinearImpl& linear, const DeviceMesh& mesh, Placements* out) const {
    const int64_t in_features = linear.weight.size(1);
    absl::Status s = PartitionParam("weight", linear.weight, mesh, Placement::Shard(1), out);
    if (!s.ok()) return s;
    s = PartitionParam("bias", linear.bias, mesh, Placement::Replicate(), out);
    if (!s.ok()) return s;
    // The bias is added after the reduction (by the post-hook), once.
    linear.set_bias_in_body(false);
    // A bias added to a sharded output sees only this rank's rows.
    if (o_.output_layout.is_shard()) AllReduceGradInBackward(linear.bias, mesh);
    const RowwiseParallelOptions o = o_;
    const std::string name = Name();
    const Placement in = o.input_layout.value_or(Placement::Shard(-1));
    linear.RegisterPreForwardHook([=](nn::HookableModule& m, std::vector<at::Tensor>& ins) {
      const at::Tensor& x = ins.at(0);
      std::optional<std::vector<int64_t>> global;
      if (in.is_shard() && (in.dim() == -1 || in.dim() == x.dim() - 1)) {
        global = WithDim(x.sizes().vec(), -1, in_features);
      }
      ins[0] = OrThrow(Convert(x, mesh, in, Placement::Shard(-1), Placement::Shard(-1), global),
                       name, m, mesh);
    });
    linear.RegisterPostForwardHook([=](nn::HookableModule& m, const std::vector<at::Tensor>&,
                                       std::vector<at::Tensor>& outs) {
      // outs[0]: [..., out] this rank's summand (no bias).
      at::Tensor y = OrThrow(Convert(outs.at(0), mesh, Placement::Partial(), o.output_layout,
                                     o.output_layout),
                             name, m, mesh);
      const at::Tensor& bias = static_cast<nn::LinearImpl&>(m).bias;
      outs[0] = bias.defined() ? y + bias : y;
    });
    return absl::OkStatus();
  }

  absl::Status ApplyEmbedding(nn::EmbeddingImpl& emb, const DeviceMesh& mesh, Placements* out) const {
    const int64_t vocab = emb.weight.size(0);
    for (int64_t r = 0; r < mesh.size(0); ++r) {
      if (ChunkOf(vocab, mesh.size(0), r).size == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Name(), ": a vocab of ", vocab, " leaves rank ", r, " of ", mesh.size(0),
            " an empty piece of the embedding"));
      }
    }
    const ChunkExtent chunk = ChunkOf(vocab, mesh.size(0), mesh.LocalRank(0));
    absl::Status s = PartitionParam("weight", emb.weight, mesh, Placement::Shard(0), out);
    if (!s.ok()) return s;
    const RowwiseParallelOptions o = o_;
    const std::string name = Name();
    const Placement in = o.input_layout.value_or(Placement::Replicate());
    // Ids outside this rank's vocab range, from the pre- to the post-hook.
    auto outside = std::make_shared<at::Tensor>();
    const int64_t start = chunk.offset, rows = chunk.size;
    emb.RegisterPreForwardHook([=](nn::HookableModule& m, std::vector<at::Tensor>& ins) {
      at::Tensor ids = OrThrow(
          Convert(ins.at(0), mesh, in, Placement::Replicate(), Placement::Replicate()), name, m, mesh);
      *outside = (ids < start).logical_or(ids >= start + rows);
      ins[0] = (ids - start).masked_fill(*outside, 0);
    });
    emb.RegisterPostForwardHook([=](nn::HookableModule& m, const std::vector<at::Tensor>&,
                                    std::vector<at::Tensor>& outs) {
      at::Tensor partial = outs.at(0).masked_fill(outside->unsqueeze(-1), 0.0);
      outside->reset();
      outs[0] = OrThrow(Convert(partial, mesh, Placement::Partial(), o.output_layout,
                                o.output_layout),
                        name, m, mesh);
    });
    return absl::OkStatus();
  }

  RowwiseParallelOptions o_;
};

class Sequence : public ParallelStyle {
 public:
  explicit Sequence(int64_t dim) : dim_(dim) {}
  std::string Name() const override { return "SequenceParallel"; }

  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                     Placements* out) const override {
    absl::Status s = ReplicateAll(module, mesh, /*reduce_grads=*/true, out);
    if (!s.ok()) return s;
    // Input and output are this rank's sequence shard; the module is
    // position-wise (norms, dropout), so it runs on the shard as is.
    const int64_t dim = dim_;
    module.RegisterPreForwardHook([=](nn::HookableModule& m, std::vector<at::Tensor>& in) {
      if (in.at(0).dim() <= dim) {
        throw std::runtime_error(absl::StrCat("SequenceParallel(sequence_dim=", dim, ") on ",
                                              m.name(), " got a ", in[0].dim(), "-d input"));
      }
    });
    return absl::OkStatus();
  }

 private:
  int64_t dim_;
};

class PrepareInput : public ParallelStyle {
 public:
  PrepareInput(Placement in, Placement desired) : in_(in), desired_(desired) {}
  std::string Name() const override { return "PrepareModuleInput"; }
  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh, Placements*) const override {
    const Placement in = in_, desired = desired_;
    const Placement grad = desired.is_partial() ? Placement::Replicate() : desired;
    const std::string name = Name();
    module.RegisterPreForwardHook([=](nn::HookableModule& m, std::vector<at::Tensor>& ins) {
      ins.at(0) = OrThrow(Convert(ins.at(0), mesh, in, desired, grad), name, m, mesh);
    });
    return absl::OkStatus();
  }

 private:
  Placement in_, desired_;
};

class PartialGrad : public ParallelStyle {
 public:
  std::string Name() const override { return "ReplicateWithPartialGrad"; }
  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                     Placements* out) const override {
    const size_t first = out->size();
    absl::Status s = ReplicateAll(module, mesh, /*reduce_grads=*/false, out);
    for (size_t i = first; i < out->size(); ++i) (*out)[i].second.partial_grad = true;
    return s;
  }
};

class PartialOutputGrad : public ParallelStyle {
 public:
  std::string Name() const override { return "ReplicateOutputWithPartialGrad"; }
  absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                     Placements* out) const override {
    absl::Status s = ReplicateAll(module, mesh, /*reduce_grads=*/false, out);
    if (!s.ok()) return s;
    const std::string name = Name();
    module.RegisterPostForwardHook([=](nn::HookableModule& m, const std::vector<at::Tensor>&,
                                       std::vector<at::Tensor>& outs) {
      outs.at(0) = OrThrow(Convert(outs.at(0), mesh, Placement::Replicate(), Placement::Replicate(),
                                   Placement::Partial()),
                           name, m, mesh);
    });
    return absl::OkStatus();
  }
};

}  // namespace

std::shared_ptr<const ParallelStyle> ColwiseParallel(ColwiseParallelOptions options) {
  return std::make_shared<Colwise>(options);
}
std::shared_ptr<const ParallelStyle> RowwiseParallel(RowwiseParallelOptions options) {
  return std::make_shared<Rowwise>(options);
}
std::shared_ptr<const ParallelStyle> SequenceParallel(int64_t sequence_dim) {
  return std::make_shared<Sequence>(sequence_dim);
}
std::shared_ptr<const ParallelStyle> PrepareModuleInput(Placement input_layout,
                                                        Placement desired_input_layout) {
  return std::make_shared<PrepareInput>(input_layout, desired_input_layout);
}
std::shared_ptr<const ParallelStyle> ReplicateWithPartialGrad() {
  return std::make_shared<PartialGrad>();
}
std::shared_ptr<const ParallelStyle> ReplicateOutputWithPartialGrad() {
  return std::make_shared<PartialOutputGrad>();
}

}  // namespace tpudist::fsdp
