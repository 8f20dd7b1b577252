// Small, pure readers for environment variables, shared by the discovery
// code. Every error is absl::InvalidArgumentError of the form
//   NAME="value": expected <what>
// so a user can see at once which variable to fix. Thread-safe.
//
// A variable set to the empty string is treated as unset everywhere (shells
// and Kubernetes manifests often export VAR="" to mean "no value").
#ifndef TPU_DIST_TPU_RUNTIME_ENV_PARSE_H_
#define TPU_DIST_TPU_RUNTIME_ENV_PARSE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tpu_runtime/env_map.h"

namespace tpudist::tpu_runtime {

// InvalidArgumentError `NAME="value": <expected>`.
absl::Status EnvError(absl::string_view name, absl::string_view value,
                      absl::string_view expected);

// InvalidArgumentError `NAME is unset: <expected>`, for a required variable.
absl::Status UnsetError(absl::string_view name, absl::string_view expected);

// The value of `name`, or nullopt when unset or empty.
std::optional<std::string> GetEnv(const EnvMap& env, absl::string_view name);

// True when `name` is set to a non-empty value.
bool HasEnv(const EnvMap& env, absl::string_view name);

// Parses a decimal integer in [min_value, max_value]; leading/trailing
// whitespace is allowed, signs other than a leading '-' are not.
absl::StatusOr<int> ParseInt(absl::string_view name, absl::string_view value, int min_value,
                             int max_value);

// GetEnv + ParseInt: nullopt when unset, an error when malformed or out of
// range. The range is [min_value, max_value].
absl::StatusOr<std::optional<int>> GetInt(const EnvMap& env, absl::string_view name,
                                          int min_value = 0, int max_value = 1 << 30);

// Splits a comma list, trimming whitespace around each item. Errors on an
// empty item ("a,,b") and on duplicates (naming the duplicate).
absl::StatusOr<std::vector<std::string>> ParseCommaList(absl::string_view name,
                                                        absl::string_view value);

// "host:port" -> {host, port}; the port is after the last ':' and in
// 1..65535, the host is non-empty. `item` is the single entry, `name` the
// variable it came from.
struct HostPort {
  std::string host;
  int port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view name, absl::string_view item);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_ENV_PARSE_H_
