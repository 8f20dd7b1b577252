#include "tpu_runtime/megascale_env.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "tpu_runtime/env_parse.h"

namespace tpudist::tpu_runtime {
namespace {

constexpr const char* kVars[] = {"MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                                 "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT"};

// True when `address` carries a port: "host:port" (one colon) or
// "[v6-literal]:port". A bare IPv6 literal ("fe80::1") has none.
bool HasPort(const std::string& address) {
  if (!address.empty() && address.front() == '[') return address.find("]:") != std::string::npos;
  const size_t colon = address.find(':');
  return colon != std::string::npos && address.find(':', colon + 1) == std::string::npos;
}

}  // namespace

absl::StatusOr<std::optional<MegascaleEnv>> ReadMegascaleEnv(const EnvMap& env) {
  bool any = false;
  for (const char* var : kVars) any = any || HasEnv(env, var);
  if (!any) return std::nullopt;

  absl::StatusOr<std::optional<int>> slices = GetInt(env, "MEGASCALE_NUM_SLICES", 1, 4096);
  if (!slices.ok()) return slices.status();
  if (!*slices) {
    return UnsetError("MEGASCALE_NUM_SLICES",
                      "expected the number of slices of the job: MEGASCALE_SLICE_ID, "
                      "MEGASCALE_COORDINATOR_ADDRESS or MEGASCALE_PORT is set without it");
  }
  MegascaleEnv out;
  out.num_slices = **slices;
  absl::StatusOr<std::optional<int>> id = GetInt(env, "MEGASCALE_SLICE_ID", 0, 1 << 30);
  if (!id.ok()) return id.status();
  if (*id) {
    if (**id >= out.num_slices) {
      return EnvError("MEGASCALE_SLICE_ID", absl::StrCat(**id),
                      absl::StrCat("expected 0..", out.num_slices - 1, " (MEGASCALE_NUM_SLICES=",
                                   out.num_slices, ")"));
    }
    out.slice_index = **id;
  } else if (out.num_slices > 1) {
    return UnsetError("MEGASCALE_SLICE_ID",
                      absl::StrCat("expected this process's slice, 0..", out.num_slices - 1,
                                   " (MEGASCALE_NUM_SLICES=", out.num_slices, ")"));
  }
  absl::StatusOr<std::optional<int>> port = GetInt(env, "MEGASCALE_PORT", 1, 65535);
  if (!port.ok()) return port.status();
  std::optional<std::string> address = GetEnv(env, "MEGASCALE_COORDINATOR_ADDRESS");
  if (!address) {
    if (out.num_slices > 1) {
      return UnsetError("MEGASCALE_COORDINATOR_ADDRESS",
                        absl::StrCat("expected the host[:port] of slice 0's first host for a "
                                     "job of MEGASCALE_NUM_SLICES=",
                                     out.num_slices, " slices"));
    }
    return out;
  }
  if (HasPort(*address)) {
    absl::StatusOr<HostPort> hp = ParseHostPort("MEGASCALE_COORDINATOR_ADDRESS", *address);
    if (!hp.ok()) return hp.status();
    out.coordinator_host = hp->host;
    out.coordinator = *address;
  } else {
    out.coordinator_host = *address;
    out.coordinator = absl::StrCat(*address, ":", port->value_or(kDefaultMegascalePort));
  }
  if (out.coordinator_host.empty() || out.coordinator_host.find_first_of(" \t,") != std::string::npos) {
    return EnvError("MEGASCALE_COORDINATOR_ADDRESS", *address, "expected one host[:port]");
  }
  return out;
}

}  // namespace tpudist::tpu_runtime
