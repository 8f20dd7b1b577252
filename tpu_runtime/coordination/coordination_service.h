// CoordinationService: the gRPC server that hosts one job's
// CoordinationState (KV store, barriers, heartbeats, job error), in the
// manner of XLA's coordination service. Rank 0 starts it; every task talks
// to it through a CoordinationClient.
//
// A staleness checker thread wakes every `staleness_check_interval` (at most
// a quarter of the heartbeat timeout) and marks a connected task whose last
// heartbeat is older than `heartbeat_timeout` as failed, and, once
// `registration_timeout` has passed since Start(), every task that never
// registered; the first failure becomes the job error, which every blocking
// call of every task then returns and which PollForError and heartbeat
// responses carry.
//
// Blocking RPCs (Get, Barrier, PollForError) wait with a deadline: the
// smaller of the request's timeout and the RPC deadline, so no handler thread
// is pinned forever. Shutdown() (and the destructor) wakes every waiter with
// Cancelled, then stops the server.
//
// Thread-safety: all methods are thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_SERVICE_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tpu_runtime/coordination/coordination_state.h"
#include "tpu_runtime/coordination/service_listener.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tpudist::tpu_runtime::coordination {

struct ServiceOptions {
  // Address to listen on. Loopback unless a multi-host job needs more.
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: the OS picks a free port; see CoordinationService::port()
  std::string job_id;  // REQUIRED: non-empty
  int num_tasks = 1;   // REQUIRED: >= 1
  // The job's slice count; a task registering with another one fails the
  // job naming both (ClientOptions::num_slices). 0: not checked.
  int num_slices = 0;
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Every task must register within this long of Start(); then the job fails
  // naming the ranks that never did ("rank 1 never registered ..."), instead
  // of the startup barrier timing out much later. InfiniteDuration(): never.
  absl::Duration registration_timeout = absl::Seconds(60);
  // How often the staleness checker runs; clamped to heartbeat_timeout / 4.
  absl::Duration staleness_check_interval = absl::Seconds(1);
  // How long Shutdown() lets in-flight RPCs finish before cancelling them.
  absl::Duration shutdown_grace = absl::Seconds(1);
  // A connected task whose error watcher (an outstanding PollForError) is
  // cancelled early has lost its process or channel: fail the job at once
  // instead of after heartbeat_timeout.
  bool fail_task_on_disconnect = true;
  // Bytes of the job secret (tpu_runtime/job_secret.h). Non-empty: every
  // call must carry its task's credential (coordination_auth.h) or gets
  // UNAUTHENTICATED naming the job, without touching the job's state.
  // Empty: calls are not authenticated (a warning when bind_address is not
  // loopback).
  std::string job_secret;
  // TLS (both or neither): PEM files of the service's certificate chain and
  // private key. Clients then need ClientOptions::tls_ca_path.
  std::string tls_cert_path;
  std::string tls_key_path;

  // Connections (anyone who reaches the port can open them; no credential
  // is needed to connect). One that has not finished its HTTP/2 (and TLS)
  // handshake within `handshake_timeout` is closed, and so is one with no
  // call in flight for `idle_connection_timeout`: a registered task always
  // has one (its error watcher), so this closes strangers; a client whose
  // idle connection was closed reconnects on its next call.
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration idle_connection_timeout = absl::Seconds(30);
  // Plaintext: the service accepts connections itself and keeps this many
  // file descriptors of the process free of them (service_listener.h);
  // 0: a quarter of the soft `ulimit -n` (16..4096).
  int64_t fd_reserve = 0;
  // Calls in flight per connection (more wait in the client), and handler
  // threads of the whole service (0: 64 + 8 per task; over it a call fails
  // with RESOURCE_EXHAUSTED).
  int max_streams_per_connection = 64;
  int max_threads = 0;
};

class CoordinationService {
 public:
  // Binds, starts serving and starts the staleness checker.
  // InvalidArgument for bad options; Unavailable when the address cannot be
  // bound (e.g. port in use).
  static absl::StatusOr<std::unique_ptr<CoordinationService>> Start(
      const ServiceOptions& options);

  ~CoordinationService();  // calls Shutdown()
  CoordinationService(const CoordinationService&) = delete;
  CoordinationService& operator=(const CoordinationService&) = delete;

  // The bound port (the chosen one when options.port was 0).
  int port() const { return port_; }
  // "bind_address:port", usable by a client on the same host.
  std::string address() const;
  const ServiceOptions& options() const { return options_; }
  // The job's state; tests and rank 0's diagnostics read it directly.
  CoordinationState& state() { return *state_; }

  // Idempotent. Unblocks waiters (Cancelled), stops the server within
  // shutdown_grace, joins the staleness checker.
  void Shutdown();

 private:
  class Impl;  // the gRPC service implementation
  // Warns on stderr when this process's open descriptors near `ulimit -n`.
  void CheckFdUsage(absl::Time now);
  CoordinationService(const ServiceOptions& options);
  void StalenessLoop();

  const ServiceOptions options_;
  std::unique_ptr<CoordinationState> state_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ServiceListener> listener_;  // plaintext only
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Time last_fd_warning_ = absl::InfinitePast();  // staleness thread
  std::thread staleness_thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_SERVICE_H_
