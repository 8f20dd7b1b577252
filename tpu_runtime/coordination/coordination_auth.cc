#include "tpu_runtime/coordination/coordination_auth.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

constexpr absl::string_view kCredentialLabel = "tpu_dist/coordination/v1";
constexpr absl::string_view kCredentialPrefix = "v1.";
constexpr int kRefusalLogLines = 10;

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the TLS ", what,
                                                   " file ", path, ": ",
                                                   std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file ", path, " holds no PEM block"));
  }
  return text.str();
}

}  // namespace

std::string TaskCredential(absl::string_view secret, absl::string_view job_id,
                           int task_id) {
  const std::string task = absl::StrCat(task_id);
  return absl::StrCat(
      kCredentialPrefix,
      ToHex(HmacSha256(secret, {kCredentialLabel, job_id, task})));
}

CallAuthenticator::CallAuthenticator(std::string secret, std::string job_id,
                                     int num_tasks)
    : secret_(std::move(secret)), job_id_(std::move(job_id)) {
  if (secret_.empty()) return;
  for (int t = 0; t < num_tasks; ++t)
    credentials_.push_back(TaskCredential(secret_, job_id_, t));
}

absl::Status CallAuthenticator::Check(const grpc::ServerContext& context,
                                      absl::string_view method,
                                      absl::string_view job_id,
                                      int task_id,
                                      const std::string& peer) const {
  if (!enabled()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  std::string problem;
  if (it == metadata.end()) {
    problem = "carries no job credential";
  } else {
    const bool cached = job_id == job_id_ && task_id >= 0 &&
                        task_id < static_cast<int>(credentials_.size());
    const std::string expected = cached
                                     ? credentials_[task_id]
                                     : TaskCredential(secret_, job_id, task_id);
    const absl::string_view got(it->second.data(), it->second.size());
    if (!MacEqual(absl::MakeConstSpan(
                      reinterpret_cast<const uint8_t*>(got.data()), got.size()),
                  absl::MakeConstSpan(
                      reinterpret_cast<const uint8_t*>(expected.data()),
                      expected.size()))) {
      problem =
          absl::StrCat("carries a credential that is not task ", task_id,
                       "'s: a different TPU_DIST_JOB_SECRET, or not this job");
    }
  }
  if (problem.empty()) return absl::OkStatus();
  const std::string message = absl::StrCat(
      "coordination service of job '", job_id_, "': refused ", method, " from ",
      peer.empty() ? context.peer() : peer, " (claiming task ", task_id,
      "): the call ", problem,
      "; every rank needs the job's TPU_DIST_JOB_SECRET");
  const int n = ++refused_;
  if (n <= kRefusalLogLines || n % 100 == 0) {
    std::fprintf(stderr, "[coordination] %s (refusal #%d)\n", message.c_str(),
                 n);
  }
  return absl::UnauthenticatedError(message);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_path, const std::string& key_path) {
  if (cert_path.empty() && key_path.empty())
    return grpc::InsecureServerCredentials();
  if (cert_path.empty() || key_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS for the coordination service needs both a "
                     "certificate and a key (got cert '",
                     cert_path, "', key '", key_path, "')"));
  }
  absl::StatusOr<std::string> cert = ReadPem(cert_path, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_path, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const std::string& ca_path,
                       const std::string& server_name,
                       grpc::ChannelArguments* args) {
  if (ca_path.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPem(ca_path, "CA");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  if (!server_name.empty()) args->SetSslTargetNameOverride(server_name);
  return grpc::SslCredentials(options);
}

}  // namespace tpudist::tpu_runtime::coordination
