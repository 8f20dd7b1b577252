#include "tpu_runtime/coordination/coordination_auth.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

// Domain labels: a MAC made for one purpose is never valid for another.
constexpr absl::string_view kNonceLabel = "tpu_dist/coordination/v2/nonce";
constexpr absl::string_view kServiceLabel = "tpu_dist/coordination/v2/service";
constexpr absl::string_view kCallLabel = "tpu_dist/coordination/v2/call";
constexpr absl::string_view kCredentialPrefix = "v2.";
constexpr size_t kNonceBytes = 32;
constexpr size_t kSessionHexDigits = 16;
// "v2." + session id + "." + MAC.
constexpr size_t kCredentialSize = 3 + kSessionHexDigits + 1 + 2 * kMacBytes;
constexpr int kRefusalLogLines = 10;
// Bound of CallAuthenticator::verified_ (one entry per client that called).
constexpr size_t kMaxVerified = 4096;

std::string SessionHex(uint64_t session_id) {
  return absl::StrFormat("%016x", session_id);
}

// The session id in `hex` (exactly 16 lower-case hex digits), or false.
bool ParseSessionHex(absl::string_view hex, uint64_t* session_id) {
  if (hex.size() != kSessionHexDigits) return false;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *session_id = v;
  return true;
}

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

std::string SessionCredential(absl::string_view secret,
                              absl::string_view job_id, int task_id,
                              uint64_t session_id,
                              absl::string_view server_nonce) {
  const std::string task = absl::StrCat(task_id);
  const std::string session = SessionHex(session_id);
  return absl::StrCat(
      kCredentialPrefix, session, ".",
      ToHex(HmacSha256(secret,
                       {kCallLabel, job_id, task, session, server_nonce})));
}

Mac ServiceProof(absl::string_view secret, absl::string_view job_id,
                 int task_id, absl::string_view client_nonce,
                 uint64_t session_id, absl::string_view server_nonce) {
  const std::string task = absl::StrCat(task_id);
  const std::string session = SessionHex(session_id);
  return HmacSha256(secret, {kServiceLabel, job_id, task, client_nonce,
                             session, server_nonce});
}

absl::Status RefuseService(int task_id, absl::string_view job_id,
                           absl::string_view address,
                           absl::string_view reason) {
  return absl::UnauthenticatedError(absl::StrFormat(
      "task %d of job '%s': refusing the coordination service at %s: it "
      "cannot prove that it holds the job secret (%s). Another process may be "
      "listening on the master port instead of rank 0's coordination service, "
      "or rank 0 runs with a different TPU_DIST_JOB_SECRET (or none); no "
      "credential was sent to it",
      task_id, job_id, address, reason));
}

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

absl::StatusOr<std::string> ClientHandshake(
    absl::string_view secret, absl::string_view job_id, int task_id,
    absl::string_view address,
    absl::FunctionRef<absl::StatusOr<SessionOffer>(absl::string_view)> hello) {
  absl::StatusOr<std::string> client_nonce = SecureRandomBytes(kNonceBytes);
  if (!client_nonce.ok()) return client_nonce.status();
  absl::StatusOr<SessionOffer> offer = hello(*client_nonce);
  if (!offer.ok()) {
    if (absl::IsUnavailable(offer.status()) ||
        absl::IsDeadlineExceeded(offer.status())) {
      return absl::Status(
          offer.status().code(),
          absl::StrFormat("task %d of job '%s': handshake (Hello) with the "
                          "coordination service at %s failed: %s",
                          task_id, job_id, address, offer.status().message()));
    }
    return RefuseService(
        task_id, job_id, address,
        absl::StrCat("it answered the handshake with ",
                     absl::StatusCodeToString(offer.status().code()), ": ",
                     offer.status().message()));
  }
  if (offer->server_nonce.size() != kNonceBytes ||
      offer->proof.size() != kMacBytes) {
    return RefuseService(task_id, job_id, address,
                         "its handshake answer is malformed");
  }
  const Mac expected = ServiceProof(secret, job_id, task_id, *client_nonce,
                                    offer->session_id, offer->server_nonce);
  if (!MacEqual(expected, Bytes(offer->proof))) {
    return RefuseService(task_id, job_id, address,
                         "its proof does not match this rank's secret");
  }
  return SessionCredential(secret, job_id, task_id, offer->session_id,
                           offer->server_nonce);
}

