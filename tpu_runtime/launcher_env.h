// Reads the rank variables a generic launcher exports: torchrun / Ray Train
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,
// GROUP_WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*), MPICH/Intel MPI (PMI_RANK,
// PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS) and SLURM (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
// SLURM_LAUNCH_NODE_IPADDR). Part of DiscoverRankInfo() (env_discovery.h);
// pure and thread-safe.
//
// The first family that has both a rank and a world size wins, in the order
// torchrun, Open MPI, PMI, SLURM; the others are then ignored.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_ENV_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_ENV_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime {

// One optional integer with the variable it came from (for messages).
struct NamedInt {
  int value = 0;
  std::string var;  // e.g. "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"
};

struct LauncherRanks {
  DiscoverySource source = DiscoverySource::kTorchrun;  // kTorchrun, kMpi or kSlurm
  NamedInt rank;        // 0 <= rank < world_size (checked)
  NamedInt world_size;  // >= 1
  std::optional<NamedInt> local_rank;
  std::optional<NamedInt> local_world_size;  // >= 1
  std::optional<NamedInt> host_index;        // GROUP_RANK / NODE_RANK / SLURM_NODEID
  std::optional<NamedInt> num_hosts;         // GROUP_WORLD_SIZE / SLURM_NNODES
  // SLURM_LAUNCH_NODE_IPADDR: used as MASTER_ADDR when that is unset.
  std::optional<std::string> master_addr_hint;
};

// nullopt when no family has a rank; errors (naming the variable and value)
// on malformed numbers, a rank without its world size or the reverse,
// rank >= world size, GROUP_RANK != NODE_RANK, and SLURM task counts that
// are not the same on every node.
absl::StatusOr<std::optional<LauncherRanks>> ReadLauncherRanks(const EnvMap& env);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_ENV_H_
