#include "models/gemma/hf_checkpoint.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "testing/files.h"
#include "testing/temp_dir.h"
#include "io/safetensors.h"

namespace tpudist::models::gemma {
namespace {

GemmaForCausalLM Tiny(uint64_t seed) {
  GemmaForCausalLM m(GemmaTinyConfig());
  InitGemmaWeights(*m, {seed, 0.05, 0.5});
  return m;
}

at::Tensor Logits(GemmaForCausalLM& m) {
  at::Tensor ids = at::arange(3, 13, at::kLong).view({1, 10});
  at::NoGradGuard ng;
  return m->forward(ids).logits;
}

std::vector<std::pair<std::string, at::Tensor>> ReadAll(const std::string& path) {
  auto f = io::SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, e] : (*f)->entries()) out.emplace_back(name, (*(*f)->Get(name)).clone());
  return out;
}

TEST(HfNames, MapsBothWays) {
  const GemmaConfig c = GemmaE2BConfig();
  EXPECT_EQ(HfNameFor("model.layers.3.self_attn.q_proj.weight"),
            "model.language_model.layers.3.self_attn.q_proj.weight");
  auto m = ClassifyHfTensor("model.language_model.layers.3.self_attn.k_proj.weight", c);
  EXPECT_EQ(m.kind, HfTensorKind::kMapped);
  EXPECT_EQ(m.our_name, "model.layers.3.self_attn.k_proj.weight");
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.mlp.up_proj.weight", c).our_name, "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(ClassifyHfTensor("model.language_model.layers.15.self_attn.k_proj.weight", c).kind, HfTensorKind::kSkipped);
  EXPECT_EQ(ClassifyHfTensor("model.language_model.layers.34.self_attn.k_norm.weight", c).kind, HfTensorKind::kSkipped);
  EXPECT_EQ(ClassifyHfTensor("model.language_model.layers.15.self_attn.q_proj.weight", c).kind, HfTensorKind::kMapped);
  EXPECT_EQ(ClassifyHfTensor("model.vision_tower.encoder.x.weight", c).kind, HfTensorKind::kSkipped);
  EXPECT_EQ(ClassifyHfTensor("model.embed_audio.weight", c).kind, HfTensorKind::kSkipped);
  EXPECT_EQ(ClassifyHfTensor("lm_head.weight", c).kind, HfTensorKind::kSkipped);
  EXPECT_EQ(ClassifyHfTensor("something.else", c).kind, HfTensorKind::kUnknown);
}

TEST(HfCheckpoint, SaveLoadRoundTrip) {
  test_support::ScopedTempDir dir("gemma_test");
  GemmaForCausalLM a = Tiny(1);
  ASSERT_TRUE(SaveGemmaAsHf(*a, dir.path()).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "config.json"));
  auto names = ReadAll(dir / "model.safetensors");
  bool has_q = false;
  for (const auto& [n, t] : names) {
    EXPECT_EQ(n.rfind("model.language_model.", 0), 0u) << n;
    EXPECT_NE(n, "lm_head.weight");
    EXPECT_EQ(n.find("layers.4.self_attn.k_proj"), std::string::npos);
    has_q = has_q || n == "model.language_model.layers.5.self_attn.q_proj.weight";
  }
  EXPECT_TRUE(has_q);
  auto b = LoadGemmaFromHf(dir.path());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(at::equal(Logits(a), Logits(*b)));
  EXPECT_EQ((*b)->model->layers->at<GemmaDecoderLayerImpl>(2).layer_scalar.item<float>(), 0.5f);

  // bf16 load converts; a bf16 save writes BF16 tensors.
  auto c = LoadGemmaFromHf(dir.path(), {at::kBFloat16});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->model->norm->weight().scalar_type(), at::kBFloat16);
  test_support::ScopedTempDir dir2("gemma_test");
  SaveOptions bf16;
  bf16.dtype = at::kBFloat16;
  ASSERT_TRUE(SaveGemmaAsHf(**c, dir2.path(), bf16).ok());
  auto f = io::SafetensorsFile::Open(dir2 / "model.safetensors");
  EXPECT_EQ((*f)->entries().at("model.language_model.norm.weight").dtype, "BF16");

  // Text-only layout ("model.layers...") loads too.
  test_support::ScopedTempDir dir3("gemma_test");
  SaveOptions text_only;
  text_only.multimodal_wrapper = false;
  ASSERT_TRUE(SaveGemmaAsHf(*a, dir3.path(), text_only).ok());
  auto d = LoadGemmaFromHf(dir3.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(at::equal(Logits(a), Logits(*d)));
}

