// The bundled tiny model (data/tiny_gemma): it is what make_tiny_gemma
// writes, it loads, its tokenizer fits its config, and greedy generation works.
#include "models/gemma/tiny_model.h"

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/generation.h"
#include "testing/files.h"
#include "testing/temp_dir.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/tokenizer.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

std::string BundledDir() {
  return test_support::SourceDir() + "/data/tiny_gemma";
}

TEST(TinyModel, BundledFilesAreWhatTheGeneratorWrites) {
  const std::string bundled = BundledDir();
  ASSERT_TRUE(std::filesystem::exists(bundled + "/model.safetensors")) << bundled;
  test_support::ScopedTempDir dir("gemma_test");
  ASSERT_TRUE(WriteTinyGemmaDir(dir.path(), test_support::ReadFile(bundled + "/tokenizer_corpus.txt")).ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"}) {
    EXPECT_EQ(test_support::ReadFile(dir / f), test_support::ReadFile(bundled + "/" + f)) << f;
  }
  EXPECT_LT(std::filesystem::file_size(bundled + "/model.safetensors"), 4u << 20);
}

TEST(TinyModel, LoadsAndTokenizerFitsConfig) {
  auto model = LoadGemmaFromHf(BundledDir());
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = LoadTokenizer(BundledDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const GemmaConfig& c = (*model)->config();
  EXPECT_EQ((*tok)->vocab_size(), c.vocab_size);
  EXPECT_EQ((*tok)->pad_id(), 0);
  EXPECT_EQ((*tok)->eos_id(), 1);
  EXPECT_EQ((*tok)->bos_id(), 2);
  EXPECT_FALSE((*tok)->add_bos());
  const std::string text = "Instruction: What is two plus two?\nResponse: Two plus two is four.";
  std::vector<int64_t> ids = (*tok)->Encode(text);
  EXPECT_EQ((*tok)->Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 3);  // merges learned on the corpus apply
  // Untrained (random init) model: the initial loss is close to ln(V).
  at::Tensor t = at::tensor(ids, at::kLong).view({1, -1});
  at::NoGradGuard ng;
  const double loss = (*model)->forward(t, at::Tensor(), t).loss.item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab_size)), 0.5);
}

TEST(TinyModel, GreedyGenerateIsArgmaxOfTheFullSequence) {
  auto model = LoadGemmaFromHf(BundledDir());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int64_t> prompt = {2, 300, 301, 302};
  std::vector<int64_t> got = GreedyGenerate(**model, prompt, 4, {});
  ASSERT_EQ(got.size(), 4u);
  std::vector<int64_t> seq = prompt;
  at::NoGradGuard ng;
  for (int64_t tok : got) {
    at::Tensor logits = (*model)->forward(at::tensor(seq, at::kLong).view({1, -1})).logits;
    EXPECT_EQ(logits[0][-1].argmax().item<int64_t>(), tok);
    seq.push_back(tok);
  }
  // Stops right after a stop id.
  std::vector<int64_t> stopped = GreedyGenerate(**model, prompt, 4, {got[0]});
  EXPECT_EQ(stopped, std::vector<int64_t>{got[0]});
}

}  // namespace
}  // namespace tpudist::models::gemma
