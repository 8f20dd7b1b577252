// From Dolly records to training batches exactly as the seed's Python makes
// them: the prompt, HF's tokenizer(text, truncation=True, max_length=L,
// padding="max_length") and DataCollatorForLanguageModeling(mlm=False).
//
// Prompt format (FormatPrompt), the seed's:
//   "Instruction: {instruction}\nResponse: {response}"
// The context is dropped, as the seed drops it. With include_context (the
// fine-tune's --include-context) a non-empty context goes between the two:
//   "Instruction: {instruction}\nContext: {context}\nResponse: {response}"
//
// Token layout of one row (max_length = L), as HF's tokenizer call:
//   [bos?] Encode(prompt) [eos?]   bos/eos are what the tokenizer's
//   post-processor adds (hf_tokenizer_call.h reads it); the bundled Gemma
//   tokenizer adds neither.
// Truncation (truncation_side, default right = keep the head) cuts the text
// tokens to L - #specials, so bos and eos survive it, as in HF. Padding with
// pad_id to L on padding_side (the bundled tokenizer's is left).
// attention_mask is 1 on real tokens (by position), 0 on padding.
// labels are DataCollatorForLanguageModeling(mlm=False)'s: input_ids with
// every token equal to pad_id replaced by kIgnoreIndex (-100) -- by id, not by
// position, so a real token equal to pad_id loses its label too (with
// pad == eos, every real <eos>). The shift by one for next-token prediction
// is the loss's job, as in HF's causal-LM models.
//
// The tokenizer is injected as an Encoder (text -> ids without specials) so
// this file does not depend on models/gemma.
#ifndef TPU_DIST_TRAIN_TOKENIZED_DATASET_H_
#define TPU_DIST_TRAIN_TOKENIZED_DATASET_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "train/dolly_dataset.h"

namespace tpudist::train {

inline constexpr int64_t kIgnoreIndex = -100;

// text -> token ids, without padding. Must be thread-compatible (called
// from one thread at a time by TokenizedDataset::Create).
using Encoder =
    std::function<absl::StatusOr<std::vector<int>>(absl::string_view)>;

// Which end padding goes to / truncation cuts from (HF's padding_side,
// truncation_side).
enum class Side { kLeft, kRight };

struct TokenizeOptions {
  int64_t max_length = 512;  // L, > 0
  int pad_id = 0;            // >= 0; Gemma: 0
  int bos_id = -1;  // prepended when >= 0 (-1 if Encode adds it, or none)
  int eos_id = -1;  // appended when >= 0
  Side padding_side = Side::kRight;     // HF's default; Gemma's config: left
  Side truncation_side = Side::kRight;  // HF's default: keep the head
};

// The seed's prompt; include_context adds a "Context:" line when the
// example has one.
std::string FormatPrompt(const DollyExample& ex, bool include_context = false);

// One padded row. All three vectors have max_length entries.
struct TokenizedRow {
  std::vector<int64_t> input_ids;       // [seq]
  std::vector<int64_t> attention_mask;  // [seq], 1 = real token, 0 = pad
  std::vector<int64_t> labels;          // [seq], kIgnoreIndex where id == pad_id
  int64_t num_tokens = 0;               // real tokens (sum of the mask)
  bool truncated = false;               // the untruncated row exceeded L
};

// Pure: truncates `ids`, adds bos/eos, pads, builds mask and labels (see the
// top of the file). REQUIRES: options.max_length > 0, options.pad_id >= 0.
TokenizedRow MakeRow(absl::Span<const int> ids, const TokenizeOptions& options);

// A batch of rows, all int64 on CPU.
struct Batch {
  at::Tensor input_ids;       // [batch, seq] int64
  at::Tensor labels;          // [batch, seq] int64, kIgnoreIndex where id == pad
  at::Tensor attention_mask;  // [batch, seq] int64, 1 real / 0 pad
  int64_t num_tokens = 0;     // real tokens in the batch
};

// Tokenized, padded rows of a dataset, built once up front (the seed maps
// the tokenizer over the dataset before training too). Immutable after
// Create: const methods are safe to call from many threads.
class TokenizedDataset {
 public:
  // Tokenizes FormatPrompt(example, include_context) of every example. An
  // encoder error is returned with the example's source line prepended.
  // Errors on empty `examples`, max_length <= 0 or pad_id < 0.
  static absl::StatusOr<TokenizedDataset> Create(
      absl::Span<const DollyExample> examples, const Encoder& encode,
      const TokenizeOptions& options, bool include_context = false);

  int64_t size() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t seq_len() const { return options_.max_length; }
  int64_t num_truncated() const { return num_truncated_; }

  // Row i rebuilt from the compact storage. REQUIRES: 0 <= i < size().
  TokenizedRow row(int64_t i) const;

  // Stacks rows `indices` (in order) into a Batch of shape
  // [indices.size(), seq_len()]. OutOfRange names a bad index; an empty
  // `indices` is InvalidArgument.
  absl::StatusOr<Batch> MakeBatch(absl::Span<const int64_t> indices) const;

 private:
  explicit TokenizedDataset(TokenizeOptions options) : options_(options) {}

  // Compact storage: padded ids as int32 (4 bytes per position instead of
  // 24 for ids + mask + labels; Dolly-15k at L=512 is ~31 MB) and the real
  // length of each row; mask (by position and padding side) and labels (by
  // pad id) are derived in MakeBatch.
  TokenizeOptions options_;
  std::vector<int32_t> ids_;      // [size, seq], row-major
  std::vector<int64_t> lengths_;  // [size] real tokens per row
  int64_t num_truncated_ = 0;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_TOKENIZED_DATASET_H_
