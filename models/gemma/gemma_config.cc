#include "models/gemma/gemma_config.h"

#include <cmath>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

// The positive values normal in both float32 and bfloat16 (same exponent
// range; bf16's largest finite value is a little below fp32's).
constexpr double kMinComputeValue = 1.1754943508222875e-38;  // FLT_MIN
constexpr double kMaxComputeValue = 3.3895313892515355e38;   // bf16 max

absl::Status FieldError(absl::string_view source, absl::string_view field,
                        absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": field '", field, "': ", what));
}

// Reads an integer field; required fields fail when absent.
absl::Status ReadInt(const json& j, absl::string_view source, const char* field,
                     bool required, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    return required ? FieldError(source, field, "missing") : absl::OkStatus();
  }
  if (!it->is_number_integer()) return FieldError(source, field, "not an integer");
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& j, absl::string_view source, const char* field,
                        double* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return FieldError(source, field, "not a number");
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& j, absl::string_view source, const char* field,
                      bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(source, field, "not a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadRope(const json& j, absl::string_view source, absl::string_view field,
                      RopeParameters* out) {
  if (!j.is_object()) return FieldError(source, field, "not an object");
  if (auto it = j.find("rope_type"); it != j.end()) {
    if (!it->is_string()) return FieldError(source, field, "rope_type not a string");
    out->rope_type = it->get<std::string>();
  }
  if (out->rope_type != "default" && out->rope_type != "proportional") {
    return FieldError(source, field, absl::StrCat("unsupported rope_type '", out->rope_type, "'"));
  }
  if (auto st = ReadDouble(j, source, "rope_theta", &out->rope_theta); !st.ok()) return st;
  if (auto st = ReadDouble(j, source, "factor", &out->factor); !st.ok()) return st;
  if (!(out->factor > 0)) return FieldError(source, field, "factor must be positive");
  return ReadDouble(j, source, "partial_rotary_factor", &out->partial_rotary_factor);
}

#define TPU_RETURN_IF_ERROR(expr)          \
  do {                                     \
    absl::Status _st = (expr);             \
    if (!_st.ok()) return _st;             \
  } while (0)

