// The coordination service's handshake, call credential and TLS: clients
// with a wrong or missing job secret are refused (UNAUTHENTICATED naming the
// job) without touching the job while the real tasks go on; a process
// squatting on the master port is refused by the clients and what it
// captures cannot be replayed against a later run of the job; TLS with a
// self-signed certificate generated here (openssl CLI, temp dir) works and a
// plaintext client or one trusting another CA cannot connect; the
// environment variables StartOrConnect reads.
#include "tpu_runtime/coordination/coordination_auth.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination.grpc.pb.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/coordination_service.h"
#include "tpu_runtime/coordination/grpc_status.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

namespace pb = ::tpudist::coordination;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kJob[] = "auth-test";
const std::string kSecret(32, 's');

std::unique_ptr<CoordinationService> StartService(const std::string& secret,
                                                  const std::string& cert = "",
                                                  const std::string& key = "") {
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = 2;
  options.job_secret = secret;
  options.tls_cert_path = cert;
  options.tls_key_path = key;
  auto service = CoordinationService::Start(options);
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? *std::move(service) : nullptr;
}

absl::StatusOr<std::unique_ptr<CoordinationClient>> Connect(
    const CoordinationService& service, int task, const std::string& secret,
    const std::string& ca = "") {
  ClientOptions options;
  options.connect_timeout = absl::Seconds(ca.empty() ? 10 : 2);
  options.job_secret = secret;
  options.tls_ca_path = ca;
  return CoordinationClient::Connect(service.address(), kJob, task, options);
}

// A session credential made by the handshake against `auth`.
absl::StatusOr<std::string> HandshakeWith(const CallAuthenticator& auth,
                                          int task,
                                          const std::string& secret = kSecret) {
  return ClientHandshake(secret, kJob, task, "127.0.0.1:1234",
                         [&](absl::string_view nonce) {
                           return auth.Offer(kJob, task, nonce);
                         });
}

TEST(CoordinationAuthTest, SessionCredentialIsValidOnlyWhereIssued) {
  const CallAuthenticator service(kSecret, kJob);
  auto c = HandshakeWith(service, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 3u + 16u + 1u + 64u);
  EXPECT_EQ(c->substr(0, 3), "v2.");
  EXPECT_EQ(c->find(kSecret), std::string::npos);
  EXPECT_EQ(service.Verify(*c, kJob, 1), "");
  // A second handshake opens another session; both stay valid.
  auto c2 = HandshakeWith(service, 1);
  ASSERT_TRUE(c2.ok());
  EXPECT_NE(*c, *c2);
  EXPECT_EQ(service.Verify(*c2, kJob, 1), "");
  EXPECT_EQ(service.Verify(*c, kJob, 1), "");
  // Not for another task, nor at another instance with the same job id and
  // secret (a restart, a later run).
  EXPECT_THAT(service.Verify(*c, kJob, 0),
              HasSubstr("did not issue to task 0"));
  const CallAuthenticator later(kSecret, kJob);
  EXPECT_THAT(later.Verify(*c, kJob, 1), HasSubstr("never opened"));
  ASSERT_TRUE(HandshakeWith(later, 1).ok());
  ASSERT_TRUE(HandshakeWith(later, 1).ok());
  EXPECT_THAT(later.Verify(*c, kJob, 1),
              HasSubstr("did not issue to task 1: replayed"));
  // Altered, malformed, missing, or the old static kind.
  std::string altered = *c;
  altered.back() = altered.back() == '0' ? '1' : '0';
  EXPECT_THAT(service.Verify(altered, kJob, 1), HasSubstr("did not issue"));
  EXPECT_THAT(service.Verify(c->substr(1), kJob, 1), HasSubstr("malformed"));
  EXPECT_THAT(service.Verify("", kJob, 1), HasSubstr("no job credential"));
  EXPECT_THAT(service.Verify("v1." + std::string(64, 'a'), kJob, 1),
              HasSubstr("static (v1) credential"));
  // Without a secret the service offers no session.
  EXPECT_EQ(CallAuthenticator("", kJob).Offer(kJob, 1, std::string(32, 'n'))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CoordinationAuthTest, ClientRefusesAServiceThatCannotProveTheSecret) {
  const auto refused = [](const absl::StatusOr<std::string>& c,
                          const std::string& reason) {
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated)
        << c.status();
    EXPECT_THAT(c.status().message(),
                AllOf(HasSubstr("task 1 of job 'auth-test': refusing the "
                                "coordination service at 127.0.0.1:1234"),
                      HasSubstr("listening on the master port"),
                      HasSubstr("TPU_DIST_JOB_SECRET"), HasSubstr(reason)));
  };
  // Another secret (rank 0's differs from ours).
  refused(HandshakeWith(CallAuthenticator(std::string(32, 'w'), kJob), 1),
          "proof does not match");
  // A squatter: made-up nonce and proof, or a real proof replayed from an
  // earlier handshake (made for another client nonce).
  const auto offer_once = [](const SessionOffer& offer) {
    return [offer](absl::string_view) -> absl::StatusOr<SessionOffer> {
      return offer;
    };
  };
  SessionOffer made_up{1, std::string(32, 'n'), std::string(32, 'p')};
  refused(ClientHandshake(kSecret, kJob, 1, "127.0.0.1:1234",
                          offer_once(made_up)),
          "proof does not match");
  const CallAuthenticator real(kSecret, kJob);
  auto earlier = real.Offer(kJob, 1, std::string(32, 'c'));
  ASSERT_TRUE(earlier.ok());
  refused(ClientHandshake(kSecret, kJob, 1, "127.0.0.1:1234",
                          offer_once(*earlier)),
          "proof does not match");
  made_up.proof = "short";
  refused(ClientHandshake(kSecret, kJob, 1, "127.0.0.1:1234",
                          offer_once(made_up)),
          "malformed");
  // A service without a secret, or something that does not speak Hello.
  refused(HandshakeWith(CallAuthenticator("", kJob), 1), "no job secret");
  const auto unimplemented =
      [](absl::string_view) -> absl::StatusOr<SessionOffer> {
    return absl::UnimplementedError("no Hello here");
  };
  refused(ClientHandshake(kSecret, kJob, 1, "127.0.0.1:1234", unimplemented),
          "UNIMPLEMENTED: no Hello here");
  // Transport trouble is reported as such.
  auto lost = ClientHandshake(
      kSecret, kJob, 1, "127.0.0.1:1234",
      [](absl::string_view) -> absl::StatusOr<SessionOffer> {
        return absl::UnavailableError("connection reset");
      });
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lost.status().message(),
              HasSubstr("Hello) with the coordination service at "
                        "127.0.0.1:1234 failed: connection reset"));
}

