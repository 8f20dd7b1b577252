// RunRankMain: the rest of a rank's main() once its flags are parsed --
// discovery, the rank's work, the one error line and the exit status.
//
//   int main(int argc, char** argv) {
//     ... parse flags; a bad one: return UsageExitCode("slice_check", {...}) ...
//     return distributed::RunRankMain("slice_check", [](const tpu_runtime::RankInfo& info) {
//       absl::StatusOr<std::unique_ptr<distributed::Job>> job = distributed::Job::Start(info, o);
//       if (!job.ok()) return job.status();
//       return (*job)->Run([&] { return Check(**job); });
//     });
//   }
//
// 1. Discovery: DiscoverRankInfo over the process environment; a failure
//    prints "<name>: discovery failed: <status>" and exits 1.
// 2. body(info). A c10::Error or std::exception escaping it becomes Internal
//    with its message (torch's checks: without the C++ backtrace).
// 3. A failure prints one line on stderr and exits ExitCodeOf(status)
//    (job.h): 1 for this rank's own failure, kPeerFailureExitCode (75) when
//    Job::Start/Run found that another rank failed first, which tpurun
//    reads as "followed the root cause" (docs/runtime.md, "Launching with
//    tpurun"). The line, with R = info.rank:
//      kRankFailed: "<name>: rank R failed: <status>"
//                   "<name>: rank R stopping, another rank failed: <status>"
//      kError:      "<name>: error: <status>"
//                   "<name>: stopping, another rank failed: <status>"
//                   (the status names the rank; an escaped exception's
//                   message gets "rank R: " in front)
// Success returns 0 and prints nothing.
// Thread-safety: call once, from main's thread.
#ifndef TPU_DIST_DISTRIBUTED_RANK_MAIN_H_
#define TPU_DIST_DISTRIBUTED_RANK_MAIN_H_

#include <initializer_list>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::distributed {

enum class FailureLine { kRankFailed, kError };

struct RankMainOptions {
  FailureLine failure_line = FailureLine::kRankFailed;
};

// Steps 1-3 above; returns the exit status for main().
int RunRankMain(absl::string_view name,
                absl::FunctionRef<absl::Status(const tpu_runtime::RankInfo&)> body,
                const RankMainOptions& options = {});

// Flag checks: 0 when every check is OK, else prints the first failure as
// "<name>: usage error: <message>" and returns 2 (tpurun's and the examples'
// exit status for bad flags).
int UsageExitCode(absl::string_view name, std::initializer_list<absl::Status> checks);

}  // namespace tpudist::distributed

#endif  // TPU_DIST_DISTRIBUTED_RANK_MAIN_H_
