// Our module tree for the E2B config has exactly the HF tensor names and
// shapes of testdata/gemma4-e2b-text-tensors.tsv (derived from HF's modeling
// code and the E2B config; see /work/shared/reference). Layers are built one
// at a time (a whole E2B model would need ~18 GiB in fp32); the two big
// embeddings are checked from the config formulas.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/gemma/gemma_decoder_layer.h"
#include "models/gemma/hf_checkpoint.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

std::map<std::string, std::vector<int64_t>> ReadTsv(const std::string& path) {
  std::map<std::string, std::vector<int64_t>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    std::vector<int64_t> shape;
    std::string dims = line.substr(tab + 1);
    for (char& c : dims) {
      if (c == '[' || c == ']' || c == ',') c = ' ';
    }
    std::istringstream ss(dims);
    int64_t d;
    while (ss >> d) shape.push_back(d);
    out[line.substr(0, tab)] = shape;
  }
  return out;
}

TEST(E2BShapes, LayersAndTopLevelMatchHfListing) {
  const auto want = ReadTsv(test_support::SourceDir() + "/models/gemma/testdata/gemma4-e2b-text-tensors.tsv");
  ASSERT_EQ(want.size(), 540u);
  const GemmaConfig c = GemmaE2BConfig();
  // Sliding, full, last sliding/full non-shared, first shared, shared full.
  for (int64_t i : {0, 4, 13, 14, 15, 19}) {
    GemmaDecoderLayer layer(c, i);
    std::map<std::string, std::vector<int64_t>> ours;
    const std::string prefix = absl::StrCat("model.language_model.layers.", i, ".");
    for (const auto& p : layer->named_parameters(true)) ours[prefix + p.key()] = p.value().sizes().vec();
    for (const auto& b : layer->named_buffers(true)) ours[prefix + b.key()] = b.value().sizes().vec();
    std::map<std::string, std::vector<int64_t>> theirs;
    for (const auto& [name, shape] : want) {
      if (name.rfind(prefix, 0) == 0) theirs[name] = shape;
    }
    EXPECT_EQ(ours, theirs) << "layer " << i;
  }
  const int64_t lp = c.num_hidden_layers * c.hidden_size_per_layer_input;
  EXPECT_EQ(want.at("model.language_model.embed_tokens.weight"), (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  EXPECT_EQ(want.at("model.language_model.embed_tokens_per_layer.weight"),
            (std::vector<int64_t>{c.vocab_size_per_layer_input, lp}));
  EXPECT_EQ(want.at("model.language_model.per_layer_model_projection.weight"), (std::vector<int64_t>{lp, c.hidden_size}));
  // The tiny model's full name set maps onto the same HF naming scheme.
  GemmaForCausalLM tiny(GemmaTinyConfig());
  for (const auto& p : tiny->named_parameters(true)) {
    const std::string hf = HfNameFor(p.key());
    const std::string e2b_like = std::regex_replace(hf, std::regex("layers\\.[0-9]+\\."), "layers.0.");
    const std::string shared_like = std::regex_replace(hf, std::regex("layers\\.[0-9]+\\."), "layers.15.");
    EXPECT_TRUE(want.count(e2b_like) || want.count(shared_like)) << hf;
  }
}

}  // namespace
}  // namespace tpudist::models::gemma
