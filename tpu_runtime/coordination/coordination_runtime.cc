#include "tpu_runtime/coordination/coordination_runtime.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/job_secret.h"
#include "tpu_runtime/exit_codes.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

// How long a failing rank waits for the job error before reporting its own.
constexpr absl::Duration kSettle = absl::Milliseconds(300);
// Drain of a failed job's service (see Shutdown).
constexpr absl::Duration kFailedJobDrain = absl::Seconds(1);
// Payload on a StartOrConnect error caused by another rank (its id).
constexpr absl::string_view kPeerFailurePayload =
    "type.tpu_dist/coordination.PeerFailure";

}  // namespace

absl::StatusOr<RuntimeOptions> WithSecurityFromEnv(RuntimeOptions options,
                                                   const EnvMap& env) {
  auto get = [&env](const char* name) -> std::string {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  if (options.service.job_secret.empty() || options.client.job_secret.empty()) {
    absl::StatusOr<std::string> secret = JobSecretFromEnv(env);
    if (!secret.ok()) return secret.status();
    if (options.service.job_secret.empty())
      options.service.job_secret = *secret;
    if (options.client.job_secret.empty()) options.client.job_secret = *secret;
  }
  const std::string cert = get("TPU_DIST_TLS_CERT");
  if (options.service.tls_cert_path.empty())
    options.service.tls_cert_path = cert;
  if (options.service.tls_key_path.empty()) {
    options.service.tls_key_path = get("TPU_DIST_TLS_KEY");
  }
  if (options.client.tls_ca_path.empty()) {
    const std::string ca = get("TPU_DIST_TLS_CA");
    options.client.tls_ca_path = ca.empty() ? cert : ca;
  }
  if (options.client.tls_server_name.empty()) {
    options.client.tls_server_name = get("TPU_DIST_TLS_SERVER_NAME");
  }
  return options;
}

absl::StatusOr<RuntimeOptions> WithTimeoutsFromEnv(RuntimeOptions options,
                                                   const EnvMap& env) {
  constexpr char kVar[] = "TPU_DIST_REGISTRATION_TIMEOUT";
  auto it = env.find(kVar);
  if (it == env.end() || it->second.empty()) return options;
  const std::string& text = it->second;
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    d = absl::ZeroDuration();
  }
  if (!(d > absl::ZeroDuration()) || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s='%s': expected a positive, finite duration such as 60s, 5m or "
        "a number of seconds",
        kVar, text));
  }
  options.service.registration_timeout = d;
  return options;
}

int StartupFailureExitCode(const absl::Status& error) {
  return error.GetPayload(kPeerFailurePayload).has_value()
             ? kPeerFailureExitCode
             : 1;
}

bool IsLoopbackAddress(absl::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

std::string ServiceBindAddress(absl::string_view master_addr) {
  if (master_addr.empty() || IsLoopbackAddress(master_addr)) return "127.0.0.1";
  return std::string(master_addr);
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string EffectiveJobId(const RankInfo& info) {
  if (!info.job_id.empty()) return info.job_id;
  return absl::StrCat("tpudist-", info.master_addr, ":", info.master_port);
}

absl::StatusOr<std::unique_ptr<CoordinationRuntime>> StartOrConnect(
    const RankInfo& info, const RuntimeOptions& given) {
  const EnvMap env = EnvMapFromProcess();
  absl::StatusOr<RuntimeOptions> secured = WithSecurityFromEnv(given, env);
  if (secured.ok()) secured = WithTimeoutsFromEnv(*std::move(secured), env);
  if (!secured.ok()) return secured.status();
  const RuntimeOptions& options = *secured;
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StartOrConnect: rank %d not in [0, %d)", info.rank, info.world_size));
  }
  const std::string job_id = EffectiveJobId(info);
  std::unique_ptr<CoordinationRuntime> runtime(new CoordinationRuntime());
  if (info.rank == 0) {
    ServiceOptions service = options.service;
    service.bind_address = ServiceBindAddress(info.master_addr);
    service.port = info.master_port;
    service.job_id = job_id;
    service.num_tasks = info.world_size;
    service.num_slices = info.num_slices;
    auto started = CoordinationService::Start(service);
    if (!started.ok()) return started.status();
    runtime->service_ = *std::move(started);
  }
  // Loopback masters are reached through 127.0.0.1, whatever name was given.
  const std::string host =
      IsLoopbackAddress(info.master_addr) || info.master_addr.empty()
          ? "127.0.0.1"
          : info.master_addr;
  const int port = runtime->service_ != nullptr ? runtime->service_->port()
                                                : info.master_port;
  ClientOptions client_options = options.client;
  if (client_options.num_tasks == 0) client_options.num_tasks = info.world_size;
  if (client_options.num_slices == 0) client_options.num_slices = info.num_slices;
  auto client = CoordinationClient::Connect(JoinHostPort(host, port), job_id,
                                            info.rank, client_options);
  if (!client.ok()) return client.status();
  runtime->client_ = *std::move(client);
  if (absl::Status s = runtime->client_->Register(); !s.ok()) return s;
  if (options.startup_barrier_timeout > absl::ZeroDuration()) {
    absl::Status s = runtime->client_->Barrier("tpudist/startup",
                                               options.startup_barrier_timeout);
    if (!s.ok()) {
      // The job's verdict, when it has one: whom it blames.
      runtime->client_->PollForError(absl::Milliseconds(1)).IgnoreError();
      const int blamed = runtime->client_->job_error_task();
      if (blamed >= 0 && blamed != info.rank) {
        s.SetPayload(kPeerFailurePayload, absl::Cord(absl::StrCat(blamed)));
      }
      return s;
    }
  }
  runtime->store_ = c10::make_intrusive<CoordinationStore>(
      runtime->client_, options.store_timeout);
  return runtime;
}

CoordinationRuntime::~CoordinationRuntime() { Shutdown(); }

int CoordinationRuntime::ReportFailure(const absl::Status& error,
                                       int own_exit_code) {
  if (client_ == nullptr || error.ok()) return own_exit_code;
  const int me = client_->task_id();
  if (client_->health().ok()) {
    // A peer's death can reach us (a collective's liveness check) before the
    // service has failed that peer (its closed connection, within ~0.1 s):
    // give the job error a moment to arrive before claiming to be the cause.
    const absl::Status settled = client_->PollForError(kSettle);
    if (settled.ok() && !client_->ReportError(error).ok()) {
      // The service is unreachable: rank 0, its host, is gone.
      return me == 0 ? own_exit_code : kPeerFailureExitCode;
    }
  }
  const int blamed = client_->job_error_task();
  if (blamed == me) return own_exit_code;
  if (blamed >= 0) return kPeerFailureExitCode;
  // Contact lost without a verdict: the service's host (rank 0) failed.
  return me == 0 ? own_exit_code : kPeerFailureExitCode;
}

void CoordinationRuntime::Shutdown(absl::Duration drain) {
  if (shut_down_) return;
  shut_down_ = true;
  if (client_ != nullptr) client_->Shutdown().IgnoreError();
  if (service_ != nullptr) {
    // A failed job's tasks got the error from their watchers already and are
    // on their way out; a dead one may still count as connected until its
    // heartbeat deadline, which is not worth waiting for.
    if (!service_->state().JobError().ok()) drain = std::min(drain, kFailedJobDrain);
    service_->state().AwaitNoTaskConnected(absl::Now() + drain);
    service_->Shutdown();
  }
}

}  // namespace tpudist::tpu_runtime::coordination
