// RunReportingFailure: how a rank's work runs inside its job's coordination
// runtime so that a failure is reported to every other rank at once and the
// launcher can tell the root cause from the ranks that followed it.
//
//   int exit_code = 0;
//   absl::Status s = RunReportingFailure(*runtime, [&] { return Train(); },
//                                        &exit_code);
//   if (!s.ok()) { fprintf(stderr, "...%s\n", s.message()); return exit_code; }
//
// On failure (a non-OK status, or an exception: torch and c10d report errors
// by throwing) the error is handed to CoordinationRuntime::ReportFailure
// while the runtime is still up: if the job had no error yet it becomes the
// job error (the other ranks' coordination clients get it within
// milliseconds and, with distributed::Job's error callback, abort their
// collectives) and *exit_code is 1; if another task failed first, *exit_code
// is kPeerFailureExitCode (tpu_runtime/exit_codes.h).
//
// Thread-safety: as CoordinationRuntime::ReportFailure (call from the rank's
// main thread).
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_FAILURE_REPORT_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_FAILURE_REPORT_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "tpu_runtime/coordination/coordination_runtime.h"

namespace tpudist::tpu_runtime::coordination {

// Runs body(); returns its status (an exception becomes Internal with its
// message, without a C++ backtrace). *exit_code: 0 on success, else as
// above. REQUIRES: exit_code != nullptr.
absl::Status RunReportingFailure(CoordinationRuntime& runtime,
                                 absl::FunctionRef<absl::Status()> body,
                                 int* exit_code);

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_FAILURE_REPORT_H_
