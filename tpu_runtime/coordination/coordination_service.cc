#include "tpu_runtime/coordination/coordination_service.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "tpu_runtime/coordination/coordination.grpc.pb.h"
#include "tpu_runtime/coordination/coordination_auth.h"
#include "tpu_runtime/coordination/grpc_status.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

namespace pb = ::tpudist::coordination;

// Replies this much before the client's RPC deadline so that a blocking call
// returns our message (naming key / missing tasks) instead of a bare
// transport DEADLINE_EXCEEDED.
constexpr absl::Duration kReplyMargin = absl::Milliseconds(50);
// How often a waiting PollForError looks for its own cancellation.
constexpr absl::Duration kCancelCheck = absl::Milliseconds(100);
// A cancellation this long before the RPC deadline is a disconnect, not a
// deadline the client let run out.
constexpr absl::Duration kCancelMargin = absl::Seconds(1);

absl::Time WaitDeadline(const grpc::ServerContext* context,
                        int64_t timeout_ms) {
  const absl::Time rpc = FromGrpcDeadline(context->deadline()) - kReplyMargin;
  return std::min(absl::Now() + absl::Milliseconds(timeout_ms), rpc);
}

void FillError(const absl::Status& error, int source_task,
               pb::ErrorInfo* info) {
  info->set_code(static_cast<int>(error.code()));
  info->set_message(std::string(error.message()));
  info->set_source_task(error.ok() ? -1 : source_task);
}

}  // namespace

