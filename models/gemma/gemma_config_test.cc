#include "models/gemma/gemma_config.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

void ExpectSameConfig(const GemmaConfig& a, const GemmaConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.global_head_dim, b.global_head_dim);
  EXPECT_EQ(a.hidden_size_per_layer_input, b.hidden_size_per_layer_input);
  EXPECT_EQ(a.vocab_size_per_layer_input, b.vocab_size_per_layer_input);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.num_kv_shared_layers, b.num_kv_shared_layers);
  EXPECT_EQ(a.use_double_wide_mlp, b.use_double_wide_mlp);
  EXPECT_EQ(a.final_logit_softcapping, b.final_logit_softcapping);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.full_rope.rope_type, b.full_rope.rope_type);
  EXPECT_EQ(a.full_rope.rope_theta, b.full_rope.rope_theta);
  EXPECT_EQ(a.full_rope.partial_rotary_factor, b.full_rope.partial_rotary_factor);
  EXPECT_EQ(a.sliding_rope.rope_theta, b.sliding_rope.rope_theta);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
}

TEST(GemmaConfig, RoundTripsThroughHfJsonBothLayouts) {
  for (bool wrapper : {true, false}) {
    for (const GemmaConfig& c : {GemmaE2BConfig(), GemmaTinyConfig()}) {
      json j = GemmaConfigToHfJson(c, wrapper);
      EXPECT_EQ(j["model_type"], wrapper ? "gemma4" : "gemma4_text");
      auto parsed = GemmaConfigFromJson(j, "mem");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      ExpectSameConfig(*parsed, c);
    }
  }
}

// The E2B config as HF's converter writes it (abridged to the fields we read).
TEST(GemmaConfig, ParsesE2BStyleWrapper) {
  json text = {{"model_type", "gemma4_text"}, {"vocab_size", 262144}, {"hidden_size", 1536},
               {"intermediate_size", 6144}, {"num_hidden_layers", 35}, {"num_attention_heads", 8},
               {"num_key_value_heads", 1}, {"head_dim", 256}, {"global_head_dim", 512},
               {"hidden_size_per_layer_input", 256}, {"vocab_size_per_layer_input", 262144},
               {"sliding_window", 512}, {"num_kv_shared_layers", 20}, {"use_double_wide_mlp", true},
               {"final_logit_softcapping", 30.0}, {"rms_norm_eps", 1e-6},
               {"rope_parameters", {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
                                    {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", 1000000.0},
                                                        {"partial_rotary_factor", 0.25}}}}}};
  json layer_types = json::array();
  for (int i = 0; i < 35; ++i) layer_types.push_back(i % 5 == 4 ? "full_attention" : "sliding_attention");
  text["layer_types"] = layer_types;
  json top = {{"model_type", "gemma4"}, {"architectures", {"Gemma4ForConditionalGeneration"}},
              {"text_config", text}, {"eos_token_id", {1, 106}}, {"vision_config", {{"model_type", "x"}}}};
  auto c = GemmaConfigFromJson(top, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameConfig(*c, [] {
    GemmaConfig e = GemmaE2BConfig();
    e.eos_token_ids = {1, 106};
    return e;
  }());
}

TEST(GemmaConfig, DerivesLayerTypesWhenAbsent) {
  json j = GemmaConfigToHfJson(GemmaTinyConfig(), false);
  j.erase("layer_types");
  j["num_hidden_layers"] = 8;
  j["num_kv_shared_layers"] = 0;
  auto c = GemmaConfigFromJson(j, "cfg");
  ASSERT_TRUE(c.ok()) << c.status();
  // HF: every 6th layer full (5:1), and the last layer forced to full.
  const LayerType s = LayerType::kSliding, f = LayerType::kFull;
  EXPECT_EQ(c->layer_types, (std::vector<LayerType>{s, s, s, s, s, f, s, f}));
  // An explicit list whose last layer is sliding is also forced.
  json k = GemmaConfigToHfJson(GemmaTinyConfig(), false);
  k["layer_types"][5] = "sliding_attention";
  k["num_kv_shared_layers"] = 0;
  auto d = GemmaConfigFromJson(k, "cfg");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->layer_types[5], f);
  // vocab_size_per_layer_input defaults to HF's 262144, not vocab_size.
  json m = GemmaConfigToHfJson(GemmaTinyConfig(), false);
  m.erase("vocab_size_per_layer_input");
  EXPECT_EQ(GemmaConfigFromJson(m, "cfg")->vocab_size_per_layer_input, 262144);
}

