// ParallelizeGemma: the fine-tune's sharding plan for GemmaForCausalLM, as
// the seed (ray_train_llm_finetune.py) applies it with FSDP2, and as
// torchtitan keeps one parallelize file per model:
//
//   freeze  model.embed_tokens_per_layer (PLE, the [Vp, L*P] table)
//   for each layer i:  FullyShard(model.layers.i.mlp)           (bottom-up)
//   root:              FullyShard(model, ignored_params = {PLE})
//   mixed precision:   param_dtype (default bf16), reduce_dtype (fp32)
//
// On a 2-D mesh (dims "dp", "tp") tensor parallelism comes first, on the
// "tp" slice, through the same module hooks (fsdp/parallelize_module.h);
// FullyShard then shards the already TP-local tensors over the "dp" slice.
// On a 2-D mesh with dims ("dp_replicate", "dp_shard") (HSDP, e.g. slices x
// devices per slice) there is no TP: FullyShard takes the mesh as it is and
// shards over dp_shard, replicating over dp_replicate (docs/fsdp.md, HSDP).
// The TP plan (MakeGemmaTpPlan), per decoder layer:
//
//   self_attn.q_proj              ColwiseParallel   (H/tp whole query heads)
//   self_attn.o_proj              RowwiseParallel   (all-reduce)
//   self_attn.q_norm              ReplicateWithPartialGrad (sees local heads)
//   KV heads % tp == 0:
//     self_attn.k_proj, v_proj    ColwiseParallel   (KV/tp whole heads)
//     self_attn.k_norm            ReplicateWithPartialGrad
//   otherwise (e.g. 1 KV head):
//     k_proj, v_proj              replicated whole (no style)
//     self_attn.k_norm, v_norm    ReplicateOutputWithPartialGrad (K and V are
//                                 read by this rank's query heads only: their
//                                 gradient is all-reduced over tp, so k/v_proj
//                                 and k_norm get whole gradients)
//   mlp.gate_proj, mlp.up_proj    ColwiseParallel
//   mlp.down_proj                 RowwiseParallel   (all-reduce)
//
// Everything else is replicated over tp and computed redundantly: the token
// embedding (tied lm_head), the PLE table and projection, the per-layer
// input gate/projection, every hidden-size norm, the final norm. KV-shared
// layers read the stored K/V of their source layer in the same (local or
// replicated) layout. On a 2-D mesh the caller runs
// fsdp::AllReducePartialGrads(*model) after every backward (q_norm's, and
// with colwise K k_norm's, gradients are partial over tp until then). Model code stays free of distributed calls; this file
// only registers hooks from outside. The plan itself (which FQNs, what is ignored) is
// a pure function, GemmaShardingPlan, tested on its own.
//
// Dtypes: parameters keep their loaded dtype as the master (fp32 for the
// bundled tiny model; FullyShard keeps master shards and the optimizer in
// it) and are all-gathered in param_dtype. Everything FullyShard does not
// manage but the forward reads together with the gathered weights is cast
// to param_dtype up front: the frozen PLE table (ignored: whole on every
// rank) and the buffers (layer_scalar), so a bf16 forward does not promote
// to fp32 halfway through a layer.
//
// Thread-safety: one training thread per rank; collective over the mesh
// (every rank calls it with the same model structure and options).
#ifndef TPU_DIST_MODELS_GEMMA_PARALLELIZE_GEMMA_H_
#define TPU_DIST_MODELS_GEMMA_PARALLELIZE_GEMMA_H_

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/parallelize_module.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"

namespace tpudist::models::gemma {

struct GemmaParallelOptions {
  // Compute dtype of the gathered parameters; nullopt: the master dtype.
  std::optional<at::ScalarType> param_dtype = at::kBFloat16;
  // Gradient reduce-scatter dtype; nullopt: param_dtype.
  std::optional<at::ScalarType> reduce_dtype = at::kFloat;
  bool freeze_ple = true;  // requires_grad=false + ignored by the root
  bool prefetch = true;
};

// The plan, as module FQNs relative to GemmaForCausalLM. Pure.
struct GemmaShardingPlan {
  std::vector<std::string> sharded_modules;  // in FullyShard order; "" = root
  std::vector<std::string> frozen_params;    // requires_grad=false
  std::vector<std::string> ignored_params;   // the root's ignored_params
};
GemmaShardingPlan MakeGemmaShardingPlan(const GemmaConfig& config, bool freeze_ple);

// The tensor-parallel plan above for `tp` ranks (FQN patterns relative to
// GemmaForCausalLM). InvalidArgument when the query heads do not divide
// over tp. Pure.
absl::StatusOr<fsdp::ParallelizePlan> MakeGemmaTpPlan(const GemmaConfig& config, int64_t tp);

// Applies the plan to `model` in place and returns the root handle. `mesh`:
// 1-D (FullyShard over all of it), 2-D with dims named "dp" and "tp"
// (TP on "tp", then FullyShard on "dp"), or 2-D with dims named
// "dp_replicate" and "dp_shard" (HSDP: FullyShard on the whole mesh). REQUIRES: `model` not yet
// FullyShard-ed, parameters on CPU. Errors come from ParallelizeModule /
// FullyShard (with the module's FQN prepended).
absl::StatusOr<fsdp::FsdpModule> ParallelizeGemma(GemmaForCausalLM& model,
                                                  const fsdp::DeviceMesh& mesh,
                                                  const GemmaParallelOptions& options = {});

// The frozen PLE weight [Vp, L * P], or an undefined tensor when the config
// has no per-layer inputs.
at::Tensor PleWeight(GemmaForCausalLMImpl& model);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_PARALLELIZE_GEMMA_H_
