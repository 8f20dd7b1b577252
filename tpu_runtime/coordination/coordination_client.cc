#include "tpu_runtime/coordination/coordination_client.h"

#include <pthread.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "tpu_runtime/coordination/coordination.grpc.pb.h"
#include "tpu_runtime/coordination/coordination_auth.h"
#include "tpu_runtime/coordination/grpc_status.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

namespace pb = ::tpudist::coordination;
using Stub = pb::CoordinationService::Stub;

// Extra RPC deadline on top of a blocking call's own timeout, so that the
// service's reply (which names the key / missing tasks) arrives first.
constexpr absl::Duration kBlockingSlack = absl::Seconds(2);
// The watcher's long poll, and the extra RPC deadline on top of it: large,
// so that a slow reply is never mistaken for a disconnect by the service.
constexpr absl::Duration kWatchPoll = absl::Seconds(10);
constexpr absl::Duration kWatchSlack = absl::Seconds(20);

uint64_t RandomIncarnation() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;  // never 0
}

}  // namespace

struct CoordinationClient::Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Stub> stub;
  pb::TaskRef source;
  std::string credential;  // "" without a job secret

  // Runs one unary RPC with a deadline `timeout` from now. Once the service
  // is lost (MarkLost), fails at once with that error instead.
  template <typename Req, typename Resp>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                 const Req&, Resp*),
                    Req& req, Resp* resp, absl::Duration timeout,
                    const std::string& where) {
    *req.mutable_source() = source;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!credential.empty()) context.AddMetadata(kAuthMetadataKey, credential);
    if (absl::Status lost = Begin(&context, where); !lost.ok()) return lost;
    const grpc::Status g = ((*stub).*method)(&context, req, resp);
    return End(&context, g, where);
  }

  // The handshake's RPC (coordination_auth.h): sends no credential.
  absl::StatusOr<SessionOffer> Hello(absl::string_view client_nonce,
                                     absl::Duration timeout) {
    pb::HelloRequest req;
    pb::HelloResponse resp;
    *req.mutable_source() = source;
    req.set_client_nonce(std::string(client_nonce));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    context.set_wait_for_ready(true);  // the channel just connected
    absl::Status s = FromGrpcStatus(stub->Hello(&context, req, &resp));
    if (!s.ok()) return s;
    return SessionOffer{resp.session_id(), resp.server_nonce(), resp.proof()};
  }

  // Registers a call about to start: the lost-service error (naming `where`)
  // when the service is lost already, else OK.
  absl::Status Begin(grpc::ClientContext* context, const std::string& where) {
    absl::MutexLock lock(&mu);
    if (!lost.ok()) return LostLocked(where);
    in_flight.push_back(context);
    return absl::OkStatus();
  }
  // Unregisters a finished call; a call cut short by MarkLost returns the
  // lost-service error rather than a bare CANCELLED.
  absl::Status End(grpc::ClientContext* context, const grpc::Status& g,
                   const std::string& where) {
    absl::MutexLock lock(&mu);
    in_flight.erase(std::find(in_flight.begin(), in_flight.end(), context));
    if (!g.ok() && !lost.ok()) return LostLocked(where);
    return FromGrpcStatus(g, where);
  }
  // The service is gone or frozen: cancels every call in flight and fails
  // every later one with `error`. The first error is kept.
  void MarkLost(const absl::Status& error) {
    absl::MutexLock lock(&mu);
    if (!lost.ok()) return;
    lost = error;
    for (grpc::ClientContext* context : in_flight) context->TryCancel();
  }
  bool IsLost() {
    absl::MutexLock lock(&mu);
    return !lost.ok();
  }
  absl::Status LostLocked(const std::string& where)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return absl::UnavailableError(absl::StrCat(where, ": ", lost.message()));
  }

  absl::Mutex mu;
  std::vector<grpc::ClientContext*> in_flight ABSL_GUARDED_BY(mu);
  absl::Status lost ABSL_GUARDED_BY(mu);
};

