#include "tpu_runtime/env_parse.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tpudist::tpu_runtime {

absl::Status EnvError(absl::string_view name, absl::string_view value,
                      absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(name, "=\"", value, "\": ", expected));
}

absl::Status UnsetError(absl::string_view name, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(name, " is unset: ", expected));
}

std::optional<std::string> GetEnv(const EnvMap& env, absl::string_view name) {
  auto it = env.find(std::string(name));
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool HasEnv(const EnvMap& env, absl::string_view name) { return GetEnv(env, name).has_value(); }

absl::StatusOr<int> ParseInt(absl::string_view name, absl::string_view value, int min_value,
                             int max_value) {
  absl::string_view s = absl::StripAsciiWhitespace(value);
  bool digits = !s.empty();
  for (size_t i = 0; i < s.size(); ++i) {
    const bool sign = (i == 0 && s[i] == '-' && s.size() > 1);
    if (!sign && !absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) digits = false;
  }
  int64_t n = 0;
  if (!digits || !absl::SimpleAtoi(s, &n) || n < min_value || n > max_value) {
    std::string range = min_value == 0 && max_value >= (1 << 30)
                            ? std::string("a non-negative integer")
                            : absl::StrCat("an integer in ", min_value, "..", max_value);
    return EnvError(name, value, absl::StrCat("expected ", range));
  }
  return static_cast<int>(n);
}

absl::StatusOr<std::optional<int>> GetInt(const EnvMap& env, absl::string_view name,
                                          int min_value, int max_value) {
  std::optional<std::string> v = GetEnv(env, name);
  if (!v) return std::optional<int>();
  absl::StatusOr<int> n = ParseInt(name, *v, min_value, max_value);
  if (!n.ok()) return n.status();
  return std::optional<int>(*n);
}

absl::StatusOr<std::vector<std::string>> ParseCommaList(absl::string_view name,
                                                        absl::string_view value) {
  std::vector<std::string> items;
  std::set<std::string> seen;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::string item(absl::StripAsciiWhitespace(part));
    if (item.empty()) {
      return EnvError(name, value, "expected a comma list with no empty entries");
    }
    if (!seen.insert(item).second) {
      return EnvError(name, value,
                      absl::StrCat("expected distinct entries, but \"", item, "\" repeats"));
    }
    items.push_back(std::move(item));
  }
  return items;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view name, absl::string_view item) {
  const size_t colon = item.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return EnvError(name, item, "expected host:port, like \"10.0.0.2:8471\"");
  }
  HostPort hp;
  hp.host = std::string(item.substr(0, colon));
  absl::StatusOr<int> port = ParseInt(name, item.substr(colon + 1), 1, 65535);
  if (!port.ok()) {
    return EnvError(name, item, "expected host:port with a port in 1..65535");
  }
  hp.port = *port;
  return hp;
}

}  // namespace tpudist::tpu_runtime
