// Reads the TPU side of an environment: GKE (TPU_ACCELERATOR_TYPE,
// TPU_TOPOLOGY), the KubeRay TPU webhook (TPU_WORKER_ID,
// TPU_WORKER_HOSTNAMES, TPU_NAME), Ray (RAY_TPU_RESOURCE_PER_CHIP) and
// TorchTPU (TORCH_TPU_TOPOLOGY, TORCH_TPU_SLICEBUILDER_ADDRESSES,
// TPU_VISIBLE_CHIPS). Part of DiscoverRankInfo() (env_discovery.h); pure and
// thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_TPU_ENV_H_
#define TPU_DIST_TPU_RUNTIME_TPU_ENV_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime {

// Default first slicebuilder port (the KubeRay webhook's tpuProcessPortBase
// and Ray's DEFAULT_TORCH_TPU_SLICEBUILDER_PORT); device l of a host uses
// kSlicebuilderBasePort + l.
inline constexpr int kSlicebuilderBasePort = 8471;

// What the TPU variables say, already cross-checked among themselves.
struct TpuEnv {
  // The slice. accelerator_type is "tpu" when only TORCH_TPU_TOPOLOGY names
  // it (no TPU_ACCELERATOR_TYPE): chip_topology is then the first 3 process
  // dims and the host layout comes from the host count (see ReadTpuEnv).
  SliceSpec slice;
  // Where the host layout came from, for messages, e.g.
  // "16 chips of TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host".
  std::string layout;
  // TPU_WORKER_HOSTNAMES, else the hosts of the slicebuilder addresses, else
  // empty. When non-empty, its size is slice.num_hosts.
  std::vector<std::string> hostnames;
  bool hostnames_given = false;  // hostnames came from the environment
  // TORCH_TPU_SLICEBUILDER_ADDRESSES as given (validated host:port entries,
  // distinct, one per device), or empty when unset.
  std::vector<std::string> slicebuilder_addresses;
  std::optional<int> worker_id;     // TPU_WORKER_ID, < slice.num_hosts
  std::optional<int> visible_chip;  // TPU_VISIBLE_CHIPS when a single index
  // kKubeRayTpu when TPU_WORKER_ID, TPU_WORKER_HOSTNAMES or TPU_TOPOLOGY is
  // set, else kTorchTpu.
  DiscoverySource source = DiscoverySource::kTorchTpu;
};

// True when any variable that ReadTpuEnv() uses to size a slice is set.
bool HasTpuEnv(const EnvMap& env);

// Reads and cross-checks the TPU variables. nullopt when HasTpuEnv() is
// false. `local_world_size_hint` (LOCAL_WORLD_SIZE) is only used to lay out
// a slice whose generation is unknown. Errors name the variable, its value
// and what was expected: malformed values, TPU_TOPOLOGY without
// TPU_ACCELERATOR_TYPE, TORCH_TPU_TOPOLOGY disagreeing with TPU_TOPOLOGY,
// hostname count != hosts of the topology, TPU_WORKER_ID >= hosts,
// slicebuilder count != devices, TPU_WORKER_ID without any topology.
absl::StatusOr<std::optional<TpuEnv>> ReadTpuEnv(const EnvMap& env,
                                                  std::optional<int> local_world_size_hint);

// host_h:base+l for every host h and local device l, rank order.
std::vector<std::string> DefaultSlicebuilderAddresses(const std::vector<std::string>& hostnames,
                                                      int devices_per_host, int base_port);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_TPU_ENV_H_
