// HMAC-SHA256, constant-time comparison and secure random bytes: the three
// primitives the job's authentication (tpu_runtime/job_secret.h, the TCP
// mesh handshake, the coordination service's call credential) is built on.
// Thin wrappers over OpenSSL's libcrypto, so that callers never touch it.
//
//   Mac mac = HmacSha256(secret, {"tpu_dist/tcp_mesh/v2", hello_a, hello_b});
//   if (!MacEqual(mac, received)) ...  // constant time
//
// Thread-safety: all functions are thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_HMAC_H_
#define TPU_DIST_TPU_RUNTIME_HMAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpudist::tpu_runtime {

inline constexpr size_t kMacBytes = 32;
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256 under `key` of the concatenation of `parts`, each preceded by
// its length (8 bytes, little-endian), so that {"ab", "c"} and {"a", "bc"}
// authenticate different messages. Callers put a domain label (protocol and
// version) first so that a MAC made for one purpose is never valid for
// another.
Mac HmacSha256(absl::string_view key, absl::Span<const absl::string_view> parts);

// Compares in time that depends only on the sizes (CRYPTO_memcmp): a peer
// timing our comparison learns nothing about the expected MAC. False when
// the sizes differ.
bool MacEqual(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b);

// `n` bytes from the OS CSPRNG (OpenSSL RAND_bytes). Internal error only if
// the generator is not seeded, which on Linux means getrandom() failed.
absl::StatusOr<std::string> SecureRandomBytes(size_t n);

// Lower-case hex of `bytes`.
std::string ToHex(absl::Span<const uint8_t> bytes);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_HMAC_H_