TEST(GemmaConfig, ErrorsNameFileAndField) {
  json j = GemmaConfigToHfJson(GemmaTinyConfig(), false);
  json missing = j;
  missing.erase("head_dim");
  auto st = GemmaConfigFromJson(missing, "/x/config.json").status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/x/config.json"), std::string::npos) << st;
  EXPECT_NE(st.message().find("head_dim"), std::string::npos) << st;

  json wrong = j;
  wrong["model_type"] = "llama";
  st = GemmaConfigFromJson(wrong, "c.json").status();
  EXPECT_NE(st.message().find("model_type"), std::string::npos) << st;
  EXPECT_NE(st.message().find("llama"), std::string::npos) << st;

  json arch = j;
  arch["architectures"] = {"LlamaForCausalLM"};
  st = GemmaConfigFromJson(arch, "c.json").status();
  EXPECT_NE(st.message().find("architectures"), std::string::npos) << st;

  json bad_type = j;
  bad_type["layer_types"][0] = "chunked_attention";
  EXPECT_FALSE(GemmaConfigFromJson(bad_type, "c").ok());

  json bad_share = j;
  bad_share["num_kv_shared_layers"] = 5;  // layer 1.. shared, no earlier full layer
  st = GemmaConfigFromJson(bad_share, "c").status();
  EXPECT_NE(st.message().find("num_kv_shared_layers"), std::string::npos) << st;

  json bad_rope = j;
  bad_rope["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  st = GemmaConfigFromJson(bad_rope, "c").status();
  EXPECT_NE(st.message().find("rope_parameters.full_attention"), std::string::npos) << st;

  json no_text = {{"model_type", "gemma4"}};
  st = GemmaConfigFromJson(no_text, "c").status();
  EXPECT_NE(st.message().find("text_config"), std::string::npos) << st;

  test_support::ScopedTempDir dir("gemma_test");
  test_support::WriteFile(dir / "config.json", "{ not json");
  st = LoadGemmaConfig(dir / "config.json").status();
  EXPECT_NE(st.message().find(dir / "config.json"), std::string::npos) << st;
  EXPECT_FALSE(LoadGemmaConfig(dir / "absent.json").ok());
}

// Sizes out of the sanity bounds (gemma_config.h) fail at parse time, naming
// the file and field, before any allocation.
TEST(GemmaConfig, SanityBoundsNameTheField) {
  const json j = GemmaConfigToHfJson(GemmaTinyConfig(), true);
  auto error = [&](const char* field, const json& value) {
    json bad = j;
    bad["text_config"][field] = value;
    return std::string(GemmaConfigFromJson(bad, "/m/config.json").status().message());
  };
  // vocab_size=1e12: as an integer, and as JSON's float spelling.
  EXPECT_EQ(error("vocab_size", int64_t{1000000000000}),
            "/m/config.json: text_config: field 'vocab_size': 1000000000000 is outside the supported range "
            "[1, 16777216]");
  EXPECT_EQ(error("vocab_size", 1e12), "/m/config.json: text_config: field 'vocab_size': not an integer");
  EXPECT_NE(error("vocab_size", 0).find("'vocab_size': 0 is outside"), std::string::npos);
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "head_dim", "global_head_dim", "sliding_window", "max_position_embeddings",
                            "hidden_size_per_layer_input", "vocab_size_per_layer_input"}) {
    EXPECT_NE(error(field, int64_t{1} << 40).find(absl::StrCat("'", field, "': 1099511627776 is outside")),
              std::string::npos)
        << field;
  }
  EXPECT_NE(error("num_key_value_heads", 3).find("'num_key_value_heads': 3 must divide num_attention_heads 4"),
            std::string::npos);
  EXPECT_NE(error("num_key_value_heads", -1).find("'num_key_value_heads': -1 is outside"), std::string::npos);
  EXPECT_NE(error("vocab_size_per_layer_input", 100).find("smaller than vocab_size 512"), std::string::npos);
  EXPECT_NE(error("eos_token_id", 512).find("'eos_token_id': 512 is not a token id in [0, vocab_size 512)"),
            std::string::npos);
  EXPECT_NE(error("pad_token_id", -1).find("'pad_token_id'"), std::string::npos);
  EXPECT_NE(error("rms_norm_eps", -1e-6).find("'rms_norm_eps'"), std::string::npos);
  EXPECT_NE(error("final_logit_softcapping", 0.0).find("'final_logit_softcapping'"), std::string::npos);
  json bad_rope = j;
  bad_rope["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.5;
  EXPECT_NE(std::string(GemmaConfigFromJson(bad_rope, "c").status().message())
                .find("rope_parameters.full_attention.partial_rotary_factor"),
            std::string::npos);
  // The bundled and E2B configs are well inside.
  EXPECT_TRUE(GemmaE2BConfig().Validate().ok());
  EXPECT_TRUE(GemmaConfigFromJson(j, "ok").ok());
}

// Values the model computes with in fp32/bf16 must be normal there (issue
// 39): a softcap of 1e-300 passed "> 0", was 0 in fp32 and trained to NaN.
TEST(GemmaConfig, ComputeValuesMustBeNormalInFloat32) {
  const json j = GemmaConfigToHfJson(GemmaTinyConfig(), true);
  auto error = [&](const char* field, double value) {
    json bad = j;
    bad["text_config"][field] = value;
    return std::string(GemmaConfigFromJson(bad, "/m/config.json").status().message());
  };
  EXPECT_EQ(error("final_logit_softcapping", 1e-300),
            "/m/config.json: text_config: field 'final_logit_softcapping': 1e-300 is 0 or subnormal in "
            "float32/bfloat16, the dtypes the model computes it in (must be in [1.17549e-38, 3.38953e+38])");
  EXPECT_NE(error("final_logit_softcapping", 1e39).find("'final_logit_softcapping': 1e+39 is inf in float32"),
            std::string::npos);
  EXPECT_NE(error("rms_norm_eps", 1e-40).find("'rms_norm_eps': 1e-40 is 0 or subnormal"), std::string::npos);
  json rope = j;
  rope["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = 1e300;
  EXPECT_NE(std::string(GemmaConfigFromJson(rope, "c").status().message())
                .find("'rope_parameters.sliding_attention.rope_theta': 1e+300 is inf"),
            std::string::npos);
  rope = j;
  rope["text_config"]["rope_parameters"]["full_attention"]["factor"] = 1e-39;
  EXPECT_NE(std::string(GemmaConfigFromJson(rope, "c").status().message())
                .find("'rope_parameters.full_attention.factor': 1e-39 is 0 or subnormal"),
            std::string::npos);
  // Small but normal values are the user's choice.
  json ok = j;
  ok["text_config"]["final_logit_softcapping"] = 1e-30;
  ok["text_config"]["rms_norm_eps"] = 1e-30;
  EXPECT_TRUE(GemmaConfigFromJson(ok, "ok").ok());
}

}  // namespace
}  // namespace tpudist::models::gemma
