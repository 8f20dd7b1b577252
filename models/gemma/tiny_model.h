// Writes a complete tiny HF-format Gemma 4 model directory: the debug config
// (GemmaTinyConfig), seeded HF-like random weights, and a BPE tokenizer
// trained on a caller-supplied text. data/tiny_gemma/ is produced by
// make_tiny_gemma with the default options (see docs/gemma.md).
//
// Output files: config.json, model.safetensors (fp32, HF names),
// tokenizer.json (Gemma components, byte fallback, vocab = config vocab
// size), tokenizer_config.json (add_bos_token as in the options, Gemma
// special tokens, left padding), generation_config.json.
// Deterministic: the same corpus and options give byte-identical files.
#ifndef TPU_DIST_MODELS_GEMMA_TINY_MODEL_H_
#define TPU_DIST_MODELS_GEMMA_TINY_MODEL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "models/gemma/gemma_config.h"

namespace tpudist::models::gemma {

struct TinyModelOptions {
  uint64_t seed = 0;
  double init_std = 0.02;     // HF initializer_range
  double layer_scalar = 1.0;  // HF initialises layer_scalar to ones
  bool add_bos_token = false; // as google/gemma-4-E2B-it's tokenizer_config.json
  GemmaConfig config = GemmaTinyConfig();
};

// REQUIRES: the corpus yields enough BPE merges to fill config.vocab_size
// (else InvalidArgument).
absl::Status WriteTinyGemmaDir(const std::string& dir, absl::string_view corpus, const TinyModelOptions& options = {});

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_TINY_MODEL_H_
