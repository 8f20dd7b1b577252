// GemmaForCausalLM against HF transformers 5.23's own Gemma4ForCausalLM
// (fixtures from tests/oracles/make_gemma_fixtures.py): a tiny random model
// shaped like E2B in every mechanism, saved by save_pretrained, loaded by our
// loader; logits and loss in fp32 and bf16, greedy generation, the RoPE
// inverse frequencies of transformers' init functions, and transformers' E2B
// configuration field by field. The reverse direction (our SaveGemmaAsHf read
// by transformers' from_pretrained) is tests/oracles/test_save_as_hf.py, which
// runs HfOracleExport below.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_decoder_layer.h"
#include "models/gemma/gemma_model.h"
#include "models/gemma/generation.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/rope.h"
#include "io/safetensors.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

// Measured on this fixture (transformers 5.23 and our build both on the torch
// 2.15 wheel's libtorch, x86-64 CPU): max |ours - HF| over every position of
// every case is 0 in fp32 and 0 in bf16, losses equal to the last bit, greedy
// tokens identical: the same kernels run in the same order. The bounds below
// are the 1e-5 for fp32 and, for bf16, one final rounding step (one
// bf16 ulp at the logit, |x| * 2^-7); an upstream bf16 difference is
// amplified far beyond that by this random model (HF's own fp32 vs bf16
// logits differ by up to 7.7), so a looser bound would not mean much.
constexpr double kFp32LogitTol = 1e-5;
constexpr double kBf16UlpFraction = 1.0 / 128;
constexpr double kLossRelTol = 1e-6;

