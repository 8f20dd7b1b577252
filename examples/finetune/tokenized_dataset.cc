#include "examples/finetune/tokenized_dataset.h"

#include <algorithm>
#include <cstdint>
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
  TokenizedDataset ds(options);
  ds.ids_.reserve(examples.size() * static_cast<size_t>(options.max_length));
  ds.lengths_.reserve(examples.size());
  for (const DollyExample& ex : examples) {
    auto ids = encode(FormatPrompt(ex));
    if (!ids.ok()) {
      return absl::Status(ids.status().code(),
                          absl::StrCat("tokenizing the example from line ",
                                       ex.line, ": ", ids.status().message()));
    }
    const TokenizedRow row = MakeRow(*ids, options);
    // Every id came from an int (or the int-typed options), so it fits.
    for (int64_t id : row.input_ids) ds.ids_.push_back(static_cast<int32_t>(id));
    ds.lengths_.push_back(row.num_tokens);
    ds.num_truncated_ += row.truncated;
  }
  return ds;
}

TokenizedRow TokenizedDataset::row(int64_t i) const {
  const int64_t l = seq_len();
  TokenizedRow r;
  r.num_tokens = lengths_.at(static_cast<size_t>(i));
  r.input_ids.assign(ids_.begin() + i * l, ids_.begin() + (i + 1) * l);
  r.attention_mask.assign(static_cast<size_t>(l), 0);
  r.labels.assign(static_cast<size_t>(l), kIgnoreIndex);
  for (int64_t j = 0; j < r.num_tokens; ++j) {
    r.attention_mask[j] = 1;
    r.labels[j] = r.input_ids[j];
  }
  return r;
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
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = indices[r];
    if (i < 0 || i >= size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "batch index ", i, " (position ", r, ") outside [0, ", size(), ")"));
    }
    const int32_t* src = ids_.data() + i * l;
    const int64_t len = lengths_[static_cast<size_t>(i)];
    for (int64_t j = 0; j < l; ++j) {
      const bool real = j < len;
      ids[r * l + j] = src[j];
      labels[r * l + j] = real ? src[j] : kIgnoreIndex;
      mask[r * l + j] = real ? 1 : 0;
    }
    batch.num_tokens += len;
  }
  return batch;
}

}  // namespace tpudist::finetune