// HF's heterogeneous-layer spelling (transformers >= 5.2x): {"<layer>":
// {"head_dim": D, ...}} listing only the values that differ from the global
// ones. Gemma 4 writes the full-attention layers' head_dim there. When the
// key is present HF ignores `global_head_dim`, and a full layer without an
// override uses the global head_dim. REQUIRES: c->layer_types set.
absl::Status ParsePerLayerConfig(const json& j, absl::string_view source, GemmaConfig* c) {
  if (!j.is_object()) return FieldError(source, "per_layer_config", "not an object");
  // Validate reports a layer_types / num_hidden_layers mismatch.
  if (static_cast<int64_t>(c->layer_types.size()) != c->num_hidden_layers) return absl::OkStatus();
  std::optional<int64_t> full_dim;
  std::vector<bool> has_head_dim(c->num_hidden_layers, false);
  // Keys are layer indices, zero-padded by transformers ("04" of 35 layers).
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string field = absl::StrCat("per_layer_config.", it.key());
    int64_t layer = -1;
    if (!absl::SimpleAtoi(it.key(), &layer) || layer < 0 || layer >= c->num_hidden_layers) {
      return FieldError(source, field, "not a layer index in [0, num_hidden_layers)");
    }
    if (!it->is_object()) return FieldError(source, field, "not an object");
    for (auto o = it->begin(); o != it->end(); ++o) {
      const std::string key = absl::StrCat(field, ".", o.key());
      if (!o->is_number_integer()) return FieldError(source, key, "only integer overrides are supported");
      const int64_t v = o->get<int64_t>();
      if (o.key() == "head_dim") {
        if (c->layer_types[layer] != LayerType::kFull) {
          if (v != c->head_dim) return FieldError(source, key, "a sliding layer cannot override head_dim");
          continue;
        }
        if (full_dim && *full_dim != v) {
          return FieldError(source, key, absl::StrCat("full layers disagree on head_dim (", *full_dim, " vs ", v, ")"));
        }
        full_dim = v;
        has_head_dim[layer] = true;
      } else if (o.key() == "num_key_value_heads") {
        if (v != c->num_key_value_heads) {
          return FieldError(source, key, "per-layer num_key_value_heads is not supported");
        }
      } else {
        return FieldError(source, key, "unsupported per-layer override");
      }
    }
  }
  c->global_head_dim = full_dim.value_or(c->head_dim);
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    if (c->layer_types[i] != LayerType::kFull || !full_dim) continue;
    if (!has_head_dim[i]) {
      return FieldError(source, absl::StrCat("per_layer_config.", i),
                        absl::StrCat("full layer without the head_dim ", *full_dim, " of the other full layers"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GemmaConfig> ParseText(const json& t, absl::string_view source) {
  GemmaConfig c;
  // Defaults that depend on nothing else (HF Gemma4TextConfig class defaults).
  c.global_head_dim = 512;
  c.hidden_size_per_layer_input = 256;
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "vocab_size", true, &c.vocab_size));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "hidden_size", true, &c.hidden_size));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "intermediate_size", true, &c.intermediate_size));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "num_hidden_layers", true, &c.num_hidden_layers));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "num_attention_heads", true, &c.num_attention_heads));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "num_key_value_heads", true, &c.num_key_value_heads));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "head_dim", true, &c.head_dim));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "global_head_dim", false, &c.global_head_dim));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "hidden_size_per_layer_input", false,
                              &c.hidden_size_per_layer_input));
  c.vocab_size_per_layer_input = 262144;  // HF default, independent of vocab_size
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "vocab_size_per_layer_input", false,
                              &c.vocab_size_per_layer_input));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "sliding_window", false, &c.sliding_window));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "num_kv_shared_layers", false, &c.num_kv_shared_layers));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "max_position_embeddings", false,
                              &c.max_position_embeddings));
  TPU_RETURN_IF_ERROR(ReadBool(t, source, "use_double_wide_mlp", &c.use_double_wide_mlp));
  TPU_RETURN_IF_ERROR(ReadBool(t, source, "tie_word_embeddings", &c.tie_word_embeddings));
  TPU_RETURN_IF_ERROR(ReadDouble(t, source, "rms_norm_eps", &c.rms_norm_eps));
  TPU_RETURN_IF_ERROR(ReadDouble(t, source, "initializer_range", &c.initializer_range));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "pad_token_id", false, &c.pad_token_id));
  TPU_RETURN_IF_ERROR(ReadInt(t, source, "bos_token_id", false, &c.bos_token_id));
  if (auto it = t.find("final_logit_softcapping"); it != t.end() && !it->is_null()) {
    if (!it->is_number()) return FieldError(source, "final_logit_softcapping", "not a number");
    c.final_logit_softcapping = it->get<double>();
  }
  if (auto it = t.find("eos_token_id"); it != t.end() && !it->is_null()) {
    c.eos_token_ids.clear();
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) return FieldError(source, "eos_token_id", "not an integer");
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      return FieldError(source, "eos_token_id", "not an integer or list");
    }
  }
  if (auto it = t.find("hidden_activation"); it != t.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError(source, "hidden_activation", "not a string");
    c.hidden_activation = it->get<std::string>();
    if (c.hidden_activation != "gelu_pytorch_tanh") {
      return FieldError(source, "hidden_activation", "only gelu_pytorch_tanh is supported");
    }
  }
  if (auto it = t.find("enable_moe_block"); it != t.end() && it->is_boolean() && it->get<bool>()) {
    return FieldError(source, "enable_moe_block", "MoE blocks are not supported");
  }
  if (auto it = t.find("attention_k_eq_v"); it != t.end() && it->is_boolean() && it->get<bool>()) {
    return FieldError(source, "attention_k_eq_v", "k_eq_v attention is not supported");
  }
  if (auto it = t.find("use_bidirectional_attention"); it != t.end() && it->is_string() &&
                                                      it->get<std::string>() == "all") {
    return FieldError(source, "use_bidirectional_attention", "bidirectional attention is not supported");
  }
  if (auto it = t.find("layer_types"); it != t.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError(source, "layer_types", "not a list");
    for (const auto& e : *it) {
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s == "sliding_attention") {
        c.layer_types.push_back(LayerType::kSliding);
      } else if (s == "full_attention") {
        c.layer_types.push_back(LayerType::kFull);
      } else {
        return FieldError(source, "layer_types", absl::StrCat("unknown layer type '", s, "'"));
      }
    }
  } else {
    // HF Gemma4TextConfig derivation: a fixed 5:1 pattern (every 6th layer full).
    // Bounded first: a hostile num_hidden_layers (1e12) must not reach the allocator.
    if (c.num_hidden_layers > kMaxLayers) {
      return FieldError(source, "num_hidden_layers", absl::StrCat(c.num_hidden_layers, " exceeds ", kMaxLayers));
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_types.push_back((i + 1) % 6 == 0 ? LayerType::kFull : LayerType::kSliding);
    }
  }
  // HF forces the last layer to full attention (with a warning) in both cases.
  if (!c.layer_types.empty()) c.layer_types.back() = LayerType::kFull;
  if (auto it = t.find("per_layer_config"); it != t.end() && !it->is_null()) {
    TPU_RETURN_IF_ERROR(ParsePerLayerConfig(*it, source, &c));
  }
  c.full_rope = RopeParameters{"proportional", 1e6, 0.25};
  if (auto it = t.find("rope_parameters"); it != t.end() && !it->is_null()) {
    if (!it->is_object()) return FieldError(source, "rope_parameters", "not an object");
    if (auto s = it->find("sliding_attention"); s != it->end()) {
      c.sliding_rope = RopeParameters{};
      TPU_RETURN_IF_ERROR(ReadRope(*s, source, "rope_parameters.sliding_attention", &c.sliding_rope));
    }
    if (auto f = it->find("full_attention"); f != it->end()) {
      c.full_rope = RopeParameters{};
      TPU_RETURN_IF_ERROR(ReadRope(*f, source, "rope_parameters.full_attention", &c.full_rope));
    }
  }
  TPU_RETURN_IF_ERROR(c.Validate(source));
  return c;
}

