// The per-job secret that authenticates every connection of a job: the TCP
// mesh between hosts (an HMAC challenge-response, collectives/tcp/tcp_mesh.h)
// and the calls to the coordination service (a per-task credential derived
// from it, tpu_runtime/coordination/coordination_service.h).
//
// Where it comes from (the launcher hands it to every rank out of band):
//   TPU_DIST_JOB_SECRET       the secret itself: 32 or more hex digits (an
//                             even count; decoded to bytes), or else at least
//                             16 raw bytes used as they are.
//                             `openssl rand -hex 32` makes a good one.
//   TPU_DIST_JOB_SECRET_FILE  a file holding such a value (trailing
//                             whitespace and newlines ignored): keeps the
//                             secret out of the environment of every process.
//                             It must be private to its owner (mode 0600 or
//                             0400); a file group or others can access is
//                             refused.
// Setting both is an error (which one wins would be a guess). tpurun and
// tpu_dist-ray-run generate one per job when none is given; a multi-host
// tpurun (one per host) requires one to be given, the same on every host.
//
// Neither set means "no secret": listeners accept unauthenticated peers, as
// before this existed, and warn once when they bind a non-loopback address
// (a hand-run binary with torchrun's variables on one machine keeps working).
//
// Errors name the variable (and the file), never the secret's bytes.
// Thread-safety: all functions are thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_JOB_SECRET_H_
#define TPU_DIST_TPU_RUNTIME_JOB_SECRET_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tpu_runtime/env_map.h"

namespace tpudist::tpu_runtime {

inline constexpr char kJobSecretEnv[] = "TPU_DIST_JOB_SECRET";
inline constexpr char kJobSecretFileEnv[] = "TPU_DIST_JOB_SECRET_FILE";
// 128 bits: below this a secret is guessable offline from one handshake.
inline constexpr size_t kMinJobSecretBytes = 16;
// What GenerateJobSecret draws.
inline constexpr size_t kGeneratedJobSecretBytes = 32;

// The secret's bytes from `value` (see the file comment). `source` names
// where it came from in errors ("TPU_DIST_JOB_SECRET", "file /x (from
// TPU_DIST_JOB_SECRET_FILE)"). InvalidArgument when empty or too short.
absl::StatusOr<std::string> ParseJobSecret(absl::string_view value, absl::string_view source);

// Reads and parses the secret in `path`. InvalidArgument naming `variable`
// and the path when it cannot be read, is not a valid secret, or is
// accessible to group or others (any of mode 077, as ssh refuses such a
// private key: `chmod 600` it).
absl::StatusOr<std::string> ReadJobSecretFile(const std::string& path, absl::string_view variable);

// The job's secret from `env`; "" when neither variable is set.
// InvalidArgument when both are set or the one set is invalid.
absl::StatusOr<std::string> JobSecretFromEnv(const EnvMap& env);

// JobSecretFromEnv over this process's environment (reads only the two
// variables).
absl::StatusOr<std::string> JobSecretFromProcessEnv();

// kGeneratedJobSecretBytes fresh random bytes (OpenSSL's CSPRNG).
absl::StatusOr<std::string> GenerateJobSecret();

// Lower-case hex of `secret`: the form launchers put in TPU_DIST_JOB_SECRET
// (ParseJobSecret decodes it back to the same bytes).
std::string JobSecretHex(absl::string_view secret);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_JOB_SECRET_H_
