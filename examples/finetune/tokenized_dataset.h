// From Dolly records to training batches: the prompt format, tokenization
// with truncation and padding to a fixed length, causal-LM labels, and
// collation into int64 tensors.
//
// Prompt format (FormatPrompt):
//   "Instruction: {instruction}\nResponse: {response}"
// and, when the context is non-empty, the context goes between the two
// (after the instruction, before the response, so that the model has read
// it by the time it writes the answer):
//   "Instruction: {instruction}\nContext: {context}\nResponse: {response}"
//
// Token layout of one row (max_length = L):
//   [bos?] Encode(prompt) [eos?]  truncated to L, then pad_id up to L.
// Truncation keeps the first L tokens, so a long row loses its tail (and its
// eos), as HF's tokenizer(truncation=True) does. labels equal input_ids
// except at pad positions (attention_mask == 0), which hold kIgnoreIndex
// (-100); the shift by one for next-token prediction is the loss's job, as in
// HF's causal-LM models. Masking is by position, not by id, so a real token
// equal to pad_id inside the text is still trained on.
//
// The tokenizer is injected as an Encoder so this file does not depend on
// models/gemma; Gemma's is Encode(text) with pad 0 / eos 1 / bos 2.
#ifndef EXAMPLES_FINETUNE_TOKENIZED_DATASET_H_
#define EXAMPLES_FINETUNE_TOKENIZED_DATASET_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "examples/finetune/dolly_dataset.h"

namespace tpudist::finetune {

inline constexpr int64_t kIgnoreIndex = -100;

// text -> token ids, without padding. Must be thread-compatible (called
// from one thread at a time by TokenizedDataset::Create).
using Encoder =
    std::function<absl::StatusOr<std::vector<int>>(absl::string_view)>;

struct TokenizeOptions {
  int64_t max_length = 512;  // L, > 0
  int pad_id = 0;            // Gemma: 0
  int bos_id = -1;  // prepended when >= 0 (Gemma: 2; -1 if Encode adds it)
  int eos_id = -1;  // appended when >= 0 (Gemma: 1)
};

std::string FormatPrompt(const DollyExample& ex);

// One padded row. All three vectors have max_length entries.
struct TokenizedRow {
  std::vector<int64_t> input_ids;       // [seq]
  std::vector<int64_t> attention_mask;  // [seq], 1 = real token, 0 = pad
  std::vector<int64_t> labels;          // [seq], kIgnoreIndex at pads
  int64_t num_tokens = 0;               // real tokens (sum of the mask)
  bool truncated = false;               // the untruncated row exceeded L
};

// Pure: adds bos/eos around `ids`, truncates, pads, builds mask and labels.
// REQUIRES: options.max_length > 0.
TokenizedRow MakeRow(absl::Span<const int> ids, const TokenizeOptions& options);

// A batch of rows, all int64 on CPU.
struct Batch {
  at::Tensor input_ids;       // [batch, seq] int64
  at::Tensor labels;          // [batch, seq] int64, kIgnoreIndex at pads
  at::Tensor attention_mask;  // [batch, seq] int64, 1 real / 0 pad
  int64_t num_tokens = 0;     // real tokens in the batch
};

// Tokenized, padded rows of a dataset, built once up front (the seed maps
// the tokenizer over the dataset before training too). Immutable after
// Create: const methods are safe to call from many threads.
class TokenizedDataset {
 public:
  // Tokenizes every example. An encoder error is returned with the
  // example's source line prepended. Errors on empty `examples` or
  // max_length <= 0.
  static absl::StatusOr<TokenizedDataset> Create(
      absl::Span<const DollyExample> examples, const Encoder& encode,
      const TokenizeOptions& options);

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
  // length of each row; mask and labels are derived in MakeBatch.
  TokenizeOptions options_;
  std::vector<int32_t> ids_;      // [size, seq], row-major
  std::vector<int64_t> lengths_;  // [size] real tokens per row
  int64_t num_truncated_ = 0;
};

}  // namespace tpudist::finetune

#endif  // EXAMPLES_FINETUNE_TOKENIZED_DATASET_H_