json RopeJson(const RopeParameters& r) {
  json j = {{"rope_type", r.rope_type}, {"rope_theta", r.rope_theta}};
  if (r.rope_type == "proportional") j["partial_rotary_factor"] = r.partial_rotary_factor;
  if (r.factor != 1.0) j["factor"] = r.factor;
  return j;
}

}  // namespace

absl::string_view LayerTypeName(LayerType type) {
  return type == LayerType::kSliding ? "sliding_attention" : "full_attention";
}

int64_t GemmaConfig::HeadDim(int64_t layer) const {
  return layer_types[layer] == LayerType::kFull && global_head_dim > 0 ? global_head_dim : head_dim;
}

int64_t GemmaConfig::IntermediateSize(int64_t layer) const {
  return use_double_wide_mlp && IsKvShared(layer) ? 2 * intermediate_size : intermediate_size;
}

const RopeParameters& GemmaConfig::Rope(LayerType type) const {
  return type == LayerType::kSliding ? sliding_rope : full_rope;
}

int64_t GemmaConfig::KvSourceLayer(int64_t layer) const {
  if (!IsKvShared(layer)) return layer;
  for (int64_t i = FirstKvSharedLayer() - 1; i >= 0; --i) {
    if (layer_types[i] == layer_types[layer]) return i;
  }
  return -1;
}

