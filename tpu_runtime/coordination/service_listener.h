// ServiceListener: the coordination service's own TCP listener, for a
// plaintext service. It accepts connections itself and hands each one to the
// gRPC server (grpc::AddInsecureChannelFromFd), so that strangers connecting
// to the job's port cannot take the process's last file descriptors:
//
//   * a connection is accepted only while this process has fewer than
//     (RLIMIT_NOFILE soft limit - fd_reserve) descriptors open; one over that
//     budget is closed at once and logged (rate-limited) with the counts, so
//     the rest of the process (checkpoint files, collectives) keeps
//     `fd_reserve` descriptors whatever connects;
//   * the listener survives EMFILE/ENFILE (logged as "too many open files"),
//     where gRPC's own acceptor (libgrpc 1.51) stops accepting for good;
//   * the gRPC server's channel arguments still apply to every connection
//     (the idle-connection timeout closes strangers that send nothing).
//
// With TLS the gRPC server listens itself (it cannot take over a TLS
// connection from a descriptor); only the channel arguments apply then.
//
// Thread-safety: Start() and Stop() from one thread; the accept thread is
// internal; PeerAddress() and refused() from any thread.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_SERVICE_LISTENER_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_SERVICE_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tpudist::tpu_runtime::coordination {

// Open file descriptors of this process (entries of /proc/self/fd); -1 when
// they cannot be counted.
int CountOpenFds();
// RLIMIT_NOFILE's soft limit; -1 when unlimited or unknown.
int64_t FdSoftLimit();
// The descriptors kept free of connections for `soft_limit`:
// max(64, soft_limit / 4). Pure.
int64_t DefaultFdReserve(int64_t soft_limit);

struct ListenerOptions {
  std::string job_id;        // for log lines
  std::string bind_address;  // numeric IPv4/IPv6 address or a host name
  int port = 0;              // 0: the OS picks one
  // Descriptors kept free; 0: DefaultFdReserve(FdSoftLimit()).
  int64_t fd_reserve = 0;
};

class ServiceListener {
 public:
  // Binds and listens (no SO_REUSEPORT: a second job cannot share the
  // port). Unavailable naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<ServiceListener>> Bind(
      const ListenerOptions& options);
  ~ServiceListener();  // Stop()
  ServiceListener(const ServiceListener&) = delete;
  ServiceListener& operator=(const ServiceListener&) = delete;

  int port() const { return port_; }
  // Starts the accept thread, handing connections to `server` (which must
  // outlive Stop()). REQUIRES: called once.
  void Start(grpc::Server* server);
  // Stops accepting and closes the listening socket. Idempotent.
  void Stop();

  // Connections closed at once because the descriptor budget was spent.
  int64_t refused() const { return refused_.load(); }
  // The caller's address ("ipv4:10.0.0.9:51234") for the gRPC peer string
  // of a connection this listener handed over (gRPC names those "fd:N");
  // `grpc_peer` itself for any other.
  std::string PeerAddress(const std::string& grpc_peer) const;

 private:
  ServiceListener(ListenerOptions options, int fd, int port);
  void AcceptLoop(grpc::Server* server);
  // One accepted connection: hand it over, or close it over the budget.
  void Admit(grpc::Server* server, int fd, const std::string& peer);
  void LogRefusal(const std::string& why);

  const ListenerOptions options_;
  int fd_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
  mutable absl::Mutex mu_;
  // The address of the connection last handed over on each descriptor.
  absl::flat_hash_map<int, std::string> peers_ ABSL_GUARDED_BY(mu_);
  absl::Time last_log_ = absl::InfinitePast();  // accept thread only
  int64_t logged_refused_ = 0;                  // accept thread only
  std::thread thread_;
};

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_SERVICE_LISTENER_H_
