#include "fsdp/parallelize_module.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace tpudist::fsdp {

void ParallelLayerImpl::Adopt() {
  std::shared_ptr<torch::nn::Module> m = inner_.ptr();
  for (auto& p : m->named_parameters(/*recurse=*/false)) {
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  for (auto& b : m->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (auto& c : m->named_children()) register_module(c.key(), c.value());
}

at::Tensor ParallelLayerImpl::forward(const at::Tensor& x) {
  if (!style_) return inner_.forward(x);
  LayerContext ctx;
  ctx.inner = &inner_;
  ctx.module = inner_.ptr().get();
  ctx.mesh = &*mesh_;
  ctx.full_shapes = &full_shapes_;
  absl::StatusOr<at::Tensor> y = style_->Forward(ctx, x);
  if (!y.ok()) {
    throw std::runtime_error(absl::StrCat(style_->Name(), " forward of ", name(), " on rank ",
                                          mesh_->global_rank(), ": ", y.status().ToString()));
  }
  return *y;
}

absl::Status ParallelLayerImpl::Parallelize(std::shared_ptr<const ParallelStyle> style,
                                            const DeviceMesh& mesh) {
  if (style_) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer is already parallelized with ", style_->Name()));
  }
  if (mesh.ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism needs a 1-D mesh, got ", mesh.ToString(), "; pass mesh.Slice(\"tp\")"));
  }
  std::shared_ptr<torch::nn::Module> m = inner_.ptr();
  for (auto& p : m->named_parameters(/*recurse=*/false)) {
    full_shapes_[p.key()] = p.value().sizes().vec();
  }
  absl::Status s = style->Partition(*m, mesh);
  if (!s.ok()) return s;
  style_ = std::move(style);
  mesh_ = mesh;
  return absl::OkStatus();
}

bool FqnMatches(absl::string_view pattern, absl::string_view fqn) {
  // Iterative glob with one backtrack point per '*'.
  size_t p = 0, f = 0, star = absl::string_view::npos, mark = 0;
  while (f < fqn.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = f;
    } else if (p < pattern.size() && pattern[p] == fqn[f]) {
      ++p;
      ++f;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      f = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::Status ParallelizeModule(const std::shared_ptr<torch::nn::Module>& root,
                               const DeviceMesh& mesh, const ParallelizePlan& plan) {
  if (mesh.ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism needs a 1-D mesh, got ", mesh.ToString(), "; pass mesh.Slice(\"tp\")"));
  }
  for (const auto& [pattern, style] : plan) {
    int matched = 0;
    for (auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      if (item.key().empty() != pattern.empty()) continue;  // "" only names the root
      if (!FqnMatches(pattern, item.key())) continue;
      ++matched;
      auto* layer = dynamic_cast<ParallelLayerImpl*>(item.value().get());
      if (layer == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "plan key '", pattern, "' matches '", item.key(), "' (", item.value()->name(),
            "), which is not a ParallelLayer; hold it in fsdp::ParallelLayer"));
      }
      absl::Status s = layer->Parallelize(style, mesh);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("parallelizing '", item.key(), "' with ",
                                                   style->Name(), ": ", s.message()));
      }
    }
    if (matched == 0) {
      return absl::NotFoundError(
          absl::StrCat("plan key '", pattern, "' matches no submodule of ", root->name()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::fsdp
