// Conversions between absl::Status and grpc::Status for the coordination
// service and client. The numeric codes agree (both follow
// google.rpc.Code), so a code survives the round trip unchanged.
//
// Thread-safety: pure functions.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_GRPC_STATUS_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_GRPC_STATUS_H_

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace tpudist::tpu_runtime::coordination {

grpc::Status ToGrpcStatus(const absl::Status& status);
// Prefixes the message with `context` (e.g. "Get('k') to 127.0.0.1:123")
// when non-empty.
absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view context = "");
// A gRPC deadline (system_clock) as an absl::Time; InfiniteFuture for none.
absl::Time FromGrpcDeadline(std::chrono::system_clock::time_point deadline);
// Milliseconds for a proto field, at least 1 for a positive duration.
int64_t ToMillis(absl::Duration d);

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_GRPC_STATUS_H_