TEST(HfCheckpoint, ShardedIndexAndSkippedTensors) {
  test_support::ScopedTempDir src("gemma_test");
  GemmaForCausalLM a = Tiny(2);
  ASSERT_TRUE(SaveGemmaAsHf(*a, src.path()).ok());
  auto all = ReadAll(src / "model.safetensors");
  // Split in two shards and add tensors HF checkpoints carry that we skip.
  std::vector<std::pair<std::string, at::Tensor>> s1(all.begin(), all.begin() + all.size() / 2);
  std::vector<std::pair<std::string, at::Tensor>> s2(all.begin() + all.size() / 2, all.end());
  s2.emplace_back("model.language_model.layers.4.self_attn.k_proj.weight", at::zeros({16, 64}));
  s2.emplace_back("model.vision_tower.patch.weight", at::zeros({3}));
  s2.emplace_back("lm_head.weight", at::zeros({512, 64}));
  test_support::ScopedTempDir dir("gemma_test");
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  ASSERT_TRUE(io::WriteSafetensors(dir / "model-00001-of-00002.safetensors", s1).ok());
  ASSERT_TRUE(io::WriteSafetensors(dir / "model-00002-of-00002.safetensors", s2).ok());
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [n, t] : s1) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, t] : s2) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  test_support::WriteFile(dir / "model.safetensors.index.json", index.dump());
  auto b = LoadGemmaFromHf(dir.path());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(at::equal(Logits(a), Logits(*b)));
}

TEST(HfCheckpoint, ErrorsNameFileAndTensor) {
  test_support::ScopedTempDir src("gemma_test");
  GemmaForCausalLM a = Tiny(3);
  ASSERT_TRUE(SaveGemmaAsHf(*a, src.path()).ok());
  auto all = ReadAll(src / "model.safetensors");
  const std::string st_path = src / "model.safetensors";

  {  // missing tensor
    auto v = all;
    v.erase(std::find_if(v.begin(), v.end(), [](const auto& p) { return p.first.find("layers.2.mlp.down_proj") != std::string::npos; }));
    ASSERT_TRUE(io::WriteSafetensors(st_path, v).ok());
    auto st = LoadGemmaFromHf(src.path()).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
    EXPECT_NE(st.message().find("model.language_model.layers.2.mlp.down_proj.weight"), std::string::npos) << st;
  }
  {  // shape mismatch
    auto v = all;
    for (auto& [n, t] : v) {
      if (n == "model.language_model.norm.weight") t = at::ones({65});
    }
    ASSERT_TRUE(io::WriteSafetensors(st_path, v).ok());
    auto st = LoadGemmaFromHf(src.path()).status();
    EXPECT_NE(st.message().find("norm.weight"), std::string::npos) << st;
    EXPECT_NE(st.message().find("[65]"), std::string::npos) << st;
    EXPECT_NE(st.message().find(st_path), std::string::npos) << st;
  }
  {  // unexpected tensor
    auto v = all;
    v.emplace_back("model.language_model.layers.1.mystery.weight", at::ones({2}));
    ASSERT_TRUE(io::WriteSafetensors(st_path, v).ok());
    auto st = LoadGemmaFromHf(src.path()).status();
    EXPECT_NE(st.message().find("mystery"), std::string::npos) << st;
  }
  {  // corrupt file
    test_support::WriteFile(st_path, "garbage-garbage");
    auto st = LoadGemmaFromHf(src.path()).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find(st_path), std::string::npos) << st;
  }
  {  // missing weights file and missing config
    std::filesystem::remove(st_path);
    EXPECT_EQ(LoadGemmaFromHf(src.path()).status().code(), absl::StatusCode::kNotFound);
    std::filesystem::remove(src / "config.json");
    auto st = LoadGemmaFromHf(src.path()).status();
    EXPECT_NE(st.message().find("config.json"), std::string::npos) << st;
  }
}

