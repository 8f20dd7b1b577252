#include "tpu_runtime/duration_check.h"

#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime {

absl::Status CheckUserDuration(absl::string_view name, absl::Duration value, DurationRule rule) {
  const bool infinite = value == absl::InfiniteDuration() || value == -absl::InfiniteDuration();
  const bool allow_zero = rule == DurationRule::kNonNegative;
  const bool allow_infinite = rule == DurationRule::kPositiveOrInfinite;
  if (infinite ? allow_infinite && value > absl::ZeroDuration()
               : (allow_zero ? value >= absl::ZeroDuration() : value > absl::ZeroDuration()) &&
                     value <= kMaxUserDuration) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, "=", absl::FormatDuration(value), ": expected a finite duration ",
                   allow_zero ? ">= 0" : "> 0", " and at most ",
                   absl::FormatDuration(kMaxUserDuration),
                   allow_infinite ? ", or inf for no limit" : "", " (e.g. 30s, 5m, 2h)"));
}

}  // namespace tpudist::tpu_runtime
