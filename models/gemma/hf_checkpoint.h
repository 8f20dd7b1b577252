// Loading a Hugging Face Gemma 4 checkpoint directory into GemmaForCausalLM
// and saving one back in HF format.
//
// A directory holds config.json plus either model.safetensors or a sharded
// model.safetensors.index.json ({"weight_map": {tensor: file}}).
//
// Name mapping (ours -> HF): "model.X" -> "model.language_model.X", e.g.
//   model.layers.3.self_attn.q_proj.weight -> model.language_model.layers.3.self_attn.q_proj.weight
// On load the text-only spelling "model.X" (Gemma4ForCausalLM) is accepted
// too. Skipped on load: model.vision_tower.*, model.audio_tower.*,
// model.embed_vision.*, model.embed_audio.*, lm_head.weight (tied), and the
// k_proj/v_proj/k_norm/v_norm tensors that Google's checkpoints still ship for
// KV-shared layers. Any other unknown tensor, a shape mismatch or a missing
// tensor is an error naming the file and the tensor.
//
// Dtypes are strict: a stored tensor must have the dtype of the model's
// tensor, or both must be floating point (F64/F32/BF16/F16), which is an
// explicit value cast, counted and reported in one line per load ("cast 340
// tensors BF16 -> F32"). Anything else -- I32 bytes where the model holds F32
// (same size: a plain value cast would turn every weight into ~1e9), BOOL,
// int<->int -- is an InvalidArgument naming the file, tensor and both dtypes.
#ifndef TPU_DIST_MODELS_GEMMA_HF_CHECKPOINT_H_
#define TPU_DIST_MODELS_GEMMA_HF_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"

namespace tpudist::models::gemma {

// Our module name -> HF checkpoint name. Pure.
std::string HfNameFor(const std::string& our_name);

enum class HfTensorKind { kMapped, kSkipped, kUnknown };
struct HfTensorClass {
  HfTensorKind kind = HfTensorKind::kUnknown;
  std::string our_name;  // set when kMapped
};
// Classifies a checkpoint tensor name for `config`. Pure.
HfTensorClass ClassifyHfTensor(const std::string& hf_name, const GemmaConfig& config);

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;  // parameters/buffers are converted to this
  // Receives the load's cast line ("<dir>: cast 340 tensors BF16 -> F32 on
  // load"), called at most once per load. Empty: the line goes to stderr.
  std::function<void(const std::string&)> log;
};

// What LoadHfWeights did.
struct HfLoadSummary {
  int64_t tensors = 0;  // tensors loaded into the model
  // (stored dtype, model dtype) -> tensors value-cast, e.g. {"BF16", "F32"} -> 340.
  std::map<std::pair<std::string, std::string>, int64_t> casts;
  // "cast 340 tensors BF16 -> F32, 2 tensors F16 -> F32"; "" without casts.
  std::string CastLine() const;
};

// Reads config.json in `dir`, builds the model and loads every tensor.
absl::StatusOr<GemmaForCausalLM> LoadGemmaFromHf(const std::string& dir, const LoadOptions& options = {});

// Loads the weights in `dir` into an existing `model` (config must match the
// tensors' shapes). Tensors are copied (float-to-float casts only, see the
// top of the file) into the registered parameters and buffers in place.
absl::StatusOr<HfLoadSummary> LoadHfWeights(GemmaForCausalLMImpl& model, const std::string& dir);

struct SaveOptions {
  std::optional<at::ScalarType> dtype;  // default: each tensor's own dtype
  bool multimodal_wrapper = true;       // config.json as gemma4 wrapper (HF names model.language_model.*)
  std::string copy_tokenizer_from;      // if set, copies tokenizer.json / tokenizer_config.json / tokenizer.model
};

// Writes config.json and model.safetensors (HF names, no lm_head since tied)
// into `dir` (created if needed). config.json's "dtype" (top level and
// text_config) is the saved parameters' dtype. transformers 5.23's
// from_pretrained loads the result with no missing or unexpected keys
// (tests/oracles/test_save_as_hf.py).
absl::Status SaveGemmaAsHf(GemmaForCausalLMImpl& model, const std::string& dir, const SaveOptions& options = {});

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_HF_CHECKPOINT_H_
