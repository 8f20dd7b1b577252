// CoordinationClient: one task's connection to the job's CoordinationService.
//
// Typical use (every rank, rank 0 included):
//   ASSIGN_OR_RETURN(auto client, CoordinationClient::Connect(
//       "10.0.0.1:29500", job_id, rank, ClientOptions{}));
//   RETURN_IF_ERROR(client->Register());     // starts heartbeats
//   RETURN_IF_ERROR(client->Barrier("init", absl::Minutes(5)));
//   ...
//   client->Shutdown();
//
// Connect() retries until connect_timeout (rank 0 may start the service a bit
// later than the others). Register() connects the task and starts a
// background heartbeat thread (interval: options.heartbeat_interval, or a
// third of the service's heartbeat timeout). The service answers each
// heartbeat with the job error, if any: the client records it (health()) and
// calls options.error_callback once, from the heartbeat thread. Losing
// contact with the service for its heartbeat timeout (each heartbeat's
// deadline is the last contact + that timeout) is also recorded as an error
// (Unavailable).
//
// With options.watch_errors (the default) a second thread keeps a long-poll
// PollForError outstanding: the job error reaches this task within
// milliseconds, and when this process dies its connection closes and the
// service fails the task at once (the heartbeat timeout remains the bound
// for a hung process or a silent network).
//
// Every method has a deadline: blocking ones take a timeout, the others use
// options.rpc_timeout. Errors carry the op, the key or barrier id, this task
// and the service address. Once the service is lost (no heartbeat answered
// for its heartbeat timeout: its host stopped or hung, or the network to it
// is down; or the watcher lost it for service_loss_grace) every call in
// flight ends at once with Unavailable and so does every later call: no
// call outlives the heartbeat timeout on a frozen service.
//
// Thread-safety: all methods are thread-safe; several threads may block in
// Get/Barrier at once.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_CLIENT_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace grpc {
class ClientContext;
}

namespace tpudist::tpu_runtime::coordination {

struct ClientOptions {
  // How long Connect() keeps trying to reach the service.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Deadline of each non-blocking RPC (Set, Add, Register, ...).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // 0: a third of the heartbeat timeout the service announces.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // 0: a random incarnation is drawn.
  uint64_t incarnation = 0;
  // The job's world size as this task sees it, checked by Register() against
  // the service's; a mismatch fails the job naming both. 0: not checked.
  int num_tasks = 0;
  // The job's slice count as this task sees it (RankInfo::num_slices),
  // checked by Register() against the service's; a mismatch fails the job
  // naming both. 0: not checked.
  int num_slices = 0;
  // Keep a PollForError outstanding from a watcher thread (after Register):
  // the job error arrives at once instead of with the next heartbeat, and
  // the service sees this process die (its connection closes) at once.
  bool watch_errors = true;
  // How long the watcher retries a lost service before recording the loss
  // (Unavailable) as this task's error.
  absl::Duration service_loss_grace = absl::Seconds(1);
  // Called once, from the heartbeat thread, with the first error the service
  // propagated (or Unavailable when the service became unreachable), from
  // the heartbeat or the watcher thread, or from the thread calling
  // ReportError(). Must not call back into this client's Shutdown() or
  // destructor, and should return quickly.
  std::function<void(const absl::Status&)> error_callback;
  // Bytes of the job secret (tpu_runtime/job_secret.h): every call then
  // carries this task's credential (coordination_auth.h). Must match the
  // service's; empty: no credential.
  std::string job_secret;
  // TLS: PEM file of the CA certificate(s) the service's certificate must
  // chain to (for a self-signed service certificate, that certificate).
  // Empty: plaintext.
  std::string tls_ca_path;
  // The name the service's certificate is checked against, when it is not
  // the host in the address (e.g. dialing an IP, certificate for a name).
  std::string tls_server_name;
};

class CoordinationClient {
 public:
  // Creates a channel to `address` ("host:port") and waits until it is
  // connected, for at most options.connect_timeout (DeadlineExceeded then,
  // naming the address). Does not register.
  // REQUIRES: !job_id.empty(), task_id >= 0.
  static absl::StatusOr<std::unique_ptr<CoordinationClient>> Connect(
      absl::string_view address, absl::string_view job_id, int task_id,
      ClientOptions options = {});