CoordinationClient::CoordinationClient(std::string address, std::string job_id,
                                       int task_id, ClientOptions options)
    : address_(std::move(address)),
      job_id_(std::move(job_id)),
      task_id_(task_id),
      options_(std::move(options)),
      incarnation_(options_.incarnation != 0 ? options_.incarnation
                                             : RandomIncarnation()),
      rpc_(std::make_unique<Rpc>()) {}

absl::StatusOr<std::unique_ptr<CoordinationClient>> CoordinationClient::Connect(
    absl::string_view address, absl::string_view job_id, int task_id,
    ClientOptions options) {
  if (job_id.empty() || task_id < 0 || address.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CoordinationClient::Connect: bad arguments (address '%s', job '%s', "
        "task %d)",
        address, job_id, task_id));
  }
  std::unique_ptr<CoordinationClient> client(new CoordinationClient(
      std::string(address), std::string(job_id), task_id, std::move(options)));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY,
              0);  // loopback must not go via a proxy
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  Rpc& rpc = *client->rpc_;
  auto credentials = MakeChannelCredentials(
      client->options_.tls_ca_path, client->options_.tls_server_name, &args);
  if (!credentials.ok()) {
    return absl::Status(
        credentials.status().code(),
        absl::StrFormat("task %d of job '%s': %s", task_id, job_id,
                        credentials.status().message()));
  }
  rpc.channel = grpc::CreateCustomChannel(client->address_, *credentials, args);
  rpc.stub = pb::CoordinationService::NewStub(rpc.channel);
  rpc.source.set_job_id(client->job_id_);
  rpc.source.set_task_id(task_id);
  rpc.source.set_incarnation(client->incarnation_);
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + client->options_.connect_timeout;
  if (!rpc.channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "task %d of job '%s': coordination service at %s unreachable after "
        "%s%s",
        task_id, job_id, address, absl::FormatDuration(absl::Now() - start),
        client->options_.tls_ca_path.empty()
            ? " (if it serves TLS, clients need its CA: TPU_DIST_TLS_CA)"
            : " (over TLS: is the service serving TLS with a certificate "
              "from that CA, for that name?)"));
  }
  if (!client->options_.job_secret.empty()) {
    // The service proves it holds the secret before it gets a credential.
    auto credential = ClientHandshake(
        client->options_.job_secret, client->job_id_, task_id,
        client->address_, [&](absl::string_view nonce) {
          return rpc.Hello(nonce, client->options_.rpc_timeout);
        });
    if (!credential.ok()) return credential.status();
    rpc.credential = *std::move(credential);
  }
  return client;
}

CoordinationClient::~CoordinationClient() {
  ShutdownWithTimeout(absl::Seconds(1)).IgnoreError();
}

std::string CoordinationClient::Where(absl::string_view op) const {
  return absl::StrFormat("%s by task %d of job '%s' at %s", op, task_id_,
                         job_id_, address_);
}

absl::Status CoordinationClient::Register() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return absl::FailedPreconditionError(Where("Register after Shutdown"));
    }
    if (registered_) return absl::OkStatus();
  }
  pb::RegisterTaskRequest req;
  pb::RegisterTaskResponse resp;
  req.set_num_tasks(options_.num_tasks);
  req.set_num_slices(options_.num_slices);
  absl::Status s = rpc_->Call(&Stub::RegisterTask, req, &resp,
                              options_.rpc_timeout, Where("RegisterTask"));
  if (!s.ok()) return s;
  const absl::Duration timeout =
      absl::Milliseconds(std::max<int64_t>(1, resp.heartbeat_timeout_ms()));
  const absl::Duration interval =
      options_.heartbeat_interval > absl::ZeroDuration()
          ? options_.heartbeat_interval
          : std::max(absl::Milliseconds(10), timeout / 3);
  absl::MutexLock lock(&mu_);
  if (registered_ || shut_down_) return absl::OkStatus();
  registered_ = true;
  heartbeat_thread_ = std::thread([this, interval, timeout] {
    pthread_setname_np(pthread_self(), "tpud-heartbeat");
    HeartbeatLoop(interval, timeout);
  });
  if (options_.watch_errors) {
    watch_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "tpud-coord-watch");
      WatchLoop();
    });
  }
  return absl::OkStatus();
}

