// The environment each process of a slice would see, computed from a
// SliceSpec: the inverse of DiscoverRankInfo(). The tpurun launcher uses it
// to emulate a multi-host slice on one machine, so that every rank reads the
// same variables (KubeRay webhook, GKE, TorchTPU, torchrun) it would read on
// a real host.
//
// Pure functions; thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_SLICE_ENV_H_
#define TPU_DIST_TPU_RUNTIME_SLICE_ENV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime {

struct SliceEnvOptions {
  // Address/hostname of each emulated host, host index order. Empty means
  // "127.0.1.<h+1>" for host h (all of 127/8 is loopback on Linux, so each
  // emulated host gets a distinct address that really works).
  std::vector<std::string> hostnames;
  std::string master_addr;  // empty: hostnames[0]
  int master_port = 29500;
  int slicebuilder_base_port = 8471;  // TORCH_TPU_SLICEBUILDER_ADDRESSES ports
  std::string slice_name = "tpu-slice-0";  // TPU_NAME
  std::string job_id;                      // TPU_DIST_JOB_ID (empty: not set)
  int restart_count = 0;                   // TORCHELASTIC_RESTART_COUNT
};

// Parses a slice the way the launcher's flags give it, e.g.
// ("TPU-V6E", "4x4") -> v6e, 16 devices, 4 hosts x 4;
// ("tpu7x", "2x2x2") -> tpu7x, 8 chips x 2 chiplets, 2 hosts x 8.
// Errors name the argument, its value and what was expected.
absl::StatusOr<SliceSpec> SliceSpecFromFlags(absl::string_view accelerator_type,
                                             absl::string_view topology);

// The full environment of global rank `rank` of `spec`: TPU_WORKER_ID,
// TPU_WORKER_HOSTNAMES, TPU_NAME, TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY,
// TORCH_TPU_TOPOLOGY, TORCH_TPU_SLICEBUILDER_ADDRESSES,
// RAY_TPU_RESOURCE_PER_CHIP (tpu7x), MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,
// TORCHELASTIC_RESTART_COUNT, TPU_DIST_JOB_ID.
// DiscoverRankInfo(SliceEnvironment(spec, r, o)) reproduces rank r.
// REQUIRES: 0 <= rank < spec.num_devices().
absl::StatusOr<EnvMap> SliceEnvironment(const SliceSpec& spec, int rank,
                                        const SliceEnvOptions& options);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_SLICE_ENV_H_