CallAuthenticator::CallAuthenticator(std::string secret, std::string job_id)
    : secret_(std::move(secret)), job_id_(std::move(job_id)) {
  if (secret_.empty()) return;
  absl::StatusOr<std::string> key = SecureRandomBytes(kMacBytes);
  if (key.ok()) {
    instance_key_ = *std::move(key);
  } else {
    // Offer() and Verify() then refuse everything, saying why.
    std::fprintf(stderr, "[coordination] job '%s': %s\n", job_id_.c_str(),
                 std::string(key.status().message()).c_str());
  }
}

std::string CallAuthenticator::ServerNonce(absl::string_view job_id,
                                           int task_id,
                                           uint64_t session_id) const {
  const std::string task = absl::StrCat(task_id);
  const std::string session = SessionHex(session_id);
  const Mac nonce =
      HmacSha256(instance_key_, {kNonceLabel, job_id, task, session});
  return std::string(nonce.begin(), nonce.end());
}

absl::StatusOr<SessionOffer> CallAuthenticator::Offer(
    absl::string_view job_id, int task_id,
    absl::string_view client_nonce) const {
  if (!enabled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordination service of job '", job_id_,
        "' has no job secret (TPU_DIST_JOB_SECRET unset on rank 0)"));
  }
  if (instance_key_.empty()) {
    return absl::InternalError(absl::StrCat(
        "the coordination service of job '", job_id_,
        "' could not draw its session key from the OS random generator"));
  }
  if (client_nonce.size() != kNonceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Hello: the client nonce is ", client_nonce.size(),
                     " bytes, not ", kNonceBytes));
  }
  SessionOffer offer;
  offer.session_id = next_session_.fetch_add(1, std::memory_order_relaxed);
  offer.server_nonce = ServerNonce(job_id, task_id, offer.session_id);
  const Mac proof = ServiceProof(secret_, job_id, task_id, client_nonce,
                                 offer.session_id, offer.server_nonce);
  offer.proof.assign(proof.begin(), proof.end());
  return offer;
}

std::string CallAuthenticator::Verify(absl::string_view credential,
                                      absl::string_view job_id,
                                      int task_id) const {
  if (credential.empty()) return "carries no job credential";
  if (absl::StartsWith(credential, "v1.")) {
    return "carries a static (v1) credential, which is no longer accepted "
           "(it could be replayed): every rank must run the same tpu_dist "
           "version";
  }
  uint64_t session_id = 0;
  if (credential.size() != kCredentialSize ||
      !absl::StartsWith(credential, kCredentialPrefix) ||
      credential[kCredentialPrefix.size() + kSessionHexDigits] != '.' ||
      !ParseSessionHex(
          credential.substr(kCredentialPrefix.size(), kSessionHexDigits),
          &session_id)) {
    return "carries a malformed job credential";
  }
  if (instance_key_.empty() || session_id == 0 ||
      session_id >= next_session_.load(std::memory_order_relaxed)) {
    return absl::StrCat("carries a session this service instance never "
                        "opened: replayed from another listener or an earlier "
                        "run, or a client without the handshake");
  }
  const bool ours = job_id == job_id_;
  std::string expected;
  if (ours) {
    absl::MutexLock lock(&mu_);
    auto it = verified_.find({task_id, session_id});
    if (it != verified_.end()) expected = it->second;
  }
  const bool cached = !expected.empty();
  if (!cached) {
    expected = SessionCredential(secret_, job_id, task_id, session_id,
                                 ServerNonce(job_id, task_id, session_id));
  }
  if (!MacEqual(Bytes(credential), Bytes(expected))) {
    return absl::StrCat(
        "carries a credential this service instance did not issue to task ",
        task_id,
        ": replayed from another listener or an earlier run of the job, or a "
        "different TPU_DIST_JOB_SECRET");
  }
  if (ours && !cached) {
    absl::MutexLock lock(&mu_);
    if (verified_.size() >= kMaxVerified) verified_.clear();
    verified_.emplace(std::make_pair(task_id, session_id), std::move(expected));
  }
  return "";
}

absl::Status CallAuthenticator::Check(const grpc::ServerContext& context,
                                      absl::string_view method,
                                      absl::string_view job_id,
                                      int task_id,
                                      const std::string& peer) const {
  if (!enabled()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  const std::string problem =
      it == metadata.end()
          ? std::string("carries no job credential")
          : Verify(absl::string_view(it->second.data(), it->second.size()),
                   job_id, task_id);
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
