#include "tpu_runtime/job_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::tpu_runtime {
namespace {

constexpr size_t kMaxSecretFileBytes = 64 << 10;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsHexSecret(absl::string_view value) {
  if (value.size() < 2 * kMinJobSecretBytes || value.size() % 2 != 0) return false;
  for (char c : value) {
    if (HexValue(c) < 0) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ParseJobSecret(absl::string_view value, absl::string_view source) {
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " is set but empty; unset it to run without a job secret, or give one of at least ",
        kMinJobSecretBytes, " bytes (e.g. `openssl rand -hex 32`)"));
  }
  if (IsHexSecret(value)) {
    std::string bytes(value.size() / 2, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(HexValue(value[2 * i]) << 4 | HexValue(value[2 * i + 1]));
    }
    return bytes;
  }
  if (value.size() < kMinJobSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " is ", value.size(), " bytes long; a job secret needs at least ",
                     kMinJobSecretBytes, " bytes, or ", 2 * kMinJobSecretBytes,
                     " hex digits (e.g. `openssl rand -hex 32`)"));
  }
  return std::string(value);
}

absl::StatusOr<std::string> ReadJobSecretFile(const std::string& path, absl::string_view variable) {
  const std::string source = absl::StrCat("the file ", path, " (", variable, ")");
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(variable, " is set but empty"));
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", source, ": ", std::strerror(errno)));
  }
  // As ssh does for a private key: a secret others can read is no secret.
  // Checked on the open file, so the file checked is the file read.
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stat ", source, ": ", std::strerror(error)));
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::InvalidArgumentError(absl::StrCat(
        "permissions ", mode, " for ", source,
        " are too open: a job secret file must be readable only by its owner; run `chmod 600 ",
        path, "`"));
  }
  std::string text(kMaxSecretFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", source, ": ", std::strerror(error)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(got);
  if (text.size() > kMaxSecretFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " is larger than ", kMaxSecretFileBytes, " bytes; not a job secret"));
  }
  // `echo $SECRET > file` adds a newline; whitespace at the end is not part
  // of the secret.
  while (!text.empty() && absl::ascii_isspace(static_cast<unsigned char>(text.back()))) {
    text.pop_back();
  }
  return ParseJobSecret(text, source);
}

absl::StatusOr<std::string> JobSecretFromEnv(const EnvMap& env) {
  auto value = env.find(kJobSecretEnv);
  auto file = env.find(kJobSecretFileEnv);
  if (value != env.end() && file != env.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("both ", kJobSecretEnv, " and ", kJobSecretFileEnv, " are set; set only one"));
  }
  if (value != env.end()) return ParseJobSecret(value->second, kJobSecretEnv);
  if (file != env.end()) return ReadJobSecretFile(file->second, kJobSecretFileEnv);
  return std::string();
}

absl::StatusOr<std::string> JobSecretFromProcessEnv() {
  EnvMap env;
  for (const char* name : {kJobSecretEnv, kJobSecretFileEnv}) {
    if (const char* v = std::getenv(name); v != nullptr) env[name] = v;
  }
  return JobSecretFromEnv(env);
}

absl::StatusOr<std::string> GenerateJobSecret() {
  return SecureRandomBytes(kGeneratedJobSecretBytes);
}

std::string JobSecretHex(absl::string_view secret) {
  return ToHex(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()));
}

}  // namespace tpudist::tpu_runtime
