// DiscoverRankInfo: who this process is, from the variables a launcher
// exported. Handles torchrun and Ray Train, the KubeRay TPU webhook + GKE,
// TorchTPU, Open MPI / PMI, SLURM, and nothing at all (a world of one).
// docs/runtime.md has the full table, with the two seed slices worked out.
//
// Precedence, per value (the first source present wins; "checked" means a
// lower source that is also present must agree, else an error):
//
//   slice shape   TPU_TOPOLOGY + TPU_ACCELERATOR_TYPE (+ RAY_TPU_RESOURCE_PER_CHIP),
//                 else TORCH_TPU_TOPOLOGY (checked against the former).
//   rank, world   RANK/WORLD_SIZE (torchrun, Ray Train: authoritative),
//                 else OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/PMI_SIZE,
//                 else SLURM_PROCID/SLURM_NTASKS,
//                 else TPU: rank = TPU_WORKER_ID x devices_per_host + local
//                 rank, world = devices of the slice,
//                 else 0 / 1. On a TPU slice WORLD_SIZE is checked against
//                 the slice and RANK against TPU_WORKER_ID.
//   local rank    the launcher family's own variable (LOCAL_RANK,
//                 OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID),
//                 else rank % local_world_size; without a launcher rank, on
//                 TPU: LOCAL_RANK, else TPU_VISIBLE_CHIPS (one index), else 0
//                 only when a host has a single device, else an error.
//   local world   TPU devices_per_host (checked against LOCAL_WORLD_SIZE),
//                 else LOCAL_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE /
//                 MPI_LOCALNRANKS / SLURM_NTASKS/SLURM_NNODES,
//                 else WORLD_SIZE / GROUP_WORLD_SIZE, else 1 (each process
//                 its own host: always correct, never uses shared memory).
//   host index    rank / local_world_size (ranks are host-major), checked
//                 against TPU_WORKER_ID, GROUP_RANK, NODE_RANK, SLURM_NODEID.
//   hostnames     TPU_WORKER_HOSTNAMES, else the hosts of
//                 TORCH_TPU_SLICEBUILDER_ADDRESSES, else {master_addr} on one
//                 host, else empty (non-TPU multi-host: unknown).
//   master addr   MASTER_ADDR, else hostnames[0] (the full name: it must
//                 resolve), else SLURM_LAUNCH_NODE_IPADDR, else 127.0.0.1.
//   master port   MASTER_PORT, else 29500.
//   slicebuilder  TORCH_TPU_SLICEBUILDER_ADDRESSES (one per device, distinct),
//                 else on TPU hostnames[h]:8471+l, else empty.
//   restart count TPU_DIST_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT, else 0.
//   job id        TPU_DIST_JOB_ID, else TORCHELASTIC_RUN_ID unless "none",
//                 else "<master_addr>:<master_port>".
//   source        kKubeRayTpu if TPU_WORKER_ID / TPU_WORKER_HOSTNAMES /
//                 TPU_TOPOLOGY, else kTorchTpu if TORCH_TPU_*, else the
//                 launcher family, else kSingleProcess.
//
// TPU_DIST_HOST_ID (set by SliceEnvironment) is checked to equal
// hostnames[host_index] when hostnames came from the environment.
//
// Every inconsistency or malformed value is an absl::InvalidArgumentError
// that names the variable, its value and what was expected, e.g.
//   WORLD_SIZE="8": expected 16, the devices of the TPU slice (16 chips of
//   TPU_TOPOLOGY="4x4" on v6e / 4 chips per host)
#ifndef TPU_DIST_TPU_RUNTIME_ENV_DISCOVERY_H_
#define TPU_DIST_TPU_RUNTIME_ENV_DISCOVERY_H_

#include "absl/status/statusor.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime {

// Pure: the RankInfo that `env` describes. Thread-safe.
absl::StatusOr<RankInfo> DiscoverRankInfo(const EnvMap& env);

// A copy of this process's environment (`environ`). The only impure function
// of tpu_runtime; not safe against a concurrent setenv() in another thread.
EnvMap EnvMapFromProcess();

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_ENV_DISCOVERY_H_
