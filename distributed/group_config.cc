#include "distributed/group_config.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/env_parse.h"
#include "tpu_runtime/job_secret.h"

namespace tpudist::distributed {
namespace {

namespace tr = ::tpudist::tpu_runtime;

bool IsWildcard(const std::string& a) { return a == "0.0.0.0" || a == "::"; }

// The host id rule of the file comment. The placement is the RankInfo's
// host_index; "slice_host_<h>" is only its key in the store. Without a
// RankInfo nothing names the host (no TPU_* variable is read here:
// discovery, tpu_runtime/env_discovery.h, is their one reader).
std::string ResolveHostId(const tr::RankInfo* info, const tr::EnvMap& env,
                          const GroupInitOptions& options) {
  if (!options.host_id.empty()) return options.host_id;
  if (std::optional<std::string> v = tr::GetEnv(env, "TPU_DIST_HOST_ID")) return *v;
  if (info != nullptr && info->host_index >= 0) {
    return absl::StrCat("slice_host_", info->host_index);
  }
  return std::string();
}

absl::StatusOr<std::string> ResolveJobId(const tr::RankInfo* info, const tr::EnvMap& env,
                                         const GroupInitOptions& options) {
  if (!options.job_id.empty()) return options.job_id;
  if (std::optional<std::string> v = tr::GetEnv(env, "TPU_DIST_JOB_ID")) return *v;
  if (info == nullptr || info->job_id.empty()) return std::string();
  if (info->restart_count > 0) return absl::StrCat(info->job_id, "_a", info->restart_count);
  return info->job_id;
}

// This host's entry of its slice's host list (RankInfo::hostname(), which
// indexes by the host's place in its slice), "" when unknown (no RankInfo,
// or a host list that does not name it).
std::string ResolveWorkerHostname(const tr::RankInfo* info) {
  return info != nullptr ? info->hostname() : std::string();
}

absl::StatusOr<TcpStoreSpec> ResolveTcpStore(const tr::RankInfo* info, const tr::EnvMap& env) {
  TcpStoreSpec spec;
  spec.master_addr = info != nullptr ? info->master_addr : "127.0.0.1";
  spec.master_port = info != nullptr ? info->master_port : 29500;
  if (std::optional<std::string> addr = tr::GetEnv(env, "MASTER_ADDR")) spec.master_addr = *addr;
  absl::StatusOr<std::optional<int>> port = tr::GetInt(env, "MASTER_PORT", 1, 65535);
  if (!port.ok()) return port.status();
  if (port->has_value()) spec.master_port = **port;
  spec.is_server = info == nullptr || info->rank == 0;
  spec.world_size = info != nullptr ? info->world_size : 1;
  return spec;
}

}  // namespace

absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name) {
  if (name == "tpu_dist") return BackendKind::kTpuDist;
  if (name == "gloo") return BackendKind::kGloo;
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", name, "\": expected tpu_dist or gloo"));
}

const char* BackendKindName(BackendKind kind) {
  return kind == BackendKind::kGloo ? "gloo" : "tpu_dist";
}