class CoordinationService::Impl final
    : public pb::CoordinationService::Service {
 public:
  Impl(CoordinationState* state, uint64_t incarnation, std::string job_secret,
       std::string job_id, bool fail_on_disconnect)
      : state_(state),
        incarnation_(incarnation),
        fail_on_disconnect_(fail_on_disconnect),
        auth_(std::move(job_secret), std::move(job_id)) {}

  // The handshake (coordination_auth.h): no credential yet, only the claims.
  grpc::Status Hello(grpc::ServerContext*, const pb::HelloRequest* req,
                     pb::HelloResponse* resp) override {
    const auto& src = req->source();
    if (auto s = state_->ValidateSender(src.job_id(), src.task_id()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    auto offer = auth_.Offer(src.job_id(), src.task_id(), req->client_nonce());
    if (!offer.ok()) return ToGrpcStatus(offer.status());
    resp->set_session_id(offer->session_id);
    resp->set_server_nonce(offer->server_nonce);
    resp->set_proof(offer->proof);
    return grpc::Status::OK;
  }

  grpc::Status RegisterTask(grpc::ServerContext* context,
                            const pb::RegisterTaskRequest* req,
                            pb::RegisterTaskResponse* resp) override {
    if (auto s = Validate(*context, "RegisterTask", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    const auto& src = req->source();
    if (auto s = state_->RegisterTask(src.task_id(), src.incarnation(),
                                      absl::Now(), req->num_tasks(),
                                      req->num_slices());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_service_incarnation(incarnation_);
    resp->set_heartbeat_timeout_ms(ToMillis(state_->heartbeat_timeout()));
    resp->set_num_tasks(state_->num_tasks());
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    if (auto s = Validate(*context, "Heartbeat", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    const auto& src = req->source();
    const absl::Status own =
        state_->Heartbeat(src.task_id(), src.incarnation(), absl::Now());
    const absl::Status job = state_->JobError();
    if (!job.ok()) {
      FillError(job, state_->JobErrorTask(), resp->mutable_error());
    } else if (!own.ok()) {
      FillError(own, src.task_id(), resp->mutable_error());
    }
    return grpc::Status::OK;
  }

  grpc::Status Set(grpc::ServerContext* context, const pb::SetRequest* req,
                   pb::SetResponse*) override {
    if (auto s = Validate(*context, "Set", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    return ToGrpcStatus(state_->Set(req->source().task_id(), req->key(),
                                    req->value(), req->allow_overwrite()));
  }

  grpc::Status Get(grpc::ServerContext* context, const pb::GetRequest* req,
                   pb::GetResponse* resp) override {
    if (auto s = Validate(*context, "Get", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (req->timeout_ms() <= 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("Get: timeout_ms <= 0"));
    }
    auto value = state_->Get(req->source().task_id(), req->key(),
                             WaitDeadline(context, req->timeout_ms()));
    if (!value.ok()) return ToGrpcStatus(value.status());
    resp->set_value(*std::move(value));
    return grpc::Status::OK;
  }

  grpc::Status TryGet(grpc::ServerContext* context,
                      const pb::TryGetRequest* req,
                      pb::TryGetResponse* resp) override {
    if (auto s = Validate(*context, "TryGet", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    auto value = state_->TryGet(req->key());
    if (!value.ok()) return ToGrpcStatus(value.status());
    resp->set_value(*std::move(value));
    return grpc::Status::OK;
  }

  grpc::Status Add(grpc::ServerContext* context, const pb::AddRequest* req,
                   pb::AddResponse* resp) override {
    if (auto s = Validate(*context, "Add", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    auto value = state_->Add(req->key(), req->delta());
    if (!value.ok()) return ToGrpcStatus(value.status());
    resp->set_value(*value);
    return grpc::Status::OK;
  }

  grpc::Status Delete(grpc::ServerContext* context,
                      const pb::DeleteRequest* req,
                      pb::DeleteResponse* resp) override {
    if (auto s = Validate(*context, "Delete", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_deleted(state_->Delete(req->key()));
    return grpc::Status::OK;
  }

  grpc::Status CompareSet(grpc::ServerContext* context,
                          const pb::CompareSetRequest* req,
                          pb::CompareSetResponse* resp) override {
    if (auto s = Validate(*context, "CompareSet", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_value(
        state_->CompareSet(req->key(), req->expected(), req->desired()));
    return grpc::Status::OK;
  }

  grpc::Status NumKeys(grpc::ServerContext* context,
                       const pb::NumKeysRequest* req,
                       pb::NumKeysResponse* resp) override {
    if (auto s = Validate(*context, "NumKeys", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_num_keys(state_->NumKeys(req->prefix()));
    return grpc::Status::OK;
  }

  grpc::Status Check(grpc::ServerContext* context, const pb::CheckRequest* req,
                     pb::CheckResponse* resp) override {
    if (auto s = Validate(*context, "Check", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    resp->set_all_present(state_->Check(keys));
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* context,
                       const pb::BarrierRequest* req,
                       pb::BarrierResponse*) override {
    if (auto s = Validate(*context, "Barrier", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    std::vector<int> tasks(req->tasks().begin(), req->tasks().end());
    const absl::Time now = absl::Now();
    return ToGrpcStatus(
        state_->Barrier(req->source().task_id(), req->barrier_id(), tasks,
                        absl::Milliseconds(req->timeout_ms()), now,
                        FromGrpcDeadline(context->deadline()) - kReplyMargin));
  }

  grpc::Status ReportError(grpc::ServerContext* context,
                           const pb::ReportErrorRequest* req,
                           pb::ReportErrorResponse* resp) override {
    if (auto s = Validate(*context, "ReportError", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (req->code() == 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("ReportError: code OK"));
    }
    state_->ReportError(req->source().task_id(),
                        absl::Status(static_cast<absl::StatusCode>(req->code()),
                                     req->message()));
    FillError(state_->JobError(), state_->JobErrorTask(),
              resp->mutable_job_error());
    return grpc::Status::OK;
  }

  grpc::Status PollForError(grpc::ServerContext* context,
                            const pb::PollForErrorRequest* req,
                            pb::PollForErrorResponse* resp) override {
    if (auto s = Validate(*context, "PollForError", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (req->timeout_ms() <= 0) {
      return ToGrpcStatus(
          absl::InvalidArgumentError("PollForError: timeout_ms <= 0"));
    }
    // Waits in slices so that a cancelled call (the client's process died:
    // the kernel closed its connection) is noticed within one slice.
    const absl::Time deadline = WaitDeadline(context, req->timeout_ms());
    const absl::Time rpc_deadline = FromGrpcDeadline(context->deadline());
    absl::Status error;
    for (;;) {
      const absl::Time now = absl::Now();
      error = state_->PollForError(std::min(deadline, now + kCancelCheck));
      if (!error.ok() || absl::Now() >= deadline) break;
      if (context->IsCancelled()) {
        // Well before its deadline: not a timeout, the client is gone.
        if (fail_on_disconnect_ && absl::Now() < rpc_deadline - kCancelMargin &&
            state_->TaskDisconnected(req->source().task_id(),
                                     req->source().incarnation())) {
          std::fprintf(stderr, "[coordination] %s\n",
                       std::string(state_->JobError().message()).c_str());
        }
        return grpc::Status::CANCELLED;
      }
    }
    if (absl::IsCancelled(error) && state_->JobError().ok()) {
      return ToGrpcStatus(error);  // service shutting down
    }
    FillError(error, state_->JobErrorTask(), resp->mutable_error());
    return grpc::Status::OK;
  }

  grpc::Status ShutdownTask(grpc::ServerContext* context,
                            const pb::ShutdownTaskRequest* req,
                            pb::ShutdownTaskResponse*) override {
    if (auto s = Validate(*context, "ShutdownTask", req->source()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    return ToGrpcStatus(state_->ShutdownTask(req->source().task_id()));
  }

  // Set once, before the server starts.
  void set_listener(const ServiceListener* listener) { listener_ = listener; }

 private:
  // The caller's address: gRPC names connections our listener handed over
  // by their descriptor ("fd:N").
  std::string Peer(const grpc::ServerContext& context) const {
    return listener_ != nullptr ? listener_->PeerAddress(context.peer())
                                : context.peer();
  }

  // Every handler starts here: the caller's credential (when the job has a
  // secret), then the job id and task id.
  absl::Status Validate(const grpc::ServerContext& context,
                        absl::string_view method,
                        const pb::TaskRef& source) const {
    if (absl::Status s =
            auth_.Check(context, method, source.job_id(), source.task_id(),
                        Peer(context));
        !s.ok()) {
      return s;
    }
    return state_->ValidateSender(source.job_id(), source.task_id());
  }

  CoordinationState* const state_;
  const uint64_t incarnation_;
  const bool fail_on_disconnect_;
  const CallAuthenticator auth_;
  const ServiceListener* listener_ = nullptr;  // null with TLS

};

CoordinationService::CoordinationService(const ServiceOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<CoordinationService>> CoordinationService::Start(
    const ServiceOptions& options) {
  if (options.job_id.empty()) {
    return absl::InvalidArgumentError("CoordinationService: empty job_id");
  }
  if (options.num_tasks < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CoordinationService: num_tasks %d < 1", options.num_tasks));
  }
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "CoordinationService: heartbeat_timeout must be positive");
  }
  if (options.handshake_timeout <= absl::ZeroDuration() ||
      options.idle_connection_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "CoordinationService: handshake_timeout and idle_connection_timeout "
        "must be positive");
  }
  if (options.registration_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "CoordinationService: registration_timeout must be positive");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CoordinationService: bad port %d", options.port));
  }
  std::unique_ptr<CoordinationService> service(
      new CoordinationService(options));
  service->state_ = std::make_unique<CoordinationState>(
      options.job_id, options.num_tasks, options.heartbeat_timeout,
      options.num_slices);
  std::random_device rd;
  const uint64_t incarnation = static_cast<uint64_t>(rd()) << 32 | rd();
  service->impl_ = std::make_unique<Impl>(service->state_.get(), incarnation,
                                          options.job_secret, options.job_id,
                                          options.fail_task_on_disconnect);
  auto credentials =
      MakeServerCredentials(options.tls_cert_path, options.tls_key_path);
  if (!credentials.ok()) {
    return absl::Status(
        credentials.status().code(),
        absl::StrFormat("CoordinationService for job '%s': %s", options.job_id,
                        credentials.status().message()));
  }

  const bool v6 = options.bind_address.find(':') != std::string::npos;
  const std::string listen =
      v6 ? absl::StrCat("[", options.bind_address, "]:", options.port)
         : absl::StrCat(options.bind_address, ":", options.port);
  auto millis = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(ToMillis(d), 1, INT_MAX));
  };
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second job could silently
  // share a fixed port with us.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Strangers' connections: bounded in time (handshake, idle), in calls per
  // connection and in handler threads.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             millis(options.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             millis(options.idle_connection_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             std::max(1, options.max_streams_per_connection));
  grpc::ResourceQuota quota(
      absl::StrCat("tpu_dist coordination of job ", options.job_id));
  quota.SetMaxThreads(options.max_threads > 0 ? options.max_threads
                                              : 64 + 8 * options.num_tasks);
  builder.SetResourceQuota(quota);
  const bool tls =
      !options.tls_cert_path.empty() || !options.tls_key_path.empty();
  if (tls) {
    builder.AddListeningPort(listen, *credentials, &service->port_);
  } else {
    // Plaintext: our own acceptor, which keeps descriptors in reserve and
    // survives EMFILE (service_listener.h).
    auto listener = ServiceListener::Bind({options.job_id,
                                           options.bind_address, options.port,
                                           options.fd_reserve});
    if (!listener.ok()) return listener.status();
    service->listener_ = *std::move(listener);
    service->port_ = service->listener_->port();
    service->impl_->set_listener(service->listener_.get());
  }
  builder.RegisterService(service->impl_.get());
  service->server_ = builder.BuildAndStart();
  if (service->server_ == nullptr || service->port_ == 0) {
    return absl::UnavailableError(
        absl::StrFormat("CoordinationService for job '%s': cannot listen on %s",
                        options.job_id, listen));
  }
  if (service->listener_ != nullptr) {
    service->listener_->Start(service->server_.get());
  }
  const bool loopback = options.bind_address == "::1" ||
                        absl::StartsWith(options.bind_address, "127.") ||
                        options.bind_address == "localhost";
  if (options.job_secret.empty() && !loopback) {
    std::fprintf(stderr,
                 "[coordination] job '%s': serving on %s without a job secret: "
                 "anyone who can "
                 "reach this port can set keys or fail the job; set "
                 "TPU_DIST_JOB_SECRET on "
                 "every rank (tpurun and tpu_dist-ray-run do)\n",
                 options.job_id.c_str(), listen.c_str());
  }
  service->staleness_thread_ = std::thread([raw = service.get()] {
    pthread_setname_np(pthread_self(), "tpud-coord-age");
    raw->StalenessLoop();
  });
  return service;
}

CoordinationService::~CoordinationService() { Shutdown(); }

std::string CoordinationService::address() const {
  if (options_.bind_address.find(':') != std::string::npos) {
    return absl::StrCat("[", options_.bind_address, "]:", port_);
  }
  return absl::StrCat(options_.bind_address, ":", port_);
}

void CoordinationService::StalenessLoop() {
  const absl::Duration interval = std::max(
      absl::Milliseconds(1),
      std::min({options_.staleness_check_interval,
                options_.heartbeat_timeout / 4,
                options_.registration_timeout / 4}));
  const absl::Time started = absl::Now();
  bool registration_checked = false;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval);
    if (stopping_) break;
    mu_.Unlock();
    const absl::Time now = absl::Now();
    for (int task : state_->CheckHeartbeats(now)) {
      std::fprintf(stderr, "[coordination] job '%s': task %d failed: %s\n",
                   options_.job_id.c_str(), task,
                   std::string(state_->JobError().message()).c_str());
    }
    CheckFdUsage(now);
    if (!registration_checked &&
        now - started >= options_.registration_timeout) {
      registration_checked = true;
      if (!state_->FailUnregistered(now - started).empty()) {
        std::fprintf(stderr, "[coordination] %s\n",
                     std::string(state_->JobError().message()).c_str());
      }
    }
    mu_.Lock();
  }
}

void CoordinationService::CheckFdUsage(absl::Time now) {
  constexpr absl::Duration kEvery = absl::Seconds(30);
  if (now - last_fd_warning_ < kEvery) return;
  const int64_t limit = FdSoftLimit();
  if (limit <= 0) return;
  const int open_fds = CountOpenFds();
  if (open_fds < 0 || open_fds * 10 < limit * 8) return;  // under 80%
  last_fd_warning_ = now;
  std::fprintf(
      stderr,
      "[coordination] job '%s': this process (rank 0, hosting the "
      "coordination service on port %d) has %d of %lld file descriptors open "
      "(ulimit -n): close to 'Too many open files' (EMFILE), when opening "
      "checkpoint files and sockets fails; the service refused %lld "
      "connection(s) so far. Raise ulimit -n, or see what holds them "
      "(ls -l /proc/%d/fd; ss -tnp)\n",
      options_.job_id.c_str(), port_, open_fds, static_cast<long long>(limit),
      static_cast<long long>(listener_ != nullptr ? listener_->refused() : 0),
      static_cast<int>(getpid()));
}

void CoordinationService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  if (state_ != nullptr) state_->Shutdown();  // wakes blocked handlers
  if (listener_ != nullptr) listener_->Stop();  // no new connections
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.shutdown_grace));
    server_->Wait();
  }
  if (staleness_thread_.joinable()) staleness_thread_.join();
}

}  // namespace tpudist::tpu_runtime::coordination
