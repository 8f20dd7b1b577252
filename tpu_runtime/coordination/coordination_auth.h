// Authentication and TLS of the coordination service's gRPC calls.
//
// With a job secret (tpu_runtime/job_secret.h), a client first runs a
// handshake (the Hello RPC) that proves to it that the service holds the
// secret, and then authenticates each call with a credential bound to that
// service instance, so that nothing a stranger's listener receives can be
// replayed against the job's service:
//
//   client -> Hello{job j, task t, client nonce cn (32 random bytes)}
//   service -> {session id s (issued per Hello), server nonce sn, proof}
//     sn    = HMAC(instance key, "tpu_dist/coordination/v2/nonce", j, t, s)
//     proof = HMAC(secret, "tpu_dist/coordination/v2/service", j, t, cn, s, sn)
//   the client checks the proof: a service that cannot show it (a process
//   squatting on the master port, a service with another secret or none) is
//   refused before any credential is sent to it, naming the address;
//   then every call carries the metadata entry
//   x-tpu-dist-auth: v2.<s, 16 hex>.<hex HMAC(secret,
//                    "tpu_dist/coordination/v2/call", j, t, s, sn)>
//
// The instance key is 32 random bytes drawn when the service starts and
// never sent, so the service recomputes sn from s and accepts only sessions
// it issued itself, for the task the request claims. It keeps no state per
// Hello (a stranger's Hellos cost it two HMACs and no memory, and cannot
// evict a real task's session); credentials that passed are cached. A credential is worthless against any other service
// instance: one captured by a squatter (whose nonces no real service issued),
// or one from an earlier attempt or job with the same job id and secret, gets
// UNAUTHENTICATED naming the job; so does a call without a credential or
// with the old static "v1." one. Refusals are logged with the caller's
// address on rank 0's stderr. The secret itself never crosses the wire.
// Every new client (a restarted rank, a new attempt) runs the handshake again.
//
// What still holds only with TLS: a session is valid for the lifetime of
// the service instance, so someone who can sniff (or relay) the live
// connection between a rank and the real service can replay that rank's
// credential to that same service while it runs, and read or alter the
// traffic. TLS (ServiceOptions::tls_cert_path, ClientOptions::tls_ca_path;
// TPU_DIST_TLS_* in StartOrConnect) is the answer to that threat: the channel
// is encrypted and the client verifies the service's certificate.
//
// Without a secret, there is no handshake and no credential (as before).
//
// Thread-safety: all functions and CallAuthenticator's methods are
// thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ServerContext;
class ServerCredentials;
}  // namespace grpc

namespace tpudist::tpu_runtime::coordination {

inline constexpr char kAuthMetadataKey[] = "x-tpu-dist-auth";

// The service's answer to a Hello (the fields of HelloResponse).
struct SessionOffer {
  uint64_t session_id = 0;
  std::string server_nonce;  // 32 bytes
  std::string proof;         // 32 bytes, HMAC-SHA256
};

// Client side of the handshake with the service at `address`: draws a client
// nonce, calls `hello` with it (which sends the Hello RPC), checks the
// service's proof and returns the call credential of the session.
// Unauthenticated when the service cannot prove it holds `secret` (naming
// `address`, saying another process may be listening on the master port or
// rank 0 has another TPU_DIST_JOB_SECRET); Unavailable / DeadlineExceeded
// from `hello` come back as such, naming `address`.
// REQUIRES: !secret.empty().
absl::StatusOr<std::string> ClientHandshake(
    absl::string_view secret, absl::string_view job_id, int task_id,
    absl::string_view address,
    absl::FunctionRef<absl::StatusOr<SessionOffer>(absl::string_view)> hello);

// The service's side: answers Hellos and checks each call. With an empty
// secret every call passes and Hello is refused.
class CallAuthenticator {
 public:
  // Draws this service instance's key.
  CallAuthenticator(std::string secret, std::string job_id);

  bool enabled() const { return !secret_.empty(); }

  // The answer to Hello(job_id, task_id, client_nonce) from a sender already
  // validated as task `task_id` of this job. FailedPrecondition without a
  // secret; InvalidArgument for a client nonce that is not 32 bytes.
  absl::StatusOr<SessionOffer> Offer(absl::string_view job_id, int task_id,
                                     absl::string_view client_nonce) const;

  // "" when `credential` is a session credential this instance issued to
  // task `task_id` of job `job_id`; else what is wrong with it (a phrase
  // completing "the call ...").
  std::string Verify(absl::string_view credential, absl::string_view job_id,
                     int task_id) const;

  // OK when `context` carries a credential Verify() accepts for the
  // request's claims (`job_id`, `task_id`); else Unauthenticated naming the
  // service's job, the method and the caller's address, and a line on stderr
  // (the first 10 refusals, then every 100th).
  // `peer`: the caller's address when the service knows it better than
  // context.peer() (its own listener's connections: service_listener.h).
  absl::Status Check(const grpc::ServerContext& context,
                     absl::string_view method, absl::string_view job_id,
                     int task_id, const std::string& peer = "") const;

 private:
  std::string ServerNonce(absl::string_view job_id, int task_id,
                          uint64_t session_id) const;

  const std::string secret_;
  const std::string job_id_;
  std::string instance_key_;  // "" if the OS could not give random bytes
  mutable std::atomic<uint64_t> next_session_{1};
  mutable std::atomic<int> refused_{0};
  // Credentials that passed Verify() (this job's), by (task, session): a call
  // of a known session costs one constant-time comparison, not two HMACs.
  // Cleared when it reaches 4096 entries.
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::pair<int, uint64_t>, std::string> verified_
      ABSL_GUARDED_BY(mu_);
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

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_AUTH_H_