absl::StatusOr<GroupConfig> ResolveGroupConfig(const tr::RankInfo* info, const tr::EnvMap& env,
                                               const GroupInitOptions& options) {
  GroupConfig c;
  absl::StatusOr<BackendKind> backend = ParseBackendKind(options.backend);
  if (!backend.ok()) return backend.status();
  c.backend = *backend;
  if (options.group_name.empty()) {
    return absl::InvalidArgumentError("GroupInitOptions.group_name is empty");
  }
  c.group_name = options.group_name;
  // inf became INT64_MAX ms here and every deadline overflowed: each
  // collective "timed out" at once.
  if (absl::Status s = tr::CheckUserDuration("init_process_group timeout", options.timeout,
                                             tr::DurationRule::kPositive);
      !s.ok()) {
    return s;
  }
  c.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout));
  c.gloo_threads = options.gloo_threads;

  collectives::ProcessGroupTpuDist::Options& o = c.tpu_dist;
  o.timeout = c.timeout;
  o.group_name = options.group_name;
  o.host_id = ResolveHostId(info, env, options);
  // The slice is RankInfo's (MEGASCALE_SLICE_ID): with the host id it is
  // what a group's members publish to find their locality.
  o.slice_id = info != nullptr ? info->slice_index : -1;
  absl::StatusOr<std::string> job_id = ResolveJobId(info, env, options);
  if (!job_id.ok()) return job_id.status();
  o.job_id = *job_id;
  o.bind_address = !options.bind_address.empty()
                       ? options.bind_address
                       : tr::GetEnv(env, "TPU_DIST_BIND_ADDRESS").value_or("");
  o.worker_hostname = ResolveWorkerHostname(info);
  // Shm tuning for tests and experiments (0 / unset: chosen per host).
  absl::StatusOr<std::optional<int>> slot_bytes = tr::GetInt(env, "TPU_DIST_SHM_SLOT_BYTES", 0);
  if (!slot_bytes.ok()) return slot_bytes.status();
  if (*slot_bytes) o.shm_slot_bytes = **slot_bytes;
  absl::StatusOr<std::optional<int>> slots = tr::GetInt(env, "TPU_DIST_SHM_SLOTS", 0, 1024);
  if (!slots.ok()) return slots.status();
  if (*slots) o.shm_num_slots = **slots;
  absl::StatusOr<std::optional<int>> small = tr::GetInt(env, "TPU_DIST_SMALL_ALLREDUCE_BYTES", 0);
  if (!small.ok()) return small.status();
  if (*small) o.small_allreduce_bytes = **small;
  absl::StatusOr<std::optional<int>> load = tr::GetInt(env, "TPU_DIST_ASSUME_FOREIGN_LOAD", 0, 1);
  if (!load.ok()) return load.status();
  if (*load) o.shm_assume_foreign_load = **load == 1;
  absl::StatusOr<std::optional<int>> shm_p2p = tr::GetInt(env, "TPU_DIST_SHM_P2P", 0, 1);
  if (!shm_p2p.ok()) return shm_p2p.status();
  if (*shm_p2p) o.shm_p2p = **shm_p2p == 1;
  // Flight recorder (docs/fault_tolerance.md): entries kept per group, and
  // where automatic dumps go (<dir>/tpu_dist_fr_rank_<r>, or torch's
  // TORCH_FR_DUMP_TEMP_FILE prefix + rank; neither: no automatic dumps).
  absl::StatusOr<std::optional<int>> fr_size =
      tr::GetInt(env, "TPU_DIST_FLIGHT_RECORDER_SIZE", 0, 1 << 20);
  if (!fr_size.ok()) return fr_size.status();
  if (*fr_size) o.flight_recorder_entries = **fr_size;
  if (std::optional<std::string> dir = tr::GetEnv(env, "TPU_DIST_FLIGHT_RECORDER_DIR");
      dir.has_value() && !dir->empty()) {
    o.flight_recorder_dump_prefix = absl::StrCat(*dir, "/tpu_dist_fr_rank_");
  } else if (std::optional<std::string> prefix = tr::GetEnv(env, "TORCH_FR_DUMP_TEMP_FILE");
             prefix.has_value() && !prefix->empty()) {
    o.flight_recorder_dump_prefix = *prefix;
  }
  absl::StatusOr<std::string> secret = tr::JobSecretFromEnv(env);
  if (!secret.ok()) return secret.status();
  o.job_secret = *secret;

  if (!o.bind_address.empty() && !IsWildcard(o.bind_address)) {
    c.gloo_hostname = o.bind_address;
  } else if (!o.worker_hostname.empty()) {
    c.gloo_hostname = o.worker_hostname;
  } else {
    c.gloo_hostname = "127.0.0.1";
  }

  c.given_store = options.store;
  if (!c.given_store) {
    absl::StatusOr<TcpStoreSpec> spec = ResolveTcpStore(info, env);
    if (!spec.ok()) return spec.status();
    c.tcp_store = *spec;
  }
  return c;
}

std::string GroupNameFor(absl::string_view base, absl::Span<const int> global_ranks) {
  std::string name = absl::StrCat(base, "_", absl::StrJoin(global_ranks, "_"));
  if (name.size() <= 64) return name;
  // FNV-1a over the ranks: stable across processes (std::hash is not).
  uint64_t h = 1469598103934665603ull;
  for (int r : global_ranks) {
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * i));
      h *= 1099511628211ull;
    }
  }
  return absl::StrFormat("%s_n%d_%016x", base, global_ranks.size(), h);
}

}  // namespace tpudist::distributed
