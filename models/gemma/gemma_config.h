// GemmaConfig: the hyper-parameters of a Gemma 4 text decoder, parsed from a
// Hugging Face config.json (either the multimodal `gemma4` wrapper, whose
// `text_config` holds the decoder, or a bare `gemma4_text` config).
//
// Field names and defaults follow transformers' Gemma4TextConfig. The
// derived per-layer facts (head dim, MLP width, which layer's K/V a shared
// layer reuses) are pure functions of the config and live here so the module
// code, the loader and the sharding plan agree on them.
//
// Thread-safety: a plain value type.
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_CONFIG_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::models::gemma {

enum class LayerType { kSliding, kFull };

// "sliding_attention" / "full_attention" (HF spelling).
absl::string_view LayerTypeName(LayerType type);

// One entry of HF's `rope_parameters` map.
struct RopeParameters {
  std::string rope_type = "default";  // "default" or "proportional"
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;  // only read for "proportional"
  // Only read for "proportional": every inverse frequency is divided by it
  // (HF _compute_proportional_rope_parameters); the "default" type ignores it
  // as HF's Gemma4TextRotaryEmbedding does.
  double factor = 1.0;
};

// Sanity bounds GemmaConfig::Validate enforces. They sit far above every
// Gemma 4 (E2B: vocab 262144, hidden 1536, MLP 6144 (12288 double-wide),
// 35 layers, 8 heads, head dims 256/512, 131072 positions) and keep a corrupt
// or hostile config.json (vocab_size 1e12) from reaching the allocator, and
// the products of sizes (e.g. vocab x hidden <= 2^40) from overflowing int64.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;  // 16777216 ids
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 18;
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHeads = 1024;
inline constexpr int64_t kMaxHeadDim = 4096;
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;  // max_position_embeddings, sliding_window

struct GemmaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;         // sliding layers
  // Full layers. HF >= 5.x keeps it as per_layer_config {layer: {"head_dim":
  // D}} on the full-attention layers (transformers 5.23 writes only that);
  // the `global_head_dim` key is the older spelling (HF's kwarg, default 512).
  int64_t global_head_dim = 0;
  int64_t hidden_size_per_layer_input = 0;  // 0 disables per-layer embeddings
  int64_t vocab_size_per_layer_input = 0;
  int64_t sliding_window = 512;
  int64_t num_kv_shared_layers = 0;
  int64_t max_position_embeddings = 131072;
  bool use_double_wide_mlp = false;
  bool tie_word_embeddings = true;
  std::optional<double> final_logit_softcapping;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  std::string hidden_activation = "gelu_pytorch_tanh";
  std::vector<LayerType> layer_types;  // size num_hidden_layers
  RopeParameters sliding_rope;         // rope_parameters["sliding_attention"]
  RopeParameters full_rope;            // rope_parameters["full_attention"]
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 2;
  std::vector<int64_t> eos_token_ids = {1};

  // Derived, per layer. REQUIRES: 0 <= layer < num_hidden_layers.
  int64_t FirstKvSharedLayer() const { return num_hidden_layers - num_kv_shared_layers; }
  bool IsKvShared(int64_t layer) const { return layer >= FirstKvSharedLayer(); }
  int64_t HeadDim(int64_t layer) const;
  int64_t IntermediateSize(int64_t layer) const;
  const RopeParameters& Rope(LayerType type) const;
  // The layer whose K/V `layer` attends with: itself when not shared, else the
  // last non-shared layer of the same type. -1 when no such layer exists.
  int64_t KvSourceLayer(int64_t layer) const;
  // True for the last non-shared layer of each type (HF store_full_length_kv).
  bool StoresSharedKv(int64_t layer) const;

  // Checks internal consistency (sizes positive and within the sanity bounds
  // below, head divisibility, layer types length, every shared layer has a
  // source, token ids inside the vocabulary, finite positive epsilons and
  // RoPE parameters; eps, softcap, RoPE theta and factor also normal in
  // float32 and bfloat16, where the model computes with them: 1e-300 is
  // refused as 0 there). Errors name `source` and the field.
  absl::Status Validate(absl::string_view source = "config") const;
};

// Parses a HF config.json document. `source` (usually the file path) is named
// in every error. Unknown model_type / architectures or a missing required
// field is an InvalidArgument error naming the field. `per_layer_config`
// (transformers >= 5.2x) takes precedence over `global_head_dim`, as in HF:
// full-attention layers may override head_dim (all to the same value) and
// num_key_value_heads only to the global value; any other per-layer override
// is an error naming the layer and key.
absl::StatusOr<GemmaConfig> GemmaConfigFromJson(const nlohmann::json& json,
                                                absl::string_view source);

// Reads and parses `path` (a config.json file).
absl::StatusOr<GemmaConfig> LoadGemmaConfig(const std::string& path);

// HF config.json for `config`. With `multimodal_wrapper` the document is a
// `gemma4` Gemma4ForConditionalGeneration config (text_config inside, no
// vision/audio towers), which is what HF's AutoModelForCausalLM expects;
// otherwise a bare `gemma4_text` config.
nlohmann::json GemmaConfigToHfJson(const GemmaConfig& config, bool multimodal_wrapper = true);

// google/gemma-4-E2B text decoder (35 layers, hidden 1536).
GemmaConfig GemmaE2BConfig();

// A tiny debug model of the same architecture: 6 layers [sliding x2, full] x2,
// the last 2 KV-shared, hidden 64, 4 q heads / 1 kv head, head_dim 16,
// global_head_dim 32, vocab 512, per-layer input 16, sliding window 8.
GemmaConfig GemmaTinyConfig();

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_GEMMA_CONFIG_H_
