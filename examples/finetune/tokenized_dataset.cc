#include "examples/finetune/tokenized_dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::finetune {

std::string FormatPrompt(const DollyExample& ex) {
  if (ex.context.empty()) {
    return absl::StrCat("Instruction: ", ex.instruction,
                        "\nResponse: ", ex.response);
  }
  return absl::StrCat("Instruction: ", ex.instruction,
                      "\nContext: ", ex.context, "\nResponse: ", ex.response);
}

TokenizedRow MakeRow(absl::Span<const int> ids,
                     const TokenizeOptions& options) {
  const int64_t max_len = options.max_length;
  TokenizedRow row;
  row.input_ids.reserve(max_len);
  const int64_t full = static_cast<int64_t>(ids.size()) +
                       (options.bos_id >= 0) + (options.eos_id >= 0);
  row.truncated = full > max_len;
  auto push = [&](int64_t id) {
    if (static_cast<int64_t>(row.input_ids.size()) < max_len) {
      row.input_ids.push_back(id);
    }
  };
  if (options.bos_id >= 0) push(options.bos_id);
  for (int id : ids) push(id);
  if (options.eos_id >= 0) push(options.eos_id);
  row.num_tokens = static_cast<int64_t>(row.input_ids.size());
  row.attention_mask.assign(max_len, 0);
  std::fill_n(row.attention_mask.begin(), row.num_tokens, 1);
  row.labels = row.input_ids;
  row.input_ids.resize(max_len, options.pad_id);
  row.labels.resize(max_len, kIgnoreIndex);
  return row;
}

absl::StatusOr<TokenizedDataset> TokenizedDataset::Create(
    absl::Span<const DollyExample> examples, const Encoder& encode,
    const TokenizeOptions& options) {
  if (options.max_length <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_length must be > 0, got ", options.max_length));
  }
  if (examples.empty()) {
    return absl::InvalidArgumentError("no examples to tokenize");
  }
  std::vector<TokenizedRow> rows;
  rows.reserve(examples.size());
  int64_t truncated = 0;
  for (const DollyExample& ex : examples) {
    auto ids = encode(FormatPrompt(ex));
    if (!ids.ok()) {
      return absl::Status(ids.status().code(),
                          absl::StrCat("tokenizing the example from line ",
                                       ex.line, ": ", ids.status().message()));
    }
    rows.push_back(MakeRow(*ids, options));
    truncated += rows.back().truncated;
  }
  return TokenizedDataset(std::move(rows), options, truncated);
}

absl::StatusOr<Batch> TokenizedDataset::MakeBatch(
    absl::Span<const int64_t> indices) const {
  if (indices.empty()) return absl::InvalidArgumentError("empty batch");
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t l = seq_len();
  Batch batch;
  batch.input_ids = at::empty({b, l}, at::kLong);       // [batch, seq]
  batch.labels = at::empty({b, l}, at::kLong);          // [batch, seq]
  batch.attention_mask = at::empty({b, l}, at::kLong);  // [batch, seq]
  int64_t* ids = batch.input_ids.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  int64_t* mask = batch.attention_mask.data_ptr<int64_t>();
  const size_t row_bytes = sizeof(int64_t) * static_cast<size_t>(l);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = indices[r];
    if (i < 0 || i >= size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "batch index ", i, " (position ", r, ") outside [0, ", size(), ")"));
    }
    const TokenizedRow& row = rows_[i];
    std::memcpy(ids + r * l, row.input_ids.data(), row_bytes);
    std::memcpy(labels + r * l, row.labels.data(), row_bytes);
    std::memcpy(mask + r * l, row.attention_mask.data(), row_bytes);
    batch.num_tokens += row.num_tokens;
  }
  return batch;
}

}  // namespace tpudist::finetune