bool GemmaConfig::StoresSharedKv(int64_t layer) const {
  if (IsKvShared(layer) || num_kv_shared_layers == 0) return false;
  for (int64_t i = FirstKvSharedLayer() - 1; i > layer; --i) {
    if (layer_types[i] == layer_types[layer]) return false;
  }
  return true;
}

absl::Status GemmaConfig::Validate(absl::string_view source) const {
  struct {
    const char* name;
    int64_t value;
    int64_t min, max;
  } sizes[] = {{"vocab_size", vocab_size, 1, kMaxVocabSize},
               {"hidden_size", hidden_size, 1, kMaxHiddenSize},
               {"intermediate_size", intermediate_size, 1, kMaxIntermediateSize},
               {"num_hidden_layers", num_hidden_layers, 1, kMaxLayers},
               {"num_attention_heads", num_attention_heads, 1, kMaxHeads},
               {"num_key_value_heads", num_key_value_heads, 1, kMaxHeads},
               {"head_dim", head_dim, 1, kMaxHeadDim},
               {"global_head_dim", global_head_dim, 0, kMaxHeadDim},  // 0: head_dim
               {"hidden_size_per_layer_input", hidden_size_per_layer_input, 0, kMaxHiddenSize},
               {"vocab_size_per_layer_input", vocab_size_per_layer_input, 1, kMaxVocabSize},
               {"sliding_window", sliding_window, 1, kMaxPositions},
               {"max_position_embeddings", max_position_embeddings, 1, kMaxPositions}};
  for (const auto& f : sizes) {
    if (f.value < f.min || f.value > f.max) {
      return FieldError(source, f.name, absl::StrCat(f.value, " is outside the supported range [", f.min, ", ",
                                                     f.max, "]"));
    }
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return FieldError(source, "num_key_value_heads",
                      absl::StrCat(num_key_value_heads, " must divide num_attention_heads ", num_attention_heads));
  }
  if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
    return FieldError(source, "layer_types",
                      absl::StrCat("has ", layer_types.size(), " entries, num_hidden_layers is ",
                                   num_hidden_layers));
  }
  if (num_kv_shared_layers < 0 || num_kv_shared_layers >= num_hidden_layers) {
    return FieldError(source, "num_kv_shared_layers", "must be in [0, num_hidden_layers)");
  }
  for (int64_t i = 0; i < num_hidden_layers; ++i) {
    if (HeadDim(i) % 2 != 0) return FieldError(source, "head_dim", "must be even");
    if (KvSourceLayer(i) < 0) {
      return FieldError(source, "num_kv_shared_layers",
                        absl::StrCat("shared layer ", i, " has no earlier ", LayerTypeName(layer_types[i]),
                                     " layer to share K/V with"));
    }
  }
  // The per-layer embedding is indexed by the token ids themselves.
  if (hidden_size_per_layer_input > 0 && vocab_size_per_layer_input < vocab_size) {
    return FieldError(source, "vocab_size_per_layer_input",
                      absl::StrCat(vocab_size_per_layer_input, " is smaller than vocab_size ", vocab_size));
  }
  std::vector<std::pair<const char*, int64_t>> ids = {{"pad_token_id", pad_token_id}, {"bos_token_id", bos_token_id}};
  for (int64_t eos : eos_token_ids) ids.emplace_back("eos_token_id", eos);
  for (const auto& [name, id] : ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError(source, name, absl::StrCat(id, " is not a token id in [0, vocab_size ", vocab_size, ")"));
    }
  }
  // Real-valued fields: finite and positive (initializer_range may be 0);
  // partial_rotary_factor in (0, 1].
  const double softcap = final_logit_softcapping.value_or(1.0);
  const struct {
    const char* name;
    double value;
    bool ok;
  } reals[] = {
      {"rms_norm_eps", rms_norm_eps, rms_norm_eps > 0},
      {"initializer_range", initializer_range, initializer_range >= 0},
      {"final_logit_softcapping", softcap, softcap > 0},
      {"rope_parameters.sliding_attention.rope_theta", sliding_rope.rope_theta, sliding_rope.rope_theta > 0},
      {"rope_parameters.full_attention.rope_theta", full_rope.rope_theta, full_rope.rope_theta > 0},
      {"rope_parameters.sliding_attention.factor", sliding_rope.factor, sliding_rope.factor > 0},
      {"rope_parameters.full_attention.factor", full_rope.factor, full_rope.factor > 0},
      {"rope_parameters.sliding_attention.partial_rotary_factor", sliding_rope.partial_rotary_factor,
       sliding_rope.partial_rotary_factor > 0 && sliding_rope.partial_rotary_factor <= 1},
      {"rope_parameters.full_attention.partial_rotary_factor", full_rope.partial_rotary_factor,
       full_rope.partial_rotary_factor > 0 && full_rope.partial_rotary_factor <= 1},
  };
  for (const auto& r : reals) {
    if (!r.ok || !std::isfinite(r.value)) {
      return FieldError(source, r.name, absl::StrCat(r.value, " is out of range (must be finite and positive; "
                                                              "partial_rotary_factor at most 1)"));
    }
  }
  // Representable where used: these enter fp32 / bf16 tensor arithmetic
  // (logits / cap, mean(x^2) + eps, pow(theta, .), inv_freq / factor), where
  // a value that is 0, subnormal or inf after the cast breaks the model
  // silently (a softcap of 1e-300 passes "> 0" and is 0 in fp32: NaN logits).
  const struct {
    const char* name;
    double value;
  } computed[] = {
      {"rms_norm_eps", rms_norm_eps},
      {"final_logit_softcapping", softcap},
      {"rope_parameters.sliding_attention.rope_theta", sliding_rope.rope_theta},
      {"rope_parameters.full_attention.rope_theta", full_rope.rope_theta},
      {"rope_parameters.sliding_attention.factor", sliding_rope.factor},
      {"rope_parameters.full_attention.factor", full_rope.factor},
  };
  for (const auto& r : computed) {
    if (r.value < kMinComputeValue || r.value > kMaxComputeValue) {
      return FieldError(source, r.name,
                        absl::StrCat(r.value, " is ", r.value < kMinComputeValue ? "0 or subnormal" : "inf",
                                     " in float32/bfloat16, the dtypes the model computes it in (must be in [",
                                     kMinComputeValue, ", ", kMaxComputeValue, "])"));
    }
  }
  if (!tie_word_embeddings) {
    return FieldError(source, "tie_word_embeddings", "only tied embeddings are supported");
  }
  return absl::OkStatus();
}