TEST(CoordinationAuthTest, WrongOrMissingSecretIsRefusedWhileTheJobGoesOn) {
  auto service = StartService(kSecret);
  ASSERT_NE(service, nullptr);
  auto good0 = Connect(*service, 0, kSecret);
  auto good1 = Connect(*service, 1, kSecret);
  ASSERT_TRUE(good0.ok() && good1.ok());
  ASSERT_TRUE((*good0)->Register().ok());
  ASSERT_TRUE((*good1)->Register().ok());
  ASSERT_TRUE((*good0)->Set("k", "v").ok());

  ::testing::internal::CaptureStderr();
  // A wrong secret, as task 1 (whose real client is registered): the service
  // cannot prove it holds that secret, so the client refuses it at Connect.
  auto wrong = Connect(*service, 1, std::string(32, 'w'));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated)
      << wrong.status();
  EXPECT_THAT(wrong.status().message(),
              AllOf(HasSubstr("task 1 of job 'auth-test'"),
                    HasSubstr(service->address()),
                    HasSubstr("TPU_DIST_JOB_SECRET")));
  // No secret at all: cannot set keys, fail the job or read.
  auto none = Connect(*service, 0, "");
  ASSERT_TRUE(none.ok());
  absl::Status s = (*none)->Set("evil", "2");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("carries no job credential"));
  s = (*none)->ReportError(absl::InternalError("stop the job"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ((*none)->TryGet("k").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*none)->Barrier("b", absl::Seconds(1)).code(),
            absl::StatusCode::kUnauthenticated);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(
      log,
      AllOf(HasSubstr("[coordination] coordination service of job 'auth-test': "
                      "refused Set from ipv4:127.0.0.1:"),
            HasSubstr("refused ReportError")));
  none->reset();

  // The job went on: no job error, no stray key, and both real tasks work.
  EXPECT_TRUE(service->state().JobError().ok()) << service->state().JobError();
  EXPECT_EQ((*good1)->TryGet("evil").status().code(),
            absl::StatusCode::kNotFound);
  auto v = (*good1)->Get("k", absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  absl::Status b1;
  std::thread t([&] { b1 = (*good1)->Barrier("after", absl::Seconds(10)); });
  EXPECT_TRUE((*good0)->Barrier("after", absl::Seconds(10)).ok());
  t.join();
  EXPECT_TRUE(b1.ok()) << b1;
  EXPECT_TRUE((*good0)->health().ok());
  EXPECT_TRUE((*good1)->health().ok());
}

// A stranger's listener on the master port: records the credential of each
// call it receives. Its Hello makes up an offer (it does not hold the secret)
// or, given `relay`, forwards the handshake to a real service: the worst
// case short of sniffing the real service's live connection.
class Squatter final : public pb::CoordinationService::Service {
 public:
  explicit Squatter(const std::string& relay = "") {
    if (!relay.empty()) {
      relay_ = pb::CoordinationService::NewStub(
          grpc::CreateChannel(relay, grpc::InsecureChannelCredentials()));
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~Squatter() override {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<std::string> captured() {
    absl::MutexLock lock(&mu_);
    return captured_;
  }

  grpc::Status Hello(grpc::ServerContext*, const pb::HelloRequest* req,
                     pb::HelloResponse* resp) override {
    if (relay_ != nullptr) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(5));
      return relay_->Hello(&context, *req, resp);
    }
    resp->set_session_id(1);
    resp->set_server_nonce(std::string(32, 'n'));
    resp->set_proof(std::string(32, 'p'));
    return grpc::Status::OK;
  }
  grpc::Status RegisterTask(grpc::ServerContext* context,
                            const pb::RegisterTaskRequest*,
                            pb::RegisterTaskResponse* resp) override {
    Capture(*context);
    resp->set_heartbeat_timeout_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const pb::HeartbeatRequest*,
                         pb::HeartbeatResponse*) override {
    Capture(*context);
    return grpc::Status::OK;
  }
  grpc::Status Set(grpc::ServerContext* context, const pb::SetRequest*,
                   pb::SetResponse*) override {
    Capture(*context);
    return grpc::Status::OK;
  }

 private:
  void Capture(const grpc::ServerContext& context) {
    auto it = context.client_metadata().find(kAuthMetadataKey);
    if (it == context.client_metadata().end()) return;
    absl::MutexLock lock(&mu_);
    captured_.emplace_back(it->second.data(), it->second.size());
  }

  std::unique_ptr<pb::CoordinationService::Stub> relay_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  std::vector<std::string> captured_ ABSL_GUARDED_BY(mu_);
};

// A real task's client (with the secret, as task 1) talking to `address`:
// registers and sets a key when Connect lets it.
absl::Status RealClientCalls(const std::string& address) {
  ClientOptions options;
  options.connect_timeout = absl::Seconds(10);
  options.job_secret = kSecret;
  options.watch_errors = false;
  auto client = CoordinationClient::Connect(address, kJob, 1, options);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->Register(); !s.ok()) return s;
  return (*client)->Set("checkpoint/step", "8");
}

// Replays `credential` (captured metadata) against the service at `address`
// as task 1: Set and ReportError, the calls that harmed the job.
std::vector<absl::Status> Replay(const std::string& address,
                                 const std::string& credential) {
  auto stub = pb::CoordinationService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  pb::TaskRef source;
  source.set_job_id(kJob);
  source.set_task_id(1);
  source.set_incarnation(7);
  std::vector<absl::Status> out;
  {
    grpc::ClientContext context;
    context.AddMetadata(kAuthMetadataKey, credential);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    pb::SetRequest req;
    pb::SetResponse resp;
    *req.mutable_source() = source;
    req.set_key("evil");
    req.set_value("1");
    req.set_allow_overwrite(true);
    out.push_back(FromGrpcStatus(stub->Set(&context, req, &resp)));
  }
  {
    grpc::ClientContext context;
    context.AddMetadata(kAuthMetadataKey, credential);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    pb::ReportErrorRequest req;
    pb::ReportErrorResponse resp;
    *req.mutable_source() = source;
    req.set_code(static_cast<int>(absl::StatusCode::kInternal));
    req.set_message("replayed: stop the job");
    out.push_back(FromGrpcStatus(stub->ReportError(&context, req, &resp)));
  }
  return out;
}

// Issue 39, item 3: a local user who binds the master port first must learn
// nothing that a later run of the job (same job id and secret, as multi-host
// and restarts keep) accepts.
TEST(CoordinationAuthTest, SquatterOnTheMasterPortLearnsNothingReplayable) {
  // 1. The squatter cannot prove the secret: the real client refuses it and
  // sends it no credential.
  Squatter squatter;
  absl::Status s = RealClientCalls(squatter.address());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(squatter.address()),
                    HasSubstr("cannot prove that it holds the job secret"),
                    HasSubstr("listening on the master port")));
  std::vector<std::string> captured = squatter.captured();
  EXPECT_THAT(captured, IsEmpty());

  // 2. Even a listener that got a client to accept it (relaying the
  // handshake of a real service of the job) captures only credentials of
  // that service instance.
  auto earlier = StartService(kSecret);
  ASSERT_NE(earlier, nullptr);
  {
    Squatter relay(earlier->address());
    EXPECT_TRUE(RealClientCalls(relay.address()).ok());
    const std::vector<std::string> relayed = relay.captured();
    EXPECT_THAT(relayed, Not(IsEmpty()));
    captured.insert(captured.end(), relayed.begin(), relayed.end());
  }
  earlier.reset();
  ASSERT_THAT(captured, Not(IsEmpty()));

  // 3. The later run of the job: its real clients work, every replay is
  // refused, and the job goes on (no key, no job error).
  auto service = StartService(kSecret);
  ASSERT_NE(service, nullptr);
  auto good0 = Connect(*service, 0, kSecret);
  auto good1 = Connect(*service, 1, kSecret);
  ASSERT_TRUE(good0.ok() && good1.ok());
  ASSERT_TRUE((*good0)->Register().ok());
  ASSERT_TRUE((*good1)->Register().ok());
  ::testing::internal::CaptureStderr();
  for (const std::string& credential : captured) {
    for (const absl::Status& r : Replay(service->address(), credential)) {
      EXPECT_EQ(r.code(), absl::StatusCode::kUnauthenticated)
          << r << " replaying " << credential;
      EXPECT_THAT(r.message(), HasSubstr("claiming task 1"));
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("refused ReportError from ipv4:127.0.0.1:"));
  EXPECT_TRUE(service->state().JobError().ok()) << service->state().JobError();
  EXPECT_EQ((*good0)->TryGet("evil").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE((*good1)->Set("k", "v").ok());
  auto v = (*good0)->Get("k", absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  EXPECT_TRUE((*good0)->health().ok());
  EXPECT_TRUE((*good1)->health().ok());
}

// A service without a secret cannot prove one: a client that has the secret
// refuses it (else a squatter would only have to claim it has none).
TEST(CoordinationAuthTest, ClientWithASecretRefusesAServiceWithout) {
  auto service = StartService("");
  ASSERT_NE(service, nullptr);
  auto client = Connect(*service, 0, kSecret);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(client.status().message(), HasSubstr("has no job secret"));
  // Without a secret on either side, nothing changes.
  auto plain = Connect(*service, 0, "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE((*plain)->Register().ok());
  EXPECT_TRUE((*plain)->Set("k", "v").ok());
}

// Not a pass/fail check: what the credential (two HMACs on the service's
// side, 84 bytes of metadata) adds to a Set round trip on loopback.
TEST(CoordinationAuthTest, CredentialCostPerCall) {
  constexpr int kCalls = 300;
  for (const std::string& secret :
       {std::string(), kSecret, std::string(), kSecret}) {
    auto service = StartService(secret);
    ASSERT_NE(service, nullptr);
    auto client = Connect(*service, 0, secret);
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Register().ok());
    const absl::Time start = absl::Now();
    for (int i = 0; i < kCalls; ++i) ASSERT_TRUE((*client)->Set("k", "v").ok());
    std::printf(
        "[auth cost] coordination Set round trip, %s: %.1f us mean of %d\n",
        secret.empty() ? "no secret" : "with credential",
        absl::ToDoubleMicroseconds((absl::Now() - start) / kCalls), kCalls);
  }
  const CallAuthenticator auth(kSecret, kJob);
  auto credential = HandshakeWith(auth, 0);
  ASSERT_TRUE(credential.ok());
  constexpr int kChecks = 10000;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kChecks; ++i) {
    ASSERT_EQ(auth.Verify(*credential, kJob, 0), "");
  }
  std::printf("[auth cost] the service's check of a session credential: %.2f "
              "us mean of %d\n",
              absl::ToDoubleMicroseconds((absl::Now() - start) / kChecks),
              kChecks);
}

// A self-signed certificate for 127.0.0.1 / localhost, made by the openssl
// CLI in a temporary directory removed by the destructor.
class TlsFiles {
 public:
  TlsFiles() {
    char tmpl[] = "/tmp/coord_tls_test.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    ok_ = Make("a") && Make("b");
  }
  ~TlsFiles() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool ok() const { return ok_; }
  std::string cert(const std::string& n) const {
    return dir_ + "/" + n + ".crt";
  }
  std::string key(const std::string& n) const {
    return dir_ + "/" + n + ".key";
  }

 private:
  bool Make(const std::string& n) {
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        "-nodes -days 1 "
        "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost "
        "-keyout ",
        key(n), " -out ", cert(n), " >/dev/null 2>&1");
    return std::system(cmd.c_str()) == 0;
  }
  std::string dir_;
  bool ok_ = false;
};

