#include "train/metrics_log.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "train/internal/fs_util.h"
#include "io/atomic_file.h"

namespace tpudist::train {
namespace {
constexpr char kTimeFormat[] = "%Y-%m-%dT%H:%M:%E6S%Ez";
}  // namespace

double TokensPerSecond(int64_t steps, int64_t global_batch, int64_t seq_len,
                       double seconds) {
  if (seconds <= 0) return 0.0;
  return static_cast<double>(steps) * static_cast<double>(global_batch) *
         static_cast<double>(seq_len) / seconds;
}

std::string FormatEpochLine(const EpochMetrics& m, int64_t num_epochs) {
  return absl::StrFormat(
      "Epoch %d/%d | loss=%.4f | epoch_time=%.2fs | tokens/s=%.1f", m.epoch,
      num_epochs, m.loss, m.epoch_time_s, m.tokens_per_s);
}

std::string EpochMetricsToJsonLine(const EpochMetrics& m) {
  nlohmann::ordered_json j;
  j["epoch"] = m.epoch;
  if (std::isfinite(m.loss)) {
    j["loss"] = m.loss;
  } else {
    j["loss"] = nullptr;
  }
  j["epoch_time_s"] = m.epoch_time_s;
  j["tokens_per_s"] = m.tokens_per_s;
  j["steps"] = m.steps;
  j["timestamp"] =
      absl::FormatTime(kTimeFormat, m.timestamp, absl::UTCTimeZone());
  return j.dump() + "\n";
}

absl::StatusOr<EpochMetrics> ParseEpochMetricsLine(absl::string_view line,
                                                   absl::string_view where) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("bad JSON: ", e.what()));
  }
  if (!j.is_object()) return bad("not a JSON object");
  EpochMetrics m;
  for (const char* key : {"epoch", "steps"}) {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return bad(absl::StrCat("field \"", key, "\" missing or not an integer"));
    }
  }
  for (const char* key : {"epoch_time_s", "tokens_per_s"}) {
    if (!j.contains(key) || !j[key].is_number()) {
      return bad(absl::StrCat("field \"", key, "\" missing or not a number"));
    }
  }
  m.epoch = j["epoch"].get<int64_t>();
  m.steps = j["steps"].get<int64_t>();
  m.epoch_time_s = j["epoch_time_s"].get<double>();
  m.tokens_per_s = j["tokens_per_s"].get<double>();
  if (!j.contains("loss")) return bad("field \"loss\" missing");
  if (j["loss"].is_null()) {
    m.loss = std::numeric_limits<double>::quiet_NaN();
  } else if (j["loss"].is_number()) {
    m.loss = j["loss"].get<double>();
  } else {
    return bad("field \"loss\" not a number");
  }
  std::string err;
  if (!j.contains("timestamp") || !j["timestamp"].is_string() ||
      !absl::ParseTime(kTimeFormat, j["timestamp"].get<std::string>(),
                       &m.timestamp, &err)) {
    return bad(absl::StrCat("field \"timestamp\" missing or malformed ", err));
  }
  return m;
}

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& run_dir) {
  if (absl::Status st = internal::MakeDirs(run_dir); !st.ok()) return st;
  return MetricsLog(absl::StrCat(run_dir, "/", kMetricsFile));
}

absl::Status MetricsLog::Append(const EpochMetrics& m) {
  return internal::AppendFileSynced(path_, EpochMetricsToJsonLine(m));
}

absl::StatusOr<int64_t> MetricsLog::TrimAfter(int64_t last_epoch) {
  auto body = internal::ReadFile(path_);
  if (absl::IsNotFound(body.status())) return 0;
  if (!body.ok()) return body.status();
  std::string kept, dropped;
  int64_t n_dropped = 0;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto m = ParseEpochMetricsLine(line, path_);
    std::string& to = m.ok() && m->epoch <= last_epoch ? kept : dropped;
    absl::StrAppend(&to, line, "\n");
    if (&to == &dropped) ++n_dropped;
  }
  if (n_dropped == 0) return 0;
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (absl::Status st = internal::AppendFileSynced(
          absl::StrCat(dir, "/", kDiscardedMetricsFile), dropped);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = io::WriteFileAtomically(path_, kept); !st.ok()) return st;
  return n_dropped;
}

absl::StatusOr<std::vector<EpochMetrics>> ReadMetricsLog(
    const std::string& path) {
  auto body = internal::ReadFile(path);
  if (!body.ok()) return body.status();
  std::vector<EpochMetrics> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto m = ParseEpochMetricsLine(line, absl::StrCat(path, ":", line_no));
    if (!m.ok()) return m.status();
    out.push_back(*m);
  }
  return out;
}

}  // namespace tpudist::train