// Dtypes are strict: I32 bytes where the model holds F32 (same size, so the
// byte-size check passes) are rejected, not value-cast into ~1e9 weights.
TEST(HfCheckpoint, IntegerTensorForFloatWeightIsRejected) {
  test_support::ScopedTempDir src("gemma_test");
  GemmaForCausalLM a = Tiny(4);
  ASSERT_TRUE(SaveGemmaAsHf(*a, src.path()).ok());
  auto all = ReadAll(src / "model.safetensors");
  const std::string name = "model.language_model.layers.1.mlp.up_proj.weight";
  for (auto& [n, t] : all) {
    if (n == name) t = t.view(at::kInt);  // same bytes, header says I32
  }
  ASSERT_TRUE(io::WriteSafetensors(src / "model.safetensors", all).ok());
  auto st = LoadGemmaFromHf(src.path()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(src / "model.safetensors"), std::string::npos) << st;
  EXPECT_NE(st.message().find("'" + name + "' is stored as I32, the model expects F32"), std::string::npos) << st;
  // Also into a bf16 model: int -> float is never a cast.
  EXPECT_EQ(LoadGemmaFromHf(src.path(), {at::kBFloat16}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Float-to-float is an explicit cast, reported once per load with its count.
TEST(HfCheckpoint, FloatCastsAreCountedAndLoggedOnce) {
  test_support::ScopedTempDir src("gemma_test");
  GemmaForCausalLM a = Tiny(5);
  ASSERT_TRUE(SaveGemmaAsHf(*a, src.path()).ok());  // F32
  const int64_t n = static_cast<int64_t>(ReadAll(src / "model.safetensors").size());
  std::vector<std::string> lines;
  LoadOptions bf16{at::kBFloat16};
  bf16.log = [&](const std::string& line) { lines.push_back(line); };
  auto b = LoadGemmaFromHf(src.path(), bf16);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], absl::StrCat(src.path(), ": cast ", n, " tensors F32 -> BF16 on load"));
  // Same dtype: nothing to report.
  lines.clear();
  LoadOptions f32;
  f32.log = bf16.log;
  ASSERT_TRUE(LoadGemmaFromHf(src.path(), f32).ok());
  EXPECT_TRUE(lines.empty());
  // A mixed file: one F16 tensor among F32 ones, into an F32 model.
  auto all = ReadAll(src / "model.safetensors");
  all[0].second = all[0].second.to(at::kHalf);
  ASSERT_TRUE(io::WriteSafetensors(src / "model.safetensors", all).ok());
  GemmaForCausalLM c(GemmaTinyConfig());
  auto summary = LoadHfWeights(*c, src.path());
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->tensors, n);
  EXPECT_EQ(summary->CastLine(), "cast 1 tensor F16 -> F32");
}

TEST(HfCheckpoint, MissingModelDirectoryIsNamed) {
  test_support::ScopedTempDir dir("gemma_test");
  auto st = LoadGemmaFromHf(dir / "no_such_model").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), absl::StrCat("model directory ", dir / "no_such_model", " does not exist"));
  test_support::WriteFile(dir / "file", "x");
  st = LoadGemmaFromHf(dir / "file").status();
  EXPECT_EQ(st.message(), absl::StrCat("model directory ", dir / "file", " is not a directory"));
}

TEST(HfCheckpoint, SaveErrorCarriesErrno) {
  test_support::ScopedTempDir dir("gemma_test");
  GemmaForCausalLM a = Tiny(6);
  ASSERT_EQ(symlink("/dev/full", (dir / "config.json").c_str()), 0);  // writes fail with ENOSPC
  auto st = SaveGemmaAsHf(*a, dir.path());
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find(dir / "config.json"), std::string::npos) << st;
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st;
}

}  // namespace
}  // namespace tpudist::models::gemma
