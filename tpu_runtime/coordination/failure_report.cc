#include "tpu_runtime/coordination/failure_report.h"

#include <c10/util/Exception.h>

#include <exception>

namespace tpudist::tpu_runtime::coordination {

absl::Status RunReportingFailure(CoordinationRuntime& runtime,
                                 absl::FunctionRef<absl::Status()> body,
                                 int* exit_code) {
  absl::Status status;
  try {
    status = body();
  } catch (const c10::Error& e) {  // the message, not the C++ backtrace
    status = absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  *exit_code = status.ok() ? 0 : runtime.ReportFailure(status);
  return status;
}

}  // namespace tpudist::tpu_runtime::coordination