void CoordinationClient::WatchLoop() {
  absl::Time lost_since = absl::InfiniteFuture();
  for (;;) {
    pb::PollForErrorRequest req;
    pb::PollForErrorResponse resp;
    *req.mutable_source() = rpc_->source;
    req.set_timeout_ms(ToMillis(kWatchPoll));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWatchPoll +
                                            kWatchSlack));
    if (!rpc_->credential.empty()) {
      context.AddMetadata(kAuthMetadataKey, rpc_->credential);
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_heartbeat_) return;
      watch_context_ = &context;
    }
    // The service was declared lost (heartbeat thread): nothing to watch.
    if (!rpc_->Begin(&context, "PollForError").ok()) {
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
      return;
    }
    const grpc::Status g = rpc_->stub->PollForError(&context, req, &resp);
    const bool lost = !rpc_->End(&context, g, "PollForError").ok() &&
                      rpc_->IsLost();
    {
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
      if (stop_heartbeat_ || lost) return;
    }
    const absl::Time now = absl::Now();
    if (g.ok()) {
      lost_since = absl::InfiniteFuture();
      if (resp.error().code() == 0) continue;
      RecordError(absl::Status(static_cast<absl::StatusCode>(resp.error().code()),
                               resp.error().message()),
                  resp.error().source_task());
      return;  // the job error is final
    }
    // The service is gone (its process died or is shutting down) or did not
    // answer; retry for a moment before calling it lost.
    if (lost_since == absl::InfiniteFuture()) lost_since = now;
    if (now - lost_since >= options_.service_loss_grace) {
      ServiceLost(absl::UnavailableError(absl::StrFormat(
          "%s: lost the coordination service (hosted by task 0) for %s: %s",
          Where("PollForError"), absl::FormatDuration(now - lost_since),
          FromGrpcStatus(g, "PollForError").message())));
      return;
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_heartbeat_),
                         absl::Milliseconds(100));
    if (stop_heartbeat_) return;
  }
}

void CoordinationClient::HeartbeatLoop(absl::Duration interval,
                                       absl::Duration timeout) {
  absl::Time last_contact = absl::Now();
  absl::MutexLock lock(&mu_);
  while (!stop_heartbeat_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_heartbeat_), interval);
    if (stop_heartbeat_) break;
    mu_.Unlock();
    pb::HeartbeatRequest req;
    pb::HeartbeatResponse resp;
    // The RPC may take until `timeout` after the last contact, no longer: a
    // frozen service (its host stopped, its network silent) is declared
    // lost at that moment, and every call in flight ends with it.
    const absl::Duration budget =
        std::max(absl::Milliseconds(10), last_contact + timeout - absl::Now());
    const absl::Status s = rpc_->Call(&Stub::Heartbeat, req, &resp, budget,
                                      Where("Heartbeat"));
    const absl::Time now = absl::Now();
    if (s.ok()) {
      last_contact = now;
      if (resp.error().code() != 0) {
        RecordError(
            absl::Status(static_cast<absl::StatusCode>(resp.error().code()),
                         resp.error().message()),
            resp.error().source_task());
      }
    } else if (now - last_contact >= timeout && !rpc_->IsLost()) {
      ServiceLost(absl::UnavailableError(absl::StrFormat(
          "%s: no contact with the coordination service (hosted by task 0) "
          "for %s (heartbeat timeout %s): its process is stopped or hung, or "
          "the network to it is down; last error: %s",
          Where("Heartbeat"), absl::FormatDuration(now - last_contact),
          absl::FormatDuration(timeout), s.message())));
    }
    mu_.Lock();
  }
}

