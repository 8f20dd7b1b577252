// SplitSpec: the Hugging Face `datasets` split syntax ("train",
// "train[:1024]", "train[100:200]", "train[:10%]", "train[-100:]") parsed
// into a value, and resolved against a dataset size into a row range.
//
// Both functions are pure: no I/O, no state, safe from any thread.
//
// Semantics (chosen to match datasets' ReadInstruction with the default
// "closest" rounding, except that halves round away from zero):
//   - Bounds are optional: "train[:k]" is [0, k), "train[k:]" is [k, n).
//   - A bound is an integer row index or a percentage ("10%") of n; one
//     slice may mix the two ("train[10%:500]").
//   - Negative bounds count from the end: -100 is n - 100, -10% is n - n/10.
//   - Absolute bounds are clamped to [0, n] after the negative adjustment,
//     as Python slicing does; percentages must lie in [-100, 100].
//   - A resolved range that is empty is an error (an empty split is always a
//     configuration mistake in a fine-tune).
#ifndef TPU_DIST_TRAIN_SPLIT_SPEC_H_
#define TPU_DIST_TRAIN_SPLIT_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::train {

// One end of a slice.
struct SplitBound {
  int64_t value = 0;     // row index, or percent when `percent` is true
  bool percent = false;  // "10%" rather than "10"
  bool operator==(const SplitBound& o) const {
    return value == o.value && percent == o.percent;
  }
};

struct SplitSpec {
  std::string name;                 // "train"
  std::optional<SplitBound> begin;  // absent: from the first row
  std::optional<SplitBound> end;    // absent: through the last row
};

// Half-open row range [begin, end) into a dataset; end > begin.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Parses `text`. Whitespace is not allowed; the name is [A-Za-z0-9_.-]+.
// A bare "train[]" or a missing ':' ("train[5]") is rejected: HF datasets
// treats "train[5]" as an error too. Errors are InvalidArgument and quote
// `text`.
absl::StatusOr<SplitSpec> ParseSplit(absl::string_view text);

// Resolves `spec` against a split of `num_rows` rows. Errors
// (InvalidArgument) name `spec_text` (the original string, for messages),
// the row count and the resolved range.
absl::StatusOr<RowRange> ResolveSplit(const SplitSpec& spec, int64_t num_rows,
                                      absl::string_view spec_text);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_SPLIT_SPEC_H_
