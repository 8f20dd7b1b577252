// Authentication and TLS of the coordination service's gRPC calls.
//
// Call credential: with a job secret (tpu_runtime/job_secret.h), every call
// of task t of job j carries the metadata entry
//   x-tpu-dist-auth: v1.<hex HMAC-SHA256(secret, "tpu_dist/coordination/v1", j,
//   t)>
// The service recomputes it from the request's (job_id, task_id) and compares
// in constant time before the call touches the job's state; a call without
// it, or with one that does not match, gets UNAUTHENTICATED naming the job
// and is logged (with the caller's address) on rank 0's stderr. The secret
// itself never crosses the wire, so a credential seen on the wire does not
// let anyone join the TCP mesh (which challenges with fresh nonces).
//
// What it does not do: without TLS the credential travels in clear text, and
// someone who can sniff the network can replay it (it is per task, not per
// call) and read or alter the traffic. TLS (ServiceOptions::tls_cert_path,
// ClientOptions::tls_ca_path; TPU_DIST_TLS_* in StartOrConnect) is the
// answer to that threat: the channel is encrypted and the client verifies
// the service's certificate; the credential still authenticates the client.
//
// Thread-safety: all functions are thread-safe; CallAuthenticator is
// immutable after construction.
#ifndef TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_
#define TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerContext;
class ServerCredentials;
}  // namespace grpc

namespace tpudist::tpu_runtime::coordination {

inline constexpr char kAuthMetadataKey[] = "x-tpu-dist-auth";

// The credential task `task_id` of `job_id` presents: "v1.<64 hex digits>".
// REQUIRES: !secret.empty().
std::string TaskCredential(absl::string_view secret, absl::string_view job_id,
                           int task_id);

// The service's check of each call. With an empty secret every call passes.
class CallAuthenticator {
 public:
  // Precomputes the credentials of tasks [0, num_tasks) of `job_id`, so that
  // a call costs one constant-time comparison instead of an HMAC (~3 us).
  CallAuthenticator(std::string secret, std::string job_id, int num_tasks);

  bool enabled() const { return !secret_.empty(); }
  // OK when `context` carries the credential of task `task_id` of job
  // `job_id` (the request's claims); else Unauthenticated naming the service's
  // job, the method and the caller's address, and a line on stderr (the
  // first 10 refusals, then every 100th).
  // `peer`: the caller's address when the service knows it better than
  // context.peer() (its own listener's connections: service_listener.h).
  absl::Status Check(const grpc::ServerContext& context,
                     absl::string_view method, absl::string_view job_id,
                     int task_id, const std::string& peer = "") const;

 private:
  const std::string secret_;
  const std::string job_id_;
  std::vector<std::string> credentials_;  // [num_tasks], of job_id_
  mutable std::atomic<int> refused_{0};
};

// TLS from PEM files when `cert_path` and `key_path` are set (both or
// neither: InvalidArgument naming them), else insecure credentials. Errors
// name unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path);

// TLS verifying the service against the CA certificates in `ca_path` when it
// is set (and, when `server_name` is set, checking the certificate for that
// name instead of the dialed host, via `args`), else insecure credentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const std::string& ca_path,
                       const std::string& server_name,
                       grpc::ChannelArguments* args);

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_