void CoordinationClient::ServiceLost(const absl::Status& error) {
  // Recorded before the calls in flight end, so that their callers see it
  // in health(); the callback (which may take a while) after.
  RecordError(error, /*source_task=*/-1, [this, &error] {
    rpc_->MarkLost(error);
  });
}

void CoordinationClient::RecordError(const absl::Status& error,
                                     int source_task,
                                     const std::function<void()>& then) {
  bool call = false;
  {
    absl::MutexLock lock(&mu_);
    if (health_.ok()) {
      health_ = error;
      job_error_task_ = source_task;
      if (options_.error_callback && !callback_called_) {
        callback_called_ = true;
        call = true;
      }
    }
  }
  if (then) then();
  if (call) options_.error_callback(error);
}

absl::Status CoordinationClient::health() const {
  absl::MutexLock lock(&mu_);
  return health_;
}

int CoordinationClient::job_error_task() const {
  absl::MutexLock lock(&mu_);
  return job_error_task_;
}

absl::Status CoordinationClient::Shutdown() {
  return ShutdownWithTimeout(options_.rpc_timeout);
}

absl::Status CoordinationClient::ShutdownWithTimeout(absl::Duration timeout) {
  bool was_registered = false;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
    if ((heartbeat_thread_.joinable() &&
         heartbeat_thread_.get_id() == std::this_thread::get_id()) ||
        (watch_thread_.joinable() &&
         watch_thread_.get_id() == std::this_thread::get_id())) {
      return absl::FailedPreconditionError(
          Where("Shutdown from the error callback"));
    }
    shut_down_ = true;
    stop_heartbeat_ = true;
    was_registered = registered_;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  absl::Status left = absl::OkStatus();
  if (was_registered) {
    // Leave first, then cancel the watcher: a cancelled watcher of a task
    // still connected would read as this process dying.
    pb::ShutdownTaskRequest req;
    pb::ShutdownTaskResponse resp;
    left = rpc_->Call(&Stub::ShutdownTask, req, &resp, timeout,
                      Where("ShutdownTask"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (watch_thread_.joinable()) watch_thread_.join();
  return left;
}

// ---- key-value store, barrier, errors --------------------------------------

absl::Status CoordinationClient::Set(absl::string_view key,
                                     absl::string_view value,
                                     bool allow_overwrite) {
  pb::SetRequest req;
  pb::SetResponse resp;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_allow_overwrite(allow_overwrite);
  return rpc_->Call(&Stub::Set, req, &resp, options_.rpc_timeout,
                    Where(absl::StrCat("Set('", key, "')")));
}

absl::StatusOr<std::string> CoordinationClient::Get(absl::string_view key,
                                                    absl::Duration timeout) {
  pb::GetRequest req;
  pb::GetResponse resp;
  req.set_key(std::string(key));
  req.set_timeout_ms(std::max<int64_t>(1, ToMillis(timeout)));
  absl::Status s = rpc_->Call(&Stub::Get, req, &resp, timeout + kBlockingSlack,
                              Where(absl::StrCat("Get('", key, "')")));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_value());
}

absl::StatusOr<std::string> CoordinationClient::TryGet(absl::string_view key) {
  pb::TryGetRequest req;
  pb::TryGetResponse resp;
  req.set_key(std::string(key));
  absl::Status s = rpc_->Call(&Stub::TryGet, req, &resp, options_.rpc_timeout,
                              Where(absl::StrCat("TryGet('", key, "')")));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_value());
}

absl::StatusOr<int64_t> CoordinationClient::Add(absl::string_view key,
                                                int64_t delta) {
  pb::AddRequest req;
  pb::AddResponse resp;
  req.set_key(std::string(key));
  req.set_delta(delta);
  absl::Status s = rpc_->Call(&Stub::Add, req, &resp, options_.rpc_timeout,
                              Where(absl::StrCat("Add('", key, "')")));
  if (!s.ok()) return s;
  return resp.value();
}

absl::StatusOr<bool> CoordinationClient::Delete(absl::string_view key) {
  pb::DeleteRequest req;
  pb::DeleteResponse resp;
  req.set_key(std::string(key));
  absl::Status s = rpc_->Call(&Stub::Delete, req, &resp, options_.rpc_timeout,
                              Where(absl::StrCat("Delete('", key, "')")));
  if (!s.ok()) return s;
  return resp.deleted();
}

absl::StatusOr<std::string> CoordinationClient::CompareSet(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired) {
  pb::CompareSetRequest req;
  pb::CompareSetResponse resp;
  req.set_key(std::string(key));
  req.set_expected(std::string(expected));
  req.set_desired(std::string(desired));
  absl::Status s =
      rpc_->Call(&Stub::CompareSet, req, &resp, options_.rpc_timeout,
                 Where(absl::StrCat("CompareSet('", key, "')")));
  if (!s.ok()) return s;
  return std::move(*resp.mutable_value());
}

absl::StatusOr<int64_t> CoordinationClient::NumKeys(absl::string_view prefix) {
  pb::NumKeysRequest req;
  pb::NumKeysResponse resp;
  req.set_prefix(std::string(prefix));
  absl::Status s = rpc_->Call(&Stub::NumKeys, req, &resp, options_.rpc_timeout,
                              Where("NumKeys"));
  if (!s.ok()) return s;
  return resp.num_keys();
}

absl::StatusOr<bool> CoordinationClient::Check(
    absl::Span<const std::string> keys) {
  pb::CheckRequest req;
  pb::CheckResponse resp;
  for (const std::string& key : keys) req.add_keys(key);
  absl::Status s = rpc_->Call(&Stub::Check, req, &resp, options_.rpc_timeout,
                              Where("Check"));
  if (!s.ok()) return s;
  return resp.all_present();
}

absl::Status CoordinationClient::Barrier(absl::string_view barrier_id,
                                         absl::Duration timeout,
                                         absl::Span<const int> tasks) {
  pb::BarrierRequest req;
  pb::BarrierResponse resp;
  req.set_barrier_id(std::string(barrier_id));
  req.set_timeout_ms(ToMillis(timeout));
  for (int t : tasks) req.add_tasks(t);
  return rpc_->Call(&Stub::Barrier, req, &resp, timeout + kBlockingSlack,
                    Where(absl::StrCat("Barrier('", barrier_id, "')")));
}

absl::Status CoordinationClient::ReportError(const absl::Status& error) {
  pb::ReportErrorRequest req;
  pb::ReportErrorResponse resp;
  req.set_code(static_cast<int>(error.code()));
  req.set_message(std::string(error.message()));
  absl::Status s = rpc_->Call(&Stub::ReportError, req, &resp,
                              options_.rpc_timeout, Where("ReportError"));
  if (s.ok() && resp.job_error().code() != 0) {
    RecordError(absl::Status(static_cast<absl::StatusCode>(resp.job_error().code()),
                             resp.job_error().message()),
                resp.job_error().source_task());
  }
  return s;
}

absl::Status CoordinationClient::PollForError(absl::Duration timeout) {
  pb::PollForErrorRequest req;
  pb::PollForErrorResponse resp;
  req.set_timeout_ms(std::max<int64_t>(1, ToMillis(timeout)));
  absl::Status s = rpc_->Call(&Stub::PollForError, req, &resp,
                              timeout + kBlockingSlack, Where("PollForError"));
  if (!s.ok()) return s;
  absl::Status error(static_cast<absl::StatusCode>(resp.error().code()),
                     resp.error().message());
  if (!error.ok()) RecordError(error, resp.error().source_task());
  return error;
}

}  // namespace tpudist::tpu_runtime::coordination
