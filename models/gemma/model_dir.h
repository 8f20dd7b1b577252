// Checks on a Hugging Face model directory made before, and right after,
// reading it: the directory exists, and the tokenizer in it only emits ids
// the model's embedding has rows for.
//
//   CheckModelDir          NotFound "model directory X does not exist", or
//                          FailedPrecondition "X is not a directory"; every
//                          loader (LoadTokenizer, LoadGemmaFromHf,
//                          LoadHfWeights) calls it first, so a mistyped path
//                          is reported as such and not as a missing file.
//   CheckTokenizerFitsVocab  every id the tokenizer can return -- its model
//                          vocabulary and added tokens, and its pad / bos /
//                          eos ids -- is < the config's vocab_size. An id past
//                          it would index outside embed_tokens at the first
//                          forward pass.
//   LoadTokenizerForModel  LoadTokenizer + LoadGemmaConfig + the check: what
//                          the fine-tune uses.
//
// Thread-safety: free functions without shared state.
#ifndef TPU_DIST_MODELS_GEMMA_MODEL_DIR_H_
#define TPU_DIST_MODELS_GEMMA_MODEL_DIR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/gemma/tokenizer.h"

namespace tpudist::models::gemma {

// OK when `dir` is an existing directory (or a symlink to one).
absl::Status CheckModelDir(const std::string& dir);

// Loads the tokenizer in model directory `dir`: BpeTokenizer from
// tokenizer.json (+ tokenizer_config.json) when present, else
// SentencePieceTokenizer from tokenizer.model. NotFound "model directory <dir>
// does not exist" when it does not (CheckModelDir); NotFound naming `dir`
// when it holds neither file. (Here, not in tokenizer.h: the implementations
// include tokenizer.h, the interface.)
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir,
                                                         const TokenizerOptions& options = {});

// The file LoadTokenizer reads in `dir`: <dir>/tokenizer.json when present,
// else <dir>/tokenizer.model. Names the tokenizer in errors.
std::string TokenizerPath(const std::string& dir);

// InvalidArgument when `tokenizer` can return an id >= vocab_size, naming
// both sources and both values, e.g.
//   "<dir>/tokenizer.json: the tokenizer's ids go up to 600 (601 tokens
//    including added tokens), but <dir>/config.json has vocab_size 512 ..."
absl::Status CheckTokenizerFitsVocab(const Tokenizer& tokenizer, int64_t vocab_size,
                                     absl::string_view tokenizer_source, absl::string_view config_source);

// CheckModelDir, LoadTokenizer(dir, options), then the vocabulary check
// against <dir>/config.json's vocab_size.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerForModel(const std::string& dir,
                                                                 const TokenizerOptions& options = {});

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_MODEL_DIR_H_