absl::StatusOr<GemmaConfig> GemmaConfigFromJson(const json& j, absl::string_view source) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return FieldError(source, "model_type", "missing");
  const std::string model_type = mt->get<std::string>();
  if (auto arch = j.find("architectures"); arch != j.end() && arch->is_array()) {
    for (const auto& a : *arch) {
      const std::string s = a.is_string() ? a.get<std::string>() : "";
      if (s.rfind("Gemma4", 0) != 0) {
        return FieldError(source, "architectures", absl::StrCat("unsupported architecture '", s, "'"));
      }
    }
  }
  if (model_type == "gemma4") {
    auto tc = j.find("text_config");
    if (tc == j.end() || !tc->is_object()) return FieldError(source, "text_config", "missing");
    json text = *tc;
    // Token ids and tying may sit on the wrapper only.
    for (const char* k : {"pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings"}) {
      if (!text.contains(k) && j.contains(k)) text[k] = j[k];
    }
    return ParseText(text, absl::StrCat(source, ": text_config"));
  }
  if (model_type == "gemma4_text") return ParseText(j, source);
  return FieldError(source, "model_type",
                    absl::StrCat("unsupported model_type '", model_type, "' (want gemma4 or gemma4_text)"));
}

absl::StatusOr<GemmaConfig> LoadGemmaConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  return GemmaConfigFromJson(j, path);
}

