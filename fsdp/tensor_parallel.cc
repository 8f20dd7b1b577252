#include "fsdp/tensor_parallel.h"

#include <stdexcept>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "absl/strings/str_cat.h"
#include "fsdp/dtensor.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {
namespace {

// Replaces `param`'s data by its piece placed as `placement` (broadcast from
// the mesh's first rank first, so every rank starts from the same values).
absl::Status PartitionParam(at::Tensor& param, const DeviceMesh& mesh, const Placement& placement) {
  if (!param.defined()) return absl::OkStatus();
  at::NoGradGuard no_grad;
  absl::StatusOr<DTensor> d = DistributeTensor(param.detach(), mesh, {placement}, mesh.ranks()[0]);
  if (!d.ok()) return d.status();
  param.set_data(d->local());
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

absl::Status Unsupported(const std::string& style, const torch::nn::Module& m) {
  return absl::InvalidArgumentError(
      absl::StrCat(style, " supports torch::nn::Linear and torch::nn::Embedding, not ", m.name()));
}

class Colwise : public ParallelStyle {
 public:
  explicit Colwise(ColwiseParallelOptions o) : o_(o) {}
  std::string Name() const override { return "ColwiseParallel"; }

  absl::Status Partition(torch::nn::Module& module, const DeviceMesh& mesh) const override {
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
      absl::Status s = PartitionParam(linear->weight, mesh, Placement::Shard(0));
      if (!s.ok()) return s;
      return PartitionParam(linear->bias, mesh, Placement::Shard(0));
    }
    if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
      return PartitionParam(emb->weight, mesh, Placement::Shard(1));
    }
    return Unsupported(Name(), module);
  }

  absl::StatusOr<at::Tensor> Forward(const LayerContext& layer,
                                     const at::Tensor& input) const override {
    const DeviceMesh& mesh = *layer.mesh;
    const bool is_linear = dynamic_cast<torch::nn::LinearImpl*>(layer.module) != nullptr;
    // The local input feeds a matmul with a weight shard: its gradient is a
    // Partial sum over the mesh.
    absl::StatusOr<at::Tensor> x =
        Convert(input, mesh, o_.input_layout, Placement::Replicate(),
                is_linear ? Placement::Partial() : Placement::Replicate());
    if (!x.ok()) return x.status();
    at::Tensor y = layer.inner->forward(*x);  // [..., chunk(out)]
    const std::vector<int64_t>& w = layer.full_shapes->at("weight");
    const int64_t out_features = is_linear ? w[0] : w[1];
    return Convert(y, mesh, Placement::Shard(-1), o_.output_layout, o_.output_layout,
                   WithDim(y.sizes().vec(), -1, out_features));
  }

 private:
  ColwiseParallelOptions o_;
};

class Rowwise : public ParallelStyle {
 public:
  explicit Rowwise(RowwiseParallelOptions o) : o_(o) {}
  std::string Name() const override { return "RowwiseParallel"; }

  absl::Status Partition(torch::nn::Module& module, const DeviceMesh& mesh) const override {
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
      absl::Status s = PartitionParam(linear->weight, mesh, Placement::Shard(1));
      if (!s.ok()) return s;
      s = PartitionParam(linear->bias, mesh, Placement::Replicate());
      if (!s.ok()) return s;
      // A bias added to a sharded output sees only this rank's rows.
      if (o_.output_layout.is_shard()) AllReduceGradInBackward(linear->bias, mesh);
      return absl::OkStatus();
    }
    if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
      return PartitionParam(emb->weight, mesh, Placement::Shard(0));
    }
    return Unsupported(Name(), module);
  }

  absl::StatusOr<at::Tensor> Forward(const LayerContext& layer,
                                     const at::Tensor& input) const override {
    const DeviceMesh& mesh = *layer.mesh;
    const std::vector<int64_t>& w = layer.full_shapes->at("weight");
    at::Tensor partial;  // [..., out] this rank's summand
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(layer.module)) {
      const Placement in = o_.input_layout.value_or(Placement::Shard(-1));
      std::optional<std::vector<int64_t>> global;
      if (in.is_shard() && (in.dim() == -1 || in.dim() == input.dim() - 1)) {
        global = WithDim(input.sizes().vec(), -1, w[1]);  // in_features
      }
      absl::StatusOr<at::Tensor> x =
          Convert(input, mesh, in, Placement::Shard(-1), Placement::Shard(-1), global);
      if (!x.ok()) return x.status();
      partial = at::linear(*x, linear->weight);  // bias after the reduction
      absl::StatusOr<at::Tensor> y = Convert(partial, mesh, Placement::Partial(),
                                             o_.output_layout, o_.output_layout);
      if (!y.ok()) return y.status();
      return linear->bias.defined() ? *y + linear->bias : *y;
    }
    if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(layer.module)) {
      const Placement in = o_.input_layout.value_or(Placement::Replicate());
      absl::StatusOr<at::Tensor> ids =
          Convert(input, mesh, in, Placement::Replicate(), Placement::Replicate());
      if (!ids.ok()) return ids.status();
      const int64_t rows = emb->weight.size(0);
      const int64_t start = ChunkOf(w[0], mesh.size(0), mesh.LocalRank(0)).offset;
      const at::Tensor outside = (*ids < start).logical_or(*ids >= start + rows);
      const at::Tensor local_ids = (*ids - start).masked_fill(outside, 0);
      if (rows == 0) {  // an empty tail shard of the vocab
        std::vector<int64_t> shape = ids->sizes().vec();
        shape.push_back(w[1]);
        partial = at::zeros(shape, emb->weight.options());
      } else {
        partial = at::embedding(emb->weight, local_ids).masked_fill(outside.unsqueeze(-1), 0.0);
      }
      return Convert(partial, mesh, Placement::Partial(), o_.output_layout, o_.output_layout);
    }
    return absl::InvalidArgumentError("RowwiseParallel: unsupported module in forward");
  }

 private:
  RowwiseParallelOptions o_;
};

class Sequence : public ParallelStyle {
 public:
  explicit Sequence(int64_t dim) : dim_(dim) {}
  std::string Name() const override { return "SequenceParallel"; }

  absl::Status Partition(torch::nn::Module& module, const DeviceMesh& mesh) const override {
    for (auto& item : module.named_parameters(/*recurse=*/true)) {
      at::Tensor& p = item.value();
      absl::Status s = PartitionParam(p, mesh, Placement::Replicate());
      if (!s.ok()) return s;
      AllReduceGradInBackward(p, mesh);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> Forward(const LayerContext& layer,
                                     const at::Tensor& input) const override {
    // Input and output are this rank's sequence shard; the module is
    // position-wise (norms, dropout), so it runs on the shard as is.
    if (input.dim() <= dim_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SequenceParallel(sequence_dim=", dim_, ") got a ", input.dim(), "-d input"));
    }
    return layer.inner->forward(input);
  }

 private:
  int64_t dim_;
};

class PrepareInput : public ParallelStyle {
 public:
  PrepareInput(Placement in, Placement desired) : in_(in), desired_(desired) {}
  std::string Name() const override { return "PrepareModuleInput"; }
  absl::Status Partition(torch::nn::Module&, const DeviceMesh&) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<at::Tensor> Forward(const LayerContext& layer,
                                     const at::Tensor& input) const override {
    absl::StatusOr<at::Tensor> x = Convert(input, *layer.mesh, in_, desired_,
                                           desired_.is_partial() ? Placement::Replicate() : desired_);
    if (!x.ok()) return x.status();
    return layer.inner->forward(*x);
  }

 private:
  Placement in_, desired_;
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

}  // namespace tpudist::fsdp