TEST(CoordinationAuthTest, TlsServiceServesTlsClientsOnly) {
  TlsFiles tls;
  if (!tls.ok()) GTEST_SKIP() << "openssl CLI could not make a certificate";
  auto service = StartService(kSecret, tls.cert("a"), tls.key("a"));
  ASSERT_NE(service, nullptr);
  auto client = Connect(*service, 0, kSecret, tls.cert("a"));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Register().ok());
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  auto v = (*client)->Get("k", absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  // TLS but without the secret: the channel is fine, the calls are not.
  auto no_secret = Connect(*service, 1, "", tls.cert("a"));
  ASSERT_TRUE(no_secret.ok()) << no_secret.status();
  EXPECT_EQ((*no_secret)->Register().code(),
            absl::StatusCode::kUnauthenticated);
  // Plaintext to a TLS service: never connects.
  ClientOptions quick;
  quick.connect_timeout = absl::Seconds(2);
  quick.job_secret = kSecret;
  auto plain_quick =
      CoordinationClient::Connect(service->address(), kJob, 1, quick);
  ASSERT_FALSE(plain_quick.ok());
  EXPECT_THAT(plain_quick.status().message(), HasSubstr("TPU_DIST_TLS_CA"));
  // Trusting another CA: the service's certificate is refused.
  auto other_ca = Connect(*service, 1, kSecret, tls.cert("b"));
  ASSERT_FALSE(other_ca.ok());
  EXPECT_THAT(other_ca.status().message(), HasSubstr("over TLS"));
  EXPECT_TRUE(service->state().JobError().ok());
  // A missing key file is an error naming it.
  ServiceOptions bad;
  bad.job_id = kJob;
  bad.tls_cert_path = tls.cert("a");
  bad.tls_key_path = "/nonexistent/key.pem";
  auto refused = CoordinationService::Start(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("/nonexistent/key.pem"));
}

