// The coordination service's call credential and TLS: clients with a wrong
// or missing job secret are refused (UNAUTHENTICATED naming the job) without
// touching the job while the real tasks go on; TLS with a self-signed
// certificate generated here (openssl CLI, temp dir) works and a plaintext
// client or one trusting another CA cannot connect; the environment
// variables StartOrConnect reads.
#include "tpu_runtime/coordination/coordination_auth.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/coordination_service.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

TEST(CoordinationAuthTest, CredentialIsPerSecretJobAndTask) {
  const std::string c = TaskCredential(kSecret, kJob, 0);
  EXPECT_EQ(c.size(), 3u + 64u);
  EXPECT_EQ(c.substr(0, 3), "v1.");
  EXPECT_EQ(c, TaskCredential(kSecret, kJob, 0));
  EXPECT_NE(c, TaskCredential(kSecret, kJob, 1));
  EXPECT_NE(c, TaskCredential(kSecret, "other-job", 0));
  EXPECT_NE(c, TaskCredential(std::string(32, 't'), kJob, 0));
  EXPECT_EQ(c.find(kSecret), std::string::npos);
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
  // A wrong secret, as task 1 (whose real client is registered).
  auto wrong = Connect(*service, 1, std::string(32, 'w'));
  ASSERT_TRUE(wrong.ok());  // the channel connects; its calls do not pass
  absl::Status s = (*wrong)->Register();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("job 'auth-test'"),
                                 HasSubstr("refused RegisterTask"),
                                 HasSubstr("TPU_DIST_JOB_SECRET")));
  s = (*wrong)->Set("evil", "1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  // No secret at all: cannot set keys, fail the job or read.
  auto none = Connect(*service, 0, "");
  ASSERT_TRUE(none.ok());
  s = (*none)->Set("evil", "2");
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
                      "refused RegisterTask from ipv4:127.0.0.1:"),
            HasSubstr("refused ReportError")));
  none->reset();
  wrong->reset();

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

// Not a pass/fail check: what the credential (one HMAC on each side, 67
// bytes of metadata) adds to a Set round trip on loopback.
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