// $TPU_DIST_ORACLE_FIXTURES (ctest's regeneration on this CPU, see
// tests/oracles/README.md) when set, else the committed fixtures.
std::string FixtureDir() {
  const char* fresh = std::getenv("TPU_DIST_ORACLE_FIXTURES");
  if (fresh != nullptr && *fresh != '\0') return std::string(fresh) + "/gemma";
  return test_support::SourceDir() + "/tests/oracles/fixtures/gemma";
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

struct Case {
  std::string name;
  at::Tensor input_ids;       // [B, S] int64
  at::Tensor attention_mask;  // [B, S] int64 or undefined
  at::Tensor labels;          // [B, S] int64
  at::Tensor logits_fp32;     // [B, S, V] fp32
  at::Tensor logits_bf16;     // [B, S, V] bf16
  double loss_fp32 = 0, loss_bf16 = 0;
};

std::vector<Case> LoadCases() {
  auto file = io::SafetensorsFile::Open(FixtureDir() + "/cases.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<Case> out;
  if (!file.ok()) return out;
  for (const char* name : {"plain", "right", "left"}) {
    auto get = [&](const std::string& k) -> at::Tensor {
      const std::string key = absl::StrCat(name, ".", k);
      if (!(*file)->Contains(key)) return at::Tensor();
      return (*file)->Get(key)->clone();
    };
    Case c;
    c.name = name;
    c.input_ids = get("input_ids");
    c.attention_mask = get("attention_mask");
    c.labels = get("labels");
    c.logits_fp32 = get("logits_fp32");
    c.logits_bf16 = get("logits_bf16");
    c.loss_fp32 = get("loss_fp32").item<double>();
    c.loss_bf16 = get("loss_bf16").item<double>();
    out.push_back(std::move(c));
  }
  return out;
}

GemmaForCausalLM LoadFixtureModel(at::ScalarType dtype) {
  auto model = LoadGemmaFromHf(FixtureDir() + "/model", LoadOptions{dtype});
  EXPECT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  return *model;
}

// Max |a - b| over positions where `mask` (broadcast [B, S]) is set, all
// positions when it is undefined.
double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask = {}) {
  at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs().amax(-1);  // [B, S]
  if (mask.defined()) d = d.masked_select(mask.to(at::kBool));
  return d.numel() == 0 ? 0.0 : d.max().item<double>();
}

TEST(HfOracle, LoadsTransformersSavePretrained) {
  // transformers 5.23 writes the full layers' head_dim only as
  // per_layer_config (no global_head_dim key).
  const json saved = ReadJson(FixtureDir() + "/model/config.json");
  EXPECT_FALSE(saved.contains("global_head_dim"));
  ASSERT_TRUE(saved.contains("per_layer_config"));
  auto config = LoadGemmaConfig(FixtureDir() + "/model/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->global_head_dim, 32);
  EXPECT_EQ(config->num_hidden_layers, 10);
  EXPECT_EQ(config->num_kv_shared_layers, 5);
  EXPECT_EQ(config->sliding_window, 4);
  EXPECT_EQ(config->KvSourceLayer(5), 3);
  EXPECT_EQ(config->KvSourceLayer(9), 4);
  EXPECT_EQ(config->IntermediateSize(4), 64);
  EXPECT_EQ(config->IntermediateSize(5), 128);
  auto model = LoadGemmaFromHf(FixtureDir() + "/model");
  ASSERT_TRUE(model.ok()) << model.status();
  // The randomised norms and layer scalars made it through.
  EXPECT_NE((*model)->model->layers->at<GemmaDecoderLayerImpl>(0).layer_scalar.item<float>(), 1.0f);
}

TEST(HfOracle, Fp32LogitsAndLossMatchTransformers) {
  GemmaForCausalLM model = LoadFixtureModel(at::kFloat);
  at::NoGradGuard no_grad;
  for (const Case& c : LoadCases()) {
    CausalLMOutput out = model->forward(c.input_ids, c.attention_mask, c.labels);
    ASSERT_EQ(out.logits.sizes(), c.logits_fp32.sizes()) << c.name;
    const double all = MaxAbsDiff(out.logits, c.logits_fp32);
    EXPECT_LE(all, kFp32LogitTol) << c.name << ": max |ours - HF| over all positions";
    if (c.attention_mask.defined()) {
      EXPECT_LE(MaxAbsDiff(out.logits, c.logits_fp32, c.attention_mask), kFp32LogitTol) << c.name;
    }
    const double loss = out.loss.item<double>();
    EXPECT_NEAR(loss, c.loss_fp32, kLossRelTol * std::abs(c.loss_fp32)) << c.name;
    std::cout << "[ fp32 ] " << c.name << ": max |logit diff| " << all << ", loss " << loss << " vs HF "
              << c.loss_fp32 << "\n";
  }
}

TEST(HfOracle, Bf16LogitsAndLossMatchTransformers) {
  GemmaForCausalLM model = LoadFixtureModel(at::kBFloat16);
  at::NoGradGuard no_grad;
  for (const Case& c : LoadCases()) {
    CausalLMOutput out = model->forward(c.input_ids, c.attention_mask, c.labels);
    const at::Tensor want = c.logits_bf16.to(at::kDouble);
    const at::Tensor excess = (out.logits.to(at::kDouble) - want).abs() - want.abs() * kBf16UlpFraction;
    EXPECT_LE(excess.max().item<double>(), 0.0) << c.name << ": |ours - HF| beyond one bf16 ulp (bf16)";
    const double all = MaxAbsDiff(out.logits, c.logits_bf16);
    const double loss = out.loss.item<double>();
    EXPECT_NEAR(loss, c.loss_bf16, kLossRelTol * std::abs(c.loss_bf16)) << c.name;
    std::cout << "[ bf16 ] " << c.name << ": max |logit diff| " << all << ", loss " << loss << " vs HF "
              << c.loss_bf16 << " (HF fp32 vs bf16: " << MaxAbsDiff(c.logits_fp32, c.logits_bf16) << ")\n";
  }
}

TEST(HfOracle, GreedyGenerationMatchesTransformers) {
  const json g = ReadJson(FixtureDir() + "/generation.json");
  const auto prompt = g["prompt"].get<std::vector<int64_t>>();
  const int64_t n = g["max_new_tokens"].get<int64_t>();
  for (const char* precision : {"fp32", "bf16"}) {
    GemmaForCausalLM model = LoadFixtureModel(std::string(precision) == "fp32" ? at::kFloat : at::kBFloat16);
    const std::vector<int64_t> ours = GreedyGenerate(*model, prompt, n, /*stop_ids=*/{});
    EXPECT_EQ(ours, g[precision]["tokens"].get<std::vector<int64_t>>()) << precision;
  }
}

TEST(HfOracle, RopeInvFreqEqualsTransformersInit) {
  const json r = ReadJson(FixtureDir() + "/rope.json");
  ASSERT_GE(r["cases"].size(), 5u);
  for (const json& c : r["cases"]) {
    const json& p = c["rope_parameters"];
    RopeParameters params;
    params.rope_type = p["rope_type"].get<std::string>();
    params.rope_theta = p["rope_theta"].get<double>();
    params.partial_rotary_factor = p.value("partial_rotary_factor", 1.0);
    params.factor = p.value("factor", 1.0);
    const at::Tensor ours = RopeInvFreq(params, c["head_dim"].get<int64_t>());
    const auto want = c["inv_freq_hex"].get<std::vector<std::string>>();
    ASSERT_EQ(ours.numel(), static_cast<int64_t>(want.size())) << p.dump();
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(ours[j].item<float>(), static_cast<float>(std::strtod(want[j].c_str(), nullptr)))
          << p.dump() << " j=" << j;
    }
    // Through the config parser too (the factor field).
    json cfg = GemmaConfigToHfJson(GemmaTinyConfig(), false);
    cfg["rope_parameters"]["full_attention"] = p;
    auto parsed = GemmaConfigFromJson(cfg, "rope.json");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->full_rope.factor, params.factor);
  }
}

