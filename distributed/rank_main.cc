#include "distributed/rank_main.h"

#include <c10/util/Exception.h>
#include <stdio.h>

#include <exception>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "distributed/job.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/exit_codes.h"

namespace tpudist::distributed {

int RunRankMain(absl::string_view name,
                absl::FunctionRef<absl::Status(const tpu_runtime::RankInfo&)> body,
                const RankMainOptions& options) {
  const std::string n(name);
  absl::StatusOr<tpu_runtime::RankInfo> info =
      tpu_runtime::DiscoverRankInfo(tpu_runtime::EnvMapFromProcess());
  if (!info.ok()) {
    fprintf(stderr, "%s: discovery failed: %s\n", n.c_str(), info.status().ToString().c_str());
    return 1;
  }
  const bool error_line = options.failure_line == FailureLine::kError;
  const std::string prefix = error_line ? absl::StrCat("rank ", info->rank, ": ") : "";
  absl::Status status;
  try {
    status = body(*info);
  } catch (const c10::Error& e) {  // torch's checks: the message, not the C++ backtrace
    status = absl::InternalError(absl::StrCat(prefix, e.what_without_backtrace()));
  } catch (const std::exception& e) {  // c10d and module forward report failures as exceptions
    status = absl::InternalError(absl::StrCat(prefix, e.what()));
  }
  if (status.ok()) return 0;
  const int exit_code = ExitCodeOf(status);
  const bool follower = exit_code == tpu_runtime::kPeerFailureExitCode;
  const std::string shown = WithoutExitCode(status).ToString();
  if (error_line) {
    fprintf(stderr, "%s: %s: %s\n", n.c_str(), follower ? "stopping, another rank failed" : "error",
            shown.c_str());
  } else {
    fprintf(stderr, "%s: rank %d %s: %s\n", n.c_str(), info->rank,
            follower ? "stopping, another rank failed" : "failed", shown.c_str());
  }
  return exit_code;
}

int UsageExitCode(absl::string_view name, std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (s.ok()) continue;
    fprintf(stderr, "%s: usage error: %s\n", std::string(name).c_str(),
            std::string(s.message()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace tpudist::distributed
