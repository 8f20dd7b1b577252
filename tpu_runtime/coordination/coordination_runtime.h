// StartOrConnect: the one call an example binary makes to join the job's
// coordination. Rank 0 hosts the CoordinationService at
// master_addr:master_port (binding 127.0.0.1 when master_addr is loopback,
// else master_addr: the host's own slice address, never every interface);
// the job secret and TLS files come from the environment
// (WithSecurityFromEnv) unless `options` sets them; every rank, rank 0
// included, connects a client with
// task_id = rank and job_id = RankInfo::job_id, registers it (heartbeats
// start), optionally waits at a startup barrier of all ranks, and gets a
// CoordinationStore over that client for c10d process groups.
//
//   ASSIGN_OR_RETURN(auto coord, StartOrConnect(rank_info, RuntimeOptions{}));
//   auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
//       coord->store(), rank, world, gloo_options);
//
// Ownership: the returned CoordinationRuntime owns the service (rank 0), the
// client (shared with the store) and the store. Destroying it shuts the
// client down, then the service.
// Thread-safety: the accessors are; Shutdown() must not race with itself.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_RUNTIME_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_RUNTIME_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_service.h"
#include "tpu_runtime/coordination/coordination_store.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime::coordination {

struct RuntimeOptions {
  // For rank 0's service; bind_address, port, job_id and num_tasks are
  // filled from the RankInfo.
  ServiceOptions service;
  ClientOptions client;
  // Store timeout for get()/wait() (c10d's default).
  std::chrono::milliseconds store_timeout = c10d::Store::kDefaultTimeout;
  // Every rank waits here until all ranks registered; 0 skips the barrier.
  absl::Duration startup_barrier_timeout = absl::Minutes(5);
};

// `options` with its empty security fields filled from `env`:
//   TPU_DIST_JOB_SECRET / _FILE  -> service.job_secret and client.job_secret
//   TPU_DIST_TLS_CERT, _KEY      -> service.tls_cert_path / tls_key_path
//                                   (rank 0's service serves TLS)
//   TPU_DIST_TLS_CA              -> client.tls_ca_path; defaults to
//                                   TPU_DIST_TLS_CERT (a self-signed
//                                   certificate is its own CA)
//   TPU_DIST_TLS_SERVER_NAME     -> client.tls_server_name
// InvalidArgument (naming the variable) for an invalid secret. Pure.
absl::StatusOr<RuntimeOptions> WithSecurityFromEnv(RuntimeOptions options,
                                                   const EnvMap& env);

// `options` with service.registration_timeout from
// TPU_DIST_REGISTRATION_TIMEOUT when set: a duration ("90s", "5m") or a
// number of seconds, > 0. InvalidArgument naming the variable otherwise.
// Pure.
absl::StatusOr<RuntimeOptions> WithTimeoutsFromEnv(RuntimeOptions options,
                                                   const EnvMap& env);

// The exit code for an error StartOrConnect returned: kPeerFailureExitCode
// (tpu_runtime/exit_codes.h) when the job failed because of another rank
// (e.g. one never registered: the error names it), else 1.
int StartupFailureExitCode(const absl::Status& error);

// True for "localhost", "127.x.y.z", "::1".
bool IsLoopbackAddress(absl::string_view host);
// Where rank 0's service listens for `master_addr`: "127.0.0.1" for a
// loopback name, else master_addr itself.
std::string ServiceBindAddress(absl::string_view master_addr);
// "host:port", bracketing an IPv6 literal.
std::string JoinHostPort(absl::string_view host, int port);
// RankInfo::job_id, or "tpudist-<master_addr>:<port>" when it is empty.
std::string EffectiveJobId(const RankInfo& info);

class CoordinationRuntime {
 public:
  ~CoordinationRuntime();  // Shutdown()
  CoordinationRuntime(const CoordinationRuntime&) = delete;
  CoordinationRuntime& operator=(const CoordinationRuntime&) = delete;

  // Null except on rank 0.
  CoordinationService* service() const { return service_.get(); }
  const std::shared_ptr<CoordinationClient>& client() const { return client_; }
  const c10::intrusive_ptr<CoordinationStore>& store() const { return store_; }

  // For a rank about to exit with `error`: reports it to the job (when the
  // job has no error yet, this rank becomes the root cause and every other
  // rank learns it at once) and returns the exit code to use:
  // `own_exit_code` when the job error is this rank's own, else
  // kPeerFailureExitCode (tpu_runtime/exit_codes.h): another task failed
  // first, or the service's host (rank 0) is gone.
  int ReportFailure(const absl::Status& error, int own_exit_code = 1);

  // Client first (this task leaves cleanly), then the service (rank 0).
  // Idempotent. Rank 0 first waits, up to `drain`, for the other tasks to
  // leave, so that shutting the service down does not fail them.
  void Shutdown(absl::Duration drain = absl::Seconds(10));

 private:
  friend absl::StatusOr<std::unique_ptr<CoordinationRuntime>> StartOrConnect(
      const RankInfo& info, const RuntimeOptions& options);
  CoordinationRuntime() = default;

  std::unique_ptr<CoordinationService> service_;
  std::shared_ptr<CoordinationClient> client_;
  c10::intrusive_ptr<CoordinationStore> store_;
  bool shut_down_ = false;
};

absl::StatusOr<std::unique_ptr<CoordinationRuntime>> StartOrConnect(
    const RankInfo& info, const RuntimeOptions& options = {});

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_RUNTIME_H_
