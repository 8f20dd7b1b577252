// make_tiny_gemma: writes a complete tiny HF-format Gemma 4 model directory
// (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
// generation_config.json). See tiny_model.h.
//
//   make_tiny_gemma --corpus=data/tiny_gemma/tokenizer_corpus.txt --out=data/tiny_gemma
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "models/gemma/tiny_model.h"

ABSL_FLAG(std::string, corpus, "", "text file the BPE tokenizer is trained on");
ABSL_FLAG(std::string, out, "", "output model directory (created)");
ABSL_FLAG(uint64_t, seed, 0, "weight init seed");
ABSL_FLAG(double, layer_scalar, 1.0, "value of every layer_scalar buffer");
ABSL_FLAG(bool, add_bos_token, false, "tokenizer_config.json add_bos_token");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus), out = absl::GetFlag(FLAGS_out);
  if (corpus_path.empty() || out.empty()) {
    std::cerr << "usage: make_tiny_gemma --corpus=FILE --out=DIR [--seed=N]\n";
    return 2;
  }
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::cerr << corpus_path << ": cannot open\n";
    return 1;
  }
  std::stringstream corpus;
  corpus << in.rdbuf();
  tpudist::models::gemma::TinyModelOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.layer_scalar = absl::GetFlag(FLAGS_layer_scalar);
  options.add_bos_token = absl::GetFlag(FLAGS_add_bos_token);
  if (auto st = tpudist::models::gemma::WriteTinyGemmaDir(out, corpus.str(), options); !st.ok()) {
    std::cerr << "make_tiny_gemma: " << st << "\n";
    return 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}
