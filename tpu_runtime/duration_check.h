// The one rule for durations a user gives: flags (--timeout,
// --grace-period, --heartbeat-timeout), GroupInitOptions::timeout (C++ and
// Python's init_process_group). Pure, thread-safe.
//
// A timeout must be finite, > 0 and at most kMaxUserDuration: "inf" became
// INT64_MAX milliseconds downstream, and every deadline computed from it
// overflowed into the past (every collective "timed out after
// 9223372036854775807 ms" at once); 0 and negative values expire at once.
// Where "no limit" is meaningful (tpurun's job --timeout) the caller says so
// with kPositiveOrInfinite; a grace period may be 0 (kNonNegative).
//
// Errors are InvalidArgument of the form
//   --timeout=inf: expected a finite duration > 0 and at most 8760h (e.g. 30s, 5m, 2h)
// naming the flag or field, the value as given and what is allowed.
#ifndef TPU_DIST_TPU_RUNTIME_DURATION_CHECK_H_
#define TPU_DIST_TPU_RUNTIME_DURATION_CHECK_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpudist::tpu_runtime {

// One year: far below any overflow (steady_clock nanoseconds run out after
// ~292 years), far above any sensible timeout.
inline constexpr absl::Duration kMaxUserDuration = absl::Hours(24 * 365);

enum class DurationRule {
  kPositive,            // 0 < d <= kMaxUserDuration
  kNonNegative,         // 0 <= d <= kMaxUserDuration
  kPositiveOrInfinite,  // kPositive, or infinite ("inf": no limit)
};

// OK when `value` obeys `rule`; else InvalidArgument naming `name` (e.g.
// "--timeout", "GroupInitOptions.timeout").
absl::Status CheckUserDuration(absl::string_view name, absl::Duration value, DurationRule rule);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_DURATION_CHECK_H_