// HF's per_layer_config rules as the loader applies them (transformers keeps
// only overrides that differ from the global value).
TEST(HfOracle, PerLayerConfigRules) {
  json j = GemmaConfigToHfJson(GemmaTinyConfig(), false);  // full layers 2 and 5
  j.erase("global_head_dim");
  j["per_layer_config"] = json::object();  // no override: full layers use head_dim
  auto c = GemmaConfigFromJson(j, "cfg");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_head_dim, c->head_dim);
  j["global_head_dim"] = 64;  // ignored when per_layer_config is present, as in HF
  j["per_layer_config"] = {{"02", {{"head_dim", 32}}}, {"5", {{"head_dim", 32}}}};
  c = GemmaConfigFromJson(j, "cfg");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->global_head_dim, 32);
  for (const json& bad : {json{{"5", {{"head_dim", 32}}}}, json{{"2", {{"head_dim", 32}}}, {"5", {{"head_dim", 48}}}},
                          json{{"0", {{"head_dim", 32}}}}, json{{"9", {{"head_dim", 32}}}},
                          json{{"2", {{"intermediate_size", 7}}}}, json{{"2", {{"num_key_value_heads", 2}}}}}) {
    j["per_layer_config"] = bad;
    auto st = GemmaConfigFromJson(j, "cfg").status();
    EXPECT_FALSE(st.ok()) << bad.dump();
    EXPECT_NE(st.message().find("per_layer_config"), std::string::npos) << st;
  }
}