  // Stops the heartbeat thread and, if registered and not shut down, tells
  // the service this task leaves (best effort, short deadline).
  ~CoordinationClient();
  CoordinationClient(const CoordinationClient&) = delete;
  CoordinationClient& operator=(const CoordinationClient&) = delete;

  // Connects this task to the service and starts heartbeats. Idempotent.
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);

  // Key-value store (c10d semantics; see coordination.proto).
  absl::Status Set(absl::string_view key, absl::string_view value,
                   bool allow_overwrite = true);
  // Blocks until `key` is set: DeadlineExceeded after `timeout`.
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout);
  // NotFound when absent.
  absl::StatusOr<std::string> TryGet(absl::string_view key);
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  absl::StatusOr<bool> Delete(absl::string_view key);
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired);
  absl::StatusOr<int64_t> NumKeys(absl::string_view prefix = "");
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys);

  // Waits until every task in `tasks` (all when empty) called Barrier with
  // the same id. DeadlineExceeded naming the missing tasks.
  absl::Status Barrier(absl::string_view barrier_id, absl::Duration timeout,
                       absl::Span<const int> tasks = {});

  // Fails the job with `error` (shared fate). REQUIRES: !error.ok(). The
  // job error after the call (ours, or an earlier one) is recorded: see
  // job_error_task().
  absl::Status ReportError(const absl::Status& error);
  // Long poll: the job error (also recorded, see health()), or OkStatus()
  // when none arrived within `timeout`. Transport failures come back as
  // errors too (not recorded).
  absl::Status PollForError(absl::Duration timeout);

  // OkStatus() while neither the service reported a job error nor contact
  // was lost. Cheap; does not call the service.
  absl::Status health() const ABSL_LOCKS_EXCLUDED(mu_);
  // The task the service blamed for the job error health() holds; -1 when
  // healthy or when contact was lost (no verdict from the service).
  int job_error_task() const ABSL_LOCKS_EXCLUDED(mu_);

  // Stops heartbeats and tells the service this task leaves. Idempotent.
  absl::Status Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  int task_id() const { return task_id_; }
  const std::string& job_id() const { return job_id_; }
  const std::string& address() const { return address_; }
  uint64_t incarnation() const { return incarnation_; }

 private:
  CoordinationClient(std::string address, std::string job_id, int task_id,
                     ClientOptions options);
  void HeartbeatLoop(absl::Duration interval, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Records the first error (source_task: the service's verdict, -1 none),
  // runs `then` (if set, even when an error was recorded before) and calls
  // the error callback once.
  void RecordError(const absl::Status& error, int source_task = -1,
                   const std::function<void()>& then = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // The service is gone or frozen: every call in flight ends now and every
  // later one fails at once with `error`, which is also recorded.
  void ServiceLost(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ShutdownWithTimeout(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  std::string Where(absl::string_view op) const;

  const std::string address_;
  const std::string job_id_;
  const int task_id_;
  const ClientOptions options_;
  const uint64_t incarnation_;
  struct Rpc;  // gRPC channel + stub, kept out of this header
  std::unique_ptr<Rpc> rpc_;

  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_heartbeat_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  int job_error_task_ ABSL_GUARDED_BY(mu_) = -1;
  bool callback_called_ ABSL_GUARDED_BY(mu_) = false;
  // The watcher's call in flight, cancelled by Shutdown().
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread heartbeat_thread_;  // started by Register()
  std::thread watch_thread_;      // started by Register() if watch_errors
};

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_CLIENT_H_
