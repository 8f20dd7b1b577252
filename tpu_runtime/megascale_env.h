// MegascaleEnv: the multi-slice variables a launcher sets on every process of
// a job spanning several TPU slices joined by the data-centre network (DCN).
//
// Who sets them (the same four names everywhere):
//   - the KubeRay TPU webhook, per worker-group replica (= slice), only when
//     the pod spec names MEGASCALE_NUM_SLICES: MEGASCALE_SLICE_ID = replica
//     index, MEGASCALE_COORDINATOR_ADDRESS = "<group>-0-0.<cluster>-headless"
//     (":8081" appended on v7x), MEGASCALE_PORT = 8081;
//   - Ray (ray.util.tpu.get_tpu_coordinator_env_vars; Ray Train's TorchTrainer
//     for backend "tpu_dist"): the address carries the port, and
//     MEGASCALE_PORT is the base port + LOCAL_RANK (each worker's own port);
//   - tpurun --num-slices N (the emulation).
//
// Pure and thread-safe. Every error names the variable (env_parse.h's form).
#ifndef TPU_DIST_TPU_RUNTIME_MEGASCALE_ENV_H_
#define TPU_DIST_TPU_RUNTIME_MEGASCALE_ENV_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "tpu_runtime/env_map.h"

namespace tpudist::tpu_runtime {

// MEGASCALE_PORT when neither it nor the address names one (Ray's
// DEFAULT_MEGASCALE_PORT, the webhook's megascalePortBase).
inline constexpr int kDefaultMegascalePort = 8081;

struct MegascaleEnv {
  int num_slices = 1;   // MEGASCALE_NUM_SLICES, >= 1
  int slice_index = 0;  // MEGASCALE_SLICE_ID, 0 <= slice_index < num_slices
  // "host:port" of the multi-slice coordinator (slice 0's first host):
  // MEGASCALE_COORDINATOR_ADDRESS, its own port if it has one, else
  // MEGASCALE_PORT, else 8081. Empty only when num_slices == 1 and no
  // address was given.
  std::string coordinator;
  std::string coordinator_host;  // the host part of `coordinator`
};

// nullopt when no MEGASCALE_* variable is set. Otherwise the values, checked:
//   MEGASCALE_NUM_SLICES    required when any other MEGASCALE_* is set;
//   MEGASCALE_SLICE_ID      required when MEGASCALE_NUM_SLICES > 1, in
//                           0..num_slices-1 (default 0 for one slice);
//   MEGASCALE_COORDINATOR_ADDRESS  required when MEGASCALE_NUM_SLICES > 1;
//   MEGASCALE_PORT          1..65535 when set.
absl::StatusOr<std::optional<MegascaleEnv>> ReadMegascaleEnv(const EnvMap& env);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_MEGASCALE_ENV_H_
