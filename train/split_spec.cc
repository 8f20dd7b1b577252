#include "train/split_spec.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tpudist::train {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '-' || c == '.';
}

absl::Status BadSplit(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid split '", text, "': ", why,
      " (expected e.g. train, train[:1024], train[100:200], train[:10%], "
      "train[-100:])"));
}

// Parses one bound: "", "-12", "34", "10%", "-5%".
absl::StatusOr<std::optional<SplitBound>> ParseBound(absl::string_view b,
                                                     absl::string_view text) {
  if (b.empty()) return std::optional<SplitBound>();
  SplitBound bound;
  if (b.back() == '%') {
    bound.percent = true;
    b.remove_suffix(1);
  }
  // SimpleAtoi accepts a leading '+' and surrounding spaces; reject those so
  // the grammar stays strict.
  absl::string_view digits = b;
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      })) {
    return BadSplit(text, absl::StrCat("bound '", b, bound.percent ? "%" : "",
                                       "' is not an integer"));
  }
  if (!absl::SimpleAtoi(b, &bound.value)) {
    return BadSplit(text, absl::StrCat("bound '", b, "' is out of range"));
  }
  if (bound.percent && (bound.value < -100 || bound.value > 100)) {
    return BadSplit(text, absl::StrCat("percentage ", bound.value,
                                       "% is outside [-100%, 100%]"));
  }
  return std::optional<SplitBound>(bound);
}

// Maps a bound to an absolute row index in [0, n].
int64_t ToRow(const SplitBound& b, int64_t n) {
  int64_t v = b.value;
  if (b.percent) {
    // Round half away from zero: v% of n.
    const int64_t scaled = v * n;  // |v| <= 100, so no overflow for sane n
    const int64_t q = (std::llabs(scaled) + 50) / 100;
    v = scaled < 0 ? -q : q;
  }
  if (v < 0) v += n;
  return std::clamp<int64_t>(v, 0, n);
}

}  // namespace

absl::StatusOr<SplitSpec> ParseSplit(absl::string_view text) {
  SplitSpec spec;
  const size_t open = text.find('[');
  const absl::string_view name = text.substr(0, open);
  if (name.empty()) return BadSplit(text, "missing split name");
  if (!std::all_of(name.begin(), name.end(), IsNameChar)) {
    return BadSplit(text, absl::StrCat("split name '", name,
                                       "' has characters outside "
                                       "[A-Za-z0-9_.-]"));
  }
  spec.name = std::string(name);
  if (open == absl::string_view::npos) return spec;

  if (text.back() != ']') return BadSplit(text, "missing closing ']'");
  const absl::string_view inner = text.substr(open + 1, text.size() - open - 2);
  const size_t colon = inner.find(':');
  if (colon == absl::string_view::npos) {
    return BadSplit(text, "slice needs a ':' (single rows are not splits)");
  }
  if (inner.find(':', colon + 1) != absl::string_view::npos) {
    return BadSplit(text, "slice steps are not supported");
  }
  auto begin = ParseBound(inner.substr(0, colon), text);
  if (!begin.ok()) return begin.status();
  auto end = ParseBound(inner.substr(colon + 1), text);
  if (!end.ok()) return end.status();
  spec.begin = *begin;
  spec.end = *end;
  return spec;
}

absl::StatusOr<RowRange> ResolveSplit(const SplitSpec& spec, int64_t num_rows,
                                      absl::string_view spec_text) {
  if (num_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split '", spec_text, "': negative row count ", num_rows));
  }
  RowRange range;
  range.begin = spec.begin ? ToRow(*spec.begin, num_rows) : 0;
  range.end = spec.end ? ToRow(*spec.end, num_rows) : num_rows;
  if (range.end <= range.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split '", spec_text, "' selects no rows: resolved to [", range.begin,
        ", ", range.end, ") of a split with ", num_rows, " rows"));
  }
  return range;
}

}  // namespace tpudist::train
