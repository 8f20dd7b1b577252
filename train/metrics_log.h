// Per-epoch training metrics: the numbers, the rank-0 console line, and the
// run's metrics.jsonl (one JSON object per epoch, appended and fsynced):
//
//   {"epoch":1,"loss":3.1402,"epoch_time_s":28.17,"tokens_per_s":18613.5,
//    "steps":64,"timestamp":"2026-12-02T13:45:05.123456+00:00"}
//
// tools/plot_metrics reads this file. Pure functions are thread-safe;
// MetricsLog is thread-compatible (one writer: rank 0).
#ifndef TPU_DIST_TRAIN_METRICS_LOG_H_
#define TPU_DIST_TRAIN_METRICS_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpudist::train {

inline constexpr char kMetricsFile[] = "metrics.jsonl";
inline constexpr char kDiscardedMetricsFile[] = "metrics.discarded.jsonl";

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double loss = 0.0;  // mean training loss over the epoch
  double epoch_time_s = 0.0;
  double tokens_per_s = 0.0;
  int64_t steps = 0;  // optimizer steps in the epoch
  absl::Time timestamp;
};

// steps x global_batch x seq_len / seconds: padded tokens processed per
// second by the whole job (what the seed reports). 0 when seconds <= 0.
double TokensPerSecond(int64_t steps, int64_t global_batch, int64_t seq_len,
                       double seconds);

// "Epoch 1/3 | loss=3.1402 | epoch_time=28.17s | tokens/s=18613.5"
std::string FormatEpochLine(const EpochMetrics& m, int64_t num_epochs);

// One JSON object and a trailing '\n'. A non-finite loss is written as null.
std::string EpochMetricsToJsonLine(const EpochMetrics& m);

// Inverse of EpochMetricsToJsonLine; InvalidArgument naming `where`.
absl::StatusOr<EpochMetrics> ParseEpochMetricsLine(absl::string_view line,
                                                   absl::string_view where);

// Appends epochs to <run_dir>/metrics.jsonl.
class MetricsLog {
 public:
  // Creates run_dir if needed; does not truncate an existing log (a resumed
  // run keeps appending).
  static absl::StatusOr<MetricsLog> Open(const std::string& run_dir);

  const std::string& path() const { return path_; }

  // Appends one line and fsyncs. Errors name the path.
  absl::Status Append(const EpochMetrics& m);

  // Before a run continues after `last_epoch` (1-based; 0 = from scratch):
  // drops every line for a later epoch, and every line that does not parse
  // (a torn append), so that no epoch is ever logged twice. Dropped lines
  // are appended to <run_dir>/metrics.discarded.jsonl, the log is rewritten
  // through a temp file + rename + fsync. Returns how many were dropped
  // (0: the file is left untouched; a missing file is fine).
  absl::StatusOr<int64_t> TrimAfter(int64_t last_epoch);

 private:
  explicit MetricsLog(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Reads every line of a metrics.jsonl; errors name path:line.
absl::StatusOr<std::vector<EpochMetrics>> ReadMetricsLog(
    const std::string& path);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_METRICS_LOG_H_