json GemmaConfigToHfJson(const GemmaConfig& c, bool multimodal_wrapper) {
  json types = json::array();
  for (LayerType t : c.layer_types) types.push_back(std::string(LayerTypeName(t)));
  json eos = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  json text = {
      {"model_type", "gemma4_text"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"global_head_dim", c.global_head_dim},
      {"hidden_size_per_layer_input", c.hidden_size_per_layer_input},
      {"vocab_size_per_layer_input", c.vocab_size_per_layer_input},
      {"sliding_window", c.sliding_window},
      {"num_kv_shared_layers", c.num_kv_shared_layers},
      {"max_position_embeddings", c.max_position_embeddings},
      {"use_double_wide_mlp", c.use_double_wide_mlp},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"final_logit_softcapping",
       c.final_logit_softcapping ? json(*c.final_logit_softcapping) : json(nullptr)},
      {"rms_norm_eps", c.rms_norm_eps},
      {"initializer_range", c.initializer_range},
      {"hidden_activation", c.hidden_activation},
      {"layer_types", types},
      {"rope_parameters",
       {{"sliding_attention", RopeJson(c.sliding_rope)}, {"full_attention", RopeJson(c.full_rope)}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attention_k_eq_v", false},
      {"enable_moe_block", false},
      {"pad_token_id", c.pad_token_id},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", eos},
      {"dtype", "float32"},
  };
  if (!multimodal_wrapper) {
    text["architectures"] = {"Gemma4ForCausalLM"};
    return text;
  }
  return json{{"model_type", "gemma4"},
              {"architectures", {"Gemma4ForConditionalGeneration"}},
              {"text_config", text},
              {"vision_config", nullptr},
              {"audio_config", nullptr},
              {"tie_word_embeddings", c.tie_word_embeddings},
              {"pad_token_id", c.pad_token_id},
              {"bos_token_id", c.bos_token_id},
              {"eos_token_id", eos},
              {"dtype", "float32"}};
}

GemmaConfig GemmaE2BConfig() {
  GemmaConfig c;
  c.vocab_size = 262144;
  c.hidden_size = 1536;
  c.intermediate_size = 6144;
  c.num_hidden_layers = 35;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 1;
  c.head_dim = 256;
  c.global_head_dim = 512;
  c.hidden_size_per_layer_input = 256;
  c.vocab_size_per_layer_input = 262144;
  c.sliding_window = 512;
  c.num_kv_shared_layers = 20;
  c.use_double_wide_mlp = true;
  c.final_logit_softcapping = 30.0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_types.push_back((i % 5) == 4 ? LayerType::kFull : LayerType::kSliding);
  }
  c.sliding_rope = RopeParameters{"default", 1e4, 1.0};
  c.full_rope = RopeParameters{"proportional", 1e6, 0.25};
  return c;
}

GemmaConfig GemmaTinyConfig() {
  GemmaConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.global_head_dim = 32;
  c.hidden_size_per_layer_input = 16;
  c.vocab_size_per_layer_input = 512;
  c.sliding_window = 8;
  c.num_kv_shared_layers = 2;
  c.use_double_wide_mlp = true;
  c.final_logit_softcapping = 30.0;
  c.max_position_embeddings = 2048;
  c.layer_types = {LayerType::kSliding, LayerType::kSliding, LayerType::kFull,
                   LayerType::kSliding, LayerType::kSliding, LayerType::kFull};
  c.sliding_rope = RopeParameters{"default", 1e4, 1.0};
  c.full_rope = RopeParameters{"proportional", 1e6, 0.25};
  return c;
}

}  // namespace tpudist::models::gemma