// transformers' E2B (convert_gemma4_weights.py's variant through this venv's
// Gemma4TextConfig) against GemmaE2BConfig, field by field.
TEST(HfOracle, E2BConfigEqualsTransformers) {
  const json e = ReadJson(FixtureDir() + "/e2b_config.json");
  const json& h = e["config"];
  const GemmaConfig c = GemmaE2BConfig();
  EXPECT_EQ(h["model_type"], "gemma4_text");
  EXPECT_EQ(c.vocab_size, h["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.hidden_size, h["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, h["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.num_hidden_layers, h["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c.num_attention_heads, h["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.num_key_value_heads, h["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, h["head_dim"].get<int64_t>());
  EXPECT_EQ(c.hidden_size_per_layer_input, h["hidden_size_per_layer_input"].get<int64_t>());
  EXPECT_EQ(c.vocab_size_per_layer_input, h["vocab_size_per_layer_input"].get<int64_t>());
  EXPECT_EQ(c.sliding_window, h["sliding_window"].get<int64_t>());
  EXPECT_EQ(c.num_kv_shared_layers, h["num_kv_shared_layers"].get<int64_t>());
  EXPECT_EQ(c.max_position_embeddings, h["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.use_double_wide_mlp, h["use_double_wide_mlp"].get<bool>());
  EXPECT_EQ(c.tie_word_embeddings, h["tie_word_embeddings"].get<bool>());
  ASSERT_TRUE(c.final_logit_softcapping.has_value());
  EXPECT_EQ(*c.final_logit_softcapping, h["final_logit_softcapping"].get<double>());
  EXPECT_EQ(c.rms_norm_eps, h["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.initializer_range, h["initializer_range"].get<double>());
  EXPECT_EQ(c.hidden_activation, h["hidden_activation"].get<std::string>());
  EXPECT_EQ(c.pad_token_id, h["pad_token_id"].get<int64_t>());
  EXPECT_EQ(c.bos_token_id, h["bos_token_id"].get<int64_t>());
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{h["eos_token_id"].get<int64_t>()});
  // Features we do not implement are off in E2B.
  EXPECT_FALSE(h["attention_bias"].get<bool>());
  EXPECT_FALSE(h["attention_k_eq_v"].get<bool>());
  EXPECT_FALSE(h["enable_moe_block"].get<bool>());
  EXPECT_TRUE(h["use_bidirectional_attention"].is_null());
  EXPECT_EQ(h["attention_dropout"].get<double>(), 0.0);
  for (const auto& [type, ours] : {std::pair<std::string, RopeParameters>{"sliding_attention", c.sliding_rope},
                                   std::pair<std::string, RopeParameters>{"full_attention", c.full_rope}}) {
    const json& p = h["rope_parameters"][type];
    EXPECT_EQ(ours.rope_type, p["rope_type"].get<std::string>()) << type;
    EXPECT_EQ(ours.rope_theta, p["rope_theta"].get<double>()) << type;
    EXPECT_EQ(ours.partial_rotary_factor, p.value("partial_rotary_factor", 1.0)) << type;
    EXPECT_EQ(ours.factor, p.value("factor", 1.0)) << type;
  }
  // Per layer, from transformers' modules (meta device).
  const json& pl = e["per_layer"];
  const auto types = h["layer_types"].get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<int64_t>(types.size()), c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    EXPECT_EQ(std::string(LayerTypeName(c.layer_types[i])), types[i]) << i;
    EXPECT_EQ(c.HeadDim(i), pl["head_dim"][i].get<int64_t>()) << i;
    EXPECT_EQ(c.num_key_value_heads, pl["num_key_value_heads"][i].get<int64_t>()) << i;
    EXPECT_EQ(c.IntermediateSize(i), pl["intermediate_size"][i].get<int64_t>()) << i;
    const json& mode = pl["kv_sharing_mode"][i];
    EXPECT_EQ(c.IsKvShared(i), mode == "reuse") << i;
    EXPECT_EQ(c.StoresSharedKv(i), mode == "store") << i;
    EXPECT_EQ(c.layer_types[i] == LayerType::kSliding, pl["is_sliding"][i].get<bool>()) << i;
    EXPECT_EQ(pl["scaling"][i].get<double>(), 1.0) << i;
  }
  EXPECT_EQ(e["embed_scale"].get<double>(), std::sqrt(static_cast<double>(c.hidden_size)));
  // transformers' own serialization of E2B parses back to GemmaE2BConfig.
  auto parsed = GemmaConfigFromJson(h, "e2b_config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->global_head_dim, c.global_head_dim);
  EXPECT_EQ(parsed->layer_types, c.layer_types);
  EXPECT_EQ(parsed->full_rope.partial_rotary_factor, c.full_rope.partial_rotary_factor);
  // transformers' Gemma4ForCausalLM(E2B) tensors: our layers have the same
  // names and shapes. Built one at a time (E2B is 18 GiB in fp32), one of
  // each kind: sliding, full, the KV sources (last non-shared sliding and
  // full), shared sliding (double-wide MLP), shared full.
  std::map<std::string, std::vector<int64_t>> theirs;
  for (const auto& [name, shape] : e["tensors"].items()) theirs[name] = shape.get<std::vector<int64_t>>();
  for (int64_t i : {0, 4, 13, 14, 15, 19}) {
    GemmaDecoderLayer layer(c, i);
    std::map<std::string, std::vector<int64_t>> ours, want;
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    for (const auto& p : layer->named_parameters(true)) ours[prefix + p.key()] = p.value().sizes().vec();
    for (const auto& b : layer->named_buffers(true)) ours[prefix + b.key()] = b.value().sizes().vec();
    for (const auto& [name, shape] : theirs) {
      if (name.rfind(prefix, 0) == 0) want[name] = shape;
    }
    ASSERT_EQ(ours, want) << "layer " << i;
  }
  const int64_t lp = c.num_hidden_layers * c.hidden_size_per_layer_input;
  EXPECT_EQ(theirs.at("model.embed_tokens.weight"), (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  EXPECT_EQ(theirs.at("model.embed_tokens_per_layer.weight"), (std::vector<int64_t>{c.vocab_size_per_layer_input, lp}));
  EXPECT_EQ(theirs.at("model.per_layer_model_projection.weight"), (std::vector<int64_t>{lp, c.hidden_size}));
  EXPECT_EQ(theirs.at("model.per_layer_projection_norm.weight"),
            (std::vector<int64_t>{c.hidden_size_per_layer_input}));
  EXPECT_EQ(theirs.at("model.norm.weight"), (std::vector<int64_t>{c.hidden_size}));
  // The rest of the listing: exactly the 5 top-level tensors above and, per
  // layer, the tensors its kind has (shared layers lack k/v projections and
  // norms, as our layers do).
  int64_t top = 0;
  std::vector<int64_t> per_layer(c.num_hidden_layers, 0);
  for (const auto& [name, shape] : theirs) {
    int64_t layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%ld.", &layer) == 1) {
      ++per_layer.at(layer);
    } else {
      ++top;
    }
  }
  EXPECT_EQ(top, 5);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    EXPECT_EQ(per_layer[i], c.IsKvShared(i) ? 14 : 17) << "layer " << i;
  }
}

// Writes SaveGemmaAsHf outputs for tests/oracles/test_save_as_hf.py (which
// sets TPU_DIST_ORACLE_EXPORT_DIR and loads them with transformers); skipped
// otherwise.
TEST(HfOracleExport, SaveGemmaAsHfForTransformers) {
  const char* dir = std::getenv("TPU_DIST_ORACLE_EXPORT_DIR");
  if (dir == nullptr) GTEST_SKIP() << "TPU_DIST_ORACLE_EXPORT_DIR not set (run by tests/oracles/test_save_as_hf.py)";
  const std::filesystem::path root(dir);
  GemmaForCausalLM fp32 = LoadFixtureModel(at::kFloat);
  GemmaForCausalLM bf16 = LoadFixtureModel(at::kBFloat16);
  ASSERT_TRUE(SaveGemmaAsHf(*fp32, (root / "wrapper_fp32").string()).ok());
  SaveOptions text_only;
  text_only.multimodal_wrapper = false;
  ASSERT_TRUE(SaveGemmaAsHf(*fp32, (root / "text_fp32").string(), text_only).ok());
  SaveOptions to_bf16;
  to_bf16.dtype = at::kBFloat16;
  ASSERT_TRUE(SaveGemmaAsHf(*fp32, (root / "wrapper_bf16_converted").string(), to_bf16).ok());
  ASSERT_TRUE(SaveGemmaAsHf(*bf16, (root / "wrapper_bf16_native").string()).ok());
  // Our logits on the fixture cases, for the Python side to compare.
  std::vector<std::pair<std::string, at::Tensor>> logits;
  at::NoGradGuard no_grad;
  for (const Case& c : LoadCases()) {
    logits.emplace_back(c.name + ".fp32", fp32->forward(c.input_ids, c.attention_mask).logits);
    logits.emplace_back(c.name + ".bf16", bf16->forward(c.input_ids, c.attention_mask).logits);
  }
  ASSERT_TRUE(io::WriteSafetensors((root / "ours.safetensors").string(), logits).ok());
}

}  // namespace
}  // namespace tpudist::models::gemma
