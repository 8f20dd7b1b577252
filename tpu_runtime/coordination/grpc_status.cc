#include "tpu_runtime/coordination/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime::coordination {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (context.empty()) return absl::Status(code, status.error_message());
  return absl::Status(code,
                      absl::StrCat(context, ": ", status.error_message()));
}

absl::Time FromGrpcDeadline(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

int64_t ToMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  if (d == absl::InfiniteDuration()) return INT64_MAX;
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return ms > 0 ? ms : 1;
}

}  // namespace tpudist::tpu_runtime::coordination
