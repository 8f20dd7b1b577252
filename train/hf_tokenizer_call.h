// What HF's `tokenizer(text, truncation=True, max_length=L,
// padding="max_length")` does around a text's tokens for a model directory,
// read from its files instead of hard-coded, so the fine-tune's rows equal
// the seed's for any HF tokenizer directory:
//
//   padding_side     tokenizer_config.json "padding_side" ("left"/"right";
//                    absent: "right", HF's default). Gemma's is "left".
//   truncation_side  tokenizer_config.json "truncation_side" (same rules).
//   bos / eos        the special tokens tokenizer.json's post_processor puts
//                    before / after the text for a single sequence
//                    (TemplateProcessing "single", also inside a Sequence
//                    processor). null adds nothing. This is what transformers
//                    5.x does for Gemma: it follows the post-processor and
//                    ignores tokenizer_config's add_bos_token/add_eos_token
//                    (checked with transformers 5.23: add_bos_token true with
//                    a post-processor-less tokenizer.json adds no BOS).
//                    The bundled data/tiny_gemma has none: no BOS, no EOS.
//
// The pad id is the tokenizer's (gemma::Tokenizer::pad_id). Pure parsing
// (ParseHfTokenizerCall) is split from the file reading.
#ifndef TPU_DIST_TRAIN_HF_TOKENIZER_CALL_H_
#define TPU_DIST_TRAIN_HF_TOKENIZER_CALL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/tokenized_dataset.h"

namespace tpudist::train {

struct HfTokenizerCall {
  Side padding_side = Side::kRight;
  Side truncation_side = Side::kRight;
  int bos_id = -1;  // prepended by the post-processor; -1: none
  int eos_id = -1;  // appended by the post-processor; -1: none
  // False when the directory has no tokenizer.json (e.g. SentencePiece
  // only): bos/eos are then unknown here and left to the caller.
  bool has_tokenizer_json = false;
};

// Pure. `tokenizer_config_json` / `tokenizer_json`: file contents, "" when
// the file is absent. InvalidArgument on bad JSON or a bad side value;
// Unimplemented for a post-processor this does not model (BertProcessing,
// RobertaProcessing, or more than one special token on a side).
absl::StatusOr<HfTokenizerCall> ParseHfTokenizerCall(
    absl::string_view tokenizer_config_json, absl::string_view tokenizer_json);

// Reads <model_dir>/tokenizer_config.json and <model_dir>/tokenizer.json
// (each optional). Errors name the file.
absl::StatusOr<HfTokenizerCall> ReadHfTokenizerCall(const std::string& model_dir);

// TokenizeOptions for rows of `max_length` tokens padded with `pad_id`.
TokenizeOptions ToTokenizeOptions(const HfTokenizerCall& call, int64_t max_length,
                                  int pad_id);

// What the fine-tune uses (gemma_finetune and the seed-fidelity test):
// ReadHfTokenizerCall(model_dir) with the tokenizer's pad id; when the
// directory has no tokenizer.json, `fallback_bos_id` (the tokenizer's own
// BOS rule: its bos id if it adds one, else -1) as bos. The encoder that
// goes with it must add no specials.
absl::StatusOr<TokenizeOptions> SeedTokenizeOptions(const std::string& model_dir,
                                                    int64_t max_length, int pad_id,
                                                    int fallback_bos_id);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_HF_TOKENIZER_CALL_H_
