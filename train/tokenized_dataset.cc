#include "train/tokenized_dataset.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::train {

std::string FormatPrompt(const DollyExample& ex, bool include_context) {
  if (!include_context || ex.context.empty()) {
    return absl::StrCat("Instruction: ", ex.instruction,
                        "\nResponse: ", ex.response);
  }
  return absl::StrCat("Instruction: ", ex.instruction,
                      "\nContext: ", ex.context, "\nResponse: ", ex.response);
}

namespace {

// First position of the real tokens in a padded row of length l.
int64_t RealBegin(int64_t l, int64_t num_tokens, Side padding_side) {
  return padding_side == Side::kLeft ? l - num_tokens : 0;
}

int64_t LabelOf(int64_t id, int pad_id) {
  return id == pad_id ? kIgnoreIndex : id;
}

}  // namespace

TokenizedRow MakeRow(absl::Span<const int> ids,
                     const TokenizeOptions& options) {
  const int64_t max_len = options.max_length;
  const int64_t num_special = (options.bos_id >= 0) + (options.eos_id >= 0);
  const int64_t n = static_cast<int64_t>(ids.size());
  TokenizedRow row;
  row.truncated = n + num_special > max_len;
  // As HF: the text is cut to leave room for the specials, from the
  // truncation side.
  const int64_t keep =
      row.truncated ? std::max<int64_t>(0, max_len - num_special) : n;
  const int64_t first =
      options.truncation_side == Side::kLeft ? n - keep : 0;
  std::vector<int64_t> real;
  real.reserve(keep + num_special);
  if (options.bos_id >= 0) real.push_back(options.bos_id);
  real.insert(real.end(), ids.begin() + first, ids.begin() + first + keep);
  if (options.eos_id >= 0) real.push_back(options.eos_id);
  // Only when L < #specials: keep the head.
  if (static_cast<int64_t>(real.size()) > max_len) real.resize(max_len);
  row.num_tokens = static_cast<int64_t>(real.size());
  const int64_t begin = RealBegin(max_len, row.num_tokens, options.padding_side);
  row.input_ids.assign(max_len, options.pad_id);
  std::copy(real.begin(), real.end(), row.input_ids.begin() + begin);
  row.attention_mask.assign(max_len, 0);
  std::fill_n(row.attention_mask.begin() + begin, row.num_tokens, 1);
  row.labels.resize(max_len);
  for (int64_t j = 0; j < max_len; ++j) {
    row.labels[j] = LabelOf(row.input_ids[j], options.pad_id);
  }
  return row;
}

absl::StatusOr<TokenizedDataset> TokenizedDataset::Create(
    absl::Span<const DollyExample> examples, const Encoder& encode,
    const TokenizeOptions& options, bool include_context) {
  if (options.max_length <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_length must be > 0, got ", options.max_length));
  }
  if (options.pad_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "padding to max_length needs a pad token id, got ", options.pad_id));
  }
  if (examples.empty()) {
    return absl::InvalidArgumentError("no examples to tokenize");
  }
  TokenizedDataset ds(options);
  ds.ids_.reserve(examples.size() * static_cast<size_t>(options.max_length));
  ds.lengths_.reserve(examples.size());
  for (const DollyExample& ex : examples) {
    auto ids = encode(FormatPrompt(ex, include_context));
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
  const int64_t begin = RealBegin(l, r.num_tokens, options_.padding_side);
  r.attention_mask.assign(static_cast<size_t>(l), 0);
  std::fill_n(r.attention_mask.begin() + begin, r.num_tokens, 1);
  r.labels.resize(static_cast<size_t>(l));
  for (int64_t j = 0; j < l; ++j) {
    r.labels[j] = LabelOf(r.input_ids[j], options_.pad_id);
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
    const int64_t begin = RealBegin(l, len, options_.padding_side);
    for (int64_t j = 0; j < l; ++j) {
      ids[r * l + j] = src[j];
      labels[r * l + j] = LabelOf(src[j], options_.pad_id);
      mask[r * l + j] = (j >= begin && j < begin + len) ? 1 : 0;
    }
    batch.num_tokens += len;
  }
  return batch;
}

}  // namespace tpudist::train
