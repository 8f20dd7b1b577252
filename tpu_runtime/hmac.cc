#include "tpu_runtime/hmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime {

Mac HmacSha256(absl::string_view key, absl::Span<const absl::string_view> parts) {
  std::string message;
  size_t total = 0;
  for (absl::string_view p : parts) total += 8 + p.size();
  message.reserve(total);
  for (absl::string_view p : parts) {
    uint64_t n = p.size();
    for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    message.append(p.data(), p.size());
  }
  Mac mac{};
  unsigned int len = 0;
  // Cannot fail for SHA-256 with a valid buffer; an empty key is allowed by
  // HMAC but never used by callers (they check for a secret first).
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  OPENSSL_cleanse(message.data(), message.size());
  return mac;
}

bool MacEqual(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> SecureRandomBytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError(
        absl::StrCat("RAND_bytes(", n, ") failed: the OS random generator is unavailable"));
  }
  return out;
}

std::string ToHex(absl::Span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

}  // namespace tpudist::tpu_runtime