TEST(CoordinationAuthTest, TlsClientCannotTalkToAPlaintextService) {
  TlsFiles tls;
  if (!tls.ok()) GTEST_SKIP() << "openssl CLI could not make a certificate";
  auto service = StartService(kSecret);
  ASSERT_NE(service, nullptr);
  auto client = Connect(*service, 0, kSecret, tls.cert("a"));
  EXPECT_FALSE(client.ok());
}

TEST(CoordinationAuthTest, SecurityOptionsFromTheEnvironment) {
  auto o =
      WithSecurityFromEnv({}, {{"TPU_DIST_JOB_SECRET", std::string(32, 'a')},
                               {"TPU_DIST_TLS_CERT", "/c.pem"},
                               {"TPU_DIST_TLS_KEY", "/k.pem"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->service.job_secret, std::string(16, '\xaa'));
  EXPECT_EQ(o->client.job_secret, o->service.job_secret);
  EXPECT_EQ(o->service.tls_cert_path, "/c.pem");
  EXPECT_EQ(o->service.tls_key_path, "/k.pem");
  EXPECT_EQ(o->client.tls_ca_path, "/c.pem");  // self-signed: its own CA
  RuntimeOptions given;
  given.client.tls_ca_path = "/given-ca.pem";
  given.service.job_secret = given.client.job_secret = "explicit secret!";
  o = WithSecurityFromEnv(given,
                          {{"TPU_DIST_TLS_CA", "/ca.pem"},
                           {"TPU_DIST_JOB_SECRET", std::string(32, 'a')}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->client.tls_ca_path, "/given-ca.pem");
  EXPECT_EQ(o->client.job_secret, "explicit secret!");
  o = WithSecurityFromEnv({}, {});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->client.job_secret.empty());
  EXPECT_TRUE(o->client.tls_ca_path.empty());
  o = WithSecurityFromEnv({}, {{"TPU_DIST_JOB_SECRET", "short"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(),
              HasSubstr("TPU_DIST_JOB_SECRET is 5 bytes"));
}

TEST(CoordinationAuthTest, StartOrConnectReadsTheSecretFromTheEnvironment) {
  setenv("TPU_DIST_JOB_SECRET", std::string(64, 'e').c_str(), 1);
  RankInfo info;
  info.rank = 0;
  info.world_size = 1;
  info.master_addr = "127.0.0.1";
  info.master_port = 0;
  info.job_id = "auth-env";
  auto runtime = StartOrConnect(info);
  unsetenv("TPU_DIST_JOB_SECRET");
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->service()->options().job_secret,
            std::string(32, '\xee'));
  ASSERT_TRUE((*runtime)->store() != nullptr);
  (*runtime)->store()->set("x", std::vector<uint8_t>{1});
  (*runtime)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
