#include "models/gemma/parallelize_gemma.h"

#include <memory>
#include <utility>


#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::models::gemma {
namespace {

constexpr char kPleWeight[] = "model.embed_tokens_per_layer.weight";

fsdp::FullyShardOptions ShardOptions(const GemmaParallelOptions& options, std::string label) {
  fsdp::FullyShardOptions o;
  o.mp_policy.param_dtype = options.param_dtype;
  o.mp_policy.reduce_dtype = options.reduce_dtype;
  o.prefetch = options.prefetch;
  o.label = std::move(label);
  return o;
}

// Casts a tensor FullyShard does not manage to `dtype`, keeping its
// TensorImpl (module members alias it).
void CastInPlace(at::Tensor& t, at::ScalarType dtype) {
  if (t.defined() && t.is_floating_point() && t.scalar_type() != dtype) {
    at::NoGradGuard no_grad;
    t.set_data(t.to(dtype));
  }
}

}  // namespace

GemmaShardingPlan MakeGemmaShardingPlan(const GemmaConfig& config, bool freeze_ple) {
  GemmaShardingPlan plan;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    plan.sharded_modules.push_back(absl::StrCat("model.layers.", i, ".mlp"));
  }
  plan.sharded_modules.push_back("");  // the root, last
  if (freeze_ple && config.hidden_size_per_layer_input > 0) {
    plan.frozen_params.push_back(kPleWeight);
    plan.ignored_params.push_back(kPleWeight);
  }
  return plan;
}

absl::StatusOr<fsdp::ParallelizePlan> MakeGemmaTpPlan(const GemmaConfig& config, int64_t tp) {
  if (tp < 1 || config.num_attention_heads % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp, " does not divide the ",
                                                   config.num_attention_heads, " attention heads"));
  }
  const std::string attn = "model.layers.*.self_attn.";
  const std::string mlp = "model.layers.*.mlp.";
  fsdp::ParallelizePlan plan = {
      {attn + "q_proj", fsdp::ColwiseParallel()},
      {attn + "o_proj", fsdp::RowwiseParallel()},
      {attn + "q_norm", fsdp::ReplicateWithPartialGrad()},
  };
  const bool has_kv = config.num_hidden_layers > config.num_kv_shared_layers;
  if (has_kv && config.num_key_value_heads % tp == 0) {
    plan.push_back({attn + "k_proj", fsdp::ColwiseParallel()});
    plan.push_back({attn + "v_proj", fsdp::ColwiseParallel()});
    plan.push_back({attn + "k_norm", fsdp::ReplicateWithPartialGrad()});
  } else if (has_kv) {
    plan.push_back({attn + "k_norm", fsdp::ReplicateOutputWithPartialGrad()});
    plan.push_back({attn + "v_norm", fsdp::ReplicateOutputWithPartialGrad()});
  }
  plan.push_back({mlp + "gate_proj", fsdp::ColwiseParallel()});
  plan.push_back({mlp + "up_proj", fsdp::ColwiseParallel()});
  plan.push_back({mlp + "down_proj", fsdp::RowwiseParallel()});
  return plan;
}

at::Tensor PleWeight(GemmaForCausalLMImpl& model) {
  if (model.model->embed_tokens_per_layer.is_empty()) return {};
  return model.model->embed_tokens_per_layer->weight;
}

absl::StatusOr<fsdp::FsdpModule> ParallelizeGemma(GemmaForCausalLM& model,
                                                  const fsdp::DeviceMesh& full_mesh,
                                                  const GemmaParallelOptions& options) {
  fsdp::DeviceMesh mesh = full_mesh;
  if (fsdp::IsHsdpMesh(full_mesh)) {
    // HSDP: FullyShard takes the 2-D mesh as it is (shard over dp_shard,
    // replicate over dp_replicate); no TP.
  } else if (full_mesh.ndim() == 2) {
    absl::StatusOr<fsdp::DeviceMesh> tp = full_mesh.Slice("tp");
    absl::StatusOr<fsdp::DeviceMesh> dp = full_mesh.Slice("dp");
    if (!tp.ok() || !dp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ParallelizeGemma: a 2-D mesh needs dims named (\"dp\", \"tp\") or (\"dp_replicate\", \"dp_shard\"), got ",
          full_mesh.ToString()));
    }
    absl::StatusOr<fsdp::ParallelizePlan> tp_plan = MakeGemmaTpPlan(model->config(), tp->size());
    if (!tp_plan.ok()) return tp_plan.status();
    absl::Status s = fsdp::ParallelizeModule(model.ptr(), *tp, *tp_plan);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("ParallelizeGemma: tensor parallel: ", s.message()));
    mesh = *dp;
  } else if (full_mesh.ndim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParallelizeGemma: needs a 1-D, a (dp, tp) or a (dp_replicate, dp_shard) mesh, got ",
                     full_mesh.ToString()));
  }
  const GemmaShardingPlan plan = MakeGemmaShardingPlan(model->config(), options.freeze_ple);
  auto params = model->named_parameters(/*recurse=*/true);
  std::vector<at::Tensor> ignored;
  for (const std::string& name : plan.frozen_params) {
    at::Tensor* p = params.find(name);
    if (p == nullptr) return absl::InternalError(absl::StrCat("ParallelizeGemma: no parameter ", name));
    p->requires_grad_(false);
  }
  for (const std::string& name : plan.ignored_params) ignored.push_back(*params.find(name));
  if (options.param_dtype.has_value()) {
    for (at::Tensor& t : ignored) CastInPlace(t, *options.param_dtype);
    for (auto& item : model->named_buffers(/*recurse=*/true)) CastInPlace(item.value(), *options.param_dtype);
  }
  auto modules = model->named_modules(/*name_prefix=*/"", /*include_self=*/false);
  for (const std::string& fqn : plan.sharded_modules) {
    if (fqn.empty()) break;  // the root goes last, below
    std::shared_ptr<torch::nn::Module>* m = modules.find(fqn);
    if (m == nullptr) return absl::InternalError(absl::StrCat("ParallelizeGemma: no module ", fqn));
    absl::StatusOr<fsdp::FsdpModule> sharded = fsdp::FullyShard(*m, mesh, ShardOptions(options, fqn));
    if (!sharded.ok()) {
      return absl::Status(sharded.status().code(),
                          absl::StrCat("ParallelizeGemma: ", fqn, ": ", sharded.status().message()));
    }
  }
  fsdp::FullyShardOptions root = ShardOptions(options, "root");
  root.ignored_params = std::move(ignored);
  absl::StatusOr<fsdp::FsdpModule> sharded = fsdp::FullyShard(model.ptr(), mesh, root);
  if (!sharded.ok()) {
    return absl::Status(sharded.status().code(),
                        absl::StrCat("ParallelizeGemma: root: ", sharded.status().message()));
  }
  return sharded;
}

}  // namespace tpudist::models::gemma
