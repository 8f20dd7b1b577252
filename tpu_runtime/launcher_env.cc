#include "tpu_runtime/launcher_env.h"

#include "absl/strings/str_cat.h"
#include "tpu_runtime/env_parse.h"

namespace tpudist::tpu_runtime {
namespace {

struct Family {
  DiscoverySource source;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;  // nullptr: derived (SLURM)
};

constexpr Family kFamilies[] = {
    {DiscoverySource::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {DiscoverySource::kMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {DiscoverySource::kMpi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {DiscoverySource::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// Reads `var` (>= min_value) into `out` when set.
absl::Status ReadNamed(const EnvMap& env, const char* var, int min_value,
                       std::optional<NamedInt>* out) {
  absl::StatusOr<std::optional<int>> v = GetInt(env, var, min_value);
  if (!v.ok()) return v.status();
  if (*v) *out = NamedInt{**v, var};
  return absl::OkStatus();
}

absl::Status ReadTorchrunExtras(const EnvMap& env, LauncherRanks* out) {
  std::optional<NamedInt> group, node;
  if (absl::Status s = ReadNamed(env, "GROUP_RANK", 0, &group); !s.ok()) return s;
  if (absl::Status s = ReadNamed(env, "NODE_RANK", 0, &node); !s.ok()) return s;
  if (group && node && group->value != node->value) {
    return EnvError("NODE_RANK", absl::StrCat(node->value),
                    absl::StrCat("expected ", group->value, ", the same as GROUP_RANK"));
  }
  out->host_index = group ? group : node;
  return ReadNamed(env, "GROUP_WORLD_SIZE", 1, &out->num_hosts);
}

absl::Status ReadSlurmExtras(const EnvMap& env, LauncherRanks* out) {
  if (absl::Status s = ReadNamed(env, "SLURM_NODEID", 0, &out->host_index); !s.ok()) return s;
  if (absl::Status s = ReadNamed(env, "SLURM_NNODES", 1, &out->num_hosts); !s.ok()) return s;
  if (out->num_hosts) {
    const int nodes = out->num_hosts->value;
    if (out->world_size.value % nodes != 0) {
      return EnvError("SLURM_NTASKS", absl::StrCat(out->world_size.value),
                      absl::StrCat("expected a multiple of SLURM_NNODES=", nodes,
                                   " (tpu_dist needs the same number of tasks on every node)"));
    }
    out->local_world_size = NamedInt{out->world_size.value / nodes, "SLURM_NTASKS/SLURM_NNODES"};
  }
  out->master_addr_hint = GetEnv(env, "SLURM_LAUNCH_NODE_IPADDR");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<LauncherRanks>> ReadLauncherRanks(const EnvMap& env) {
  for (const Family& f : kFamilies) {
    const bool has_rank = HasEnv(env, f.rank);
    const bool has_world = HasEnv(env, f.world);
    if (!has_rank && !has_world) continue;
    if (has_rank != has_world) {
      const char* present = has_rank ? f.rank : f.world;
      const char* missing = has_rank ? f.world : f.rank;
      return EnvError(present, *GetEnv(env, present),
                      absl::StrCat("expected ", missing, " to be set too"));
    }
    LauncherRanks out;
    out.source = f.source;
    absl::StatusOr<std::optional<int>> world = GetInt(env, f.world, 1);
    if (!world.ok()) return world.status();
    out.world_size = NamedInt{**world, f.world};
    absl::StatusOr<std::optional<int>> rank = GetInt(env, f.rank, 0);
    if (!rank.ok()) return rank.status();
    if (**rank >= out.world_size.value) {
      return EnvError(f.rank, absl::StrCat(**rank),
                      absl::StrCat("expected 0..", out.world_size.value - 1, " (", f.world, "=",
                                   out.world_size.value, ")"));
    }
    out.rank = NamedInt{**rank, f.rank};
    if (absl::Status s = ReadNamed(env, f.local_rank, 0, &out.local_rank); !s.ok()) return s;
    if (f.local_world != nullptr) {
      if (absl::Status s = ReadNamed(env, f.local_world, 1, &out.local_world_size); !s.ok()) {
        return s;
      }
    }
    absl::Status extras = absl::OkStatus();
    if (f.source == DiscoverySource::kTorchrun) extras = ReadTorchrunExtras(env, &out);
    if (f.source == DiscoverySource::kSlurm) extras = ReadSlurmExtras(env, &out);
    if (!extras.ok()) return extras;
    return std::optional<LauncherRanks>(std::move(out));
  }
  return std::optional<LauncherRanks>();
}

}  // namespace tpudist::tpu_runtime
