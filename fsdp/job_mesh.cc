#include "fsdp/job_mesh.h"

#include <utility>

#include "absl/time/time.h"

namespace tpudist::fsdp {

absl::StatusOr<DeviceMesh> InitJobDeviceMesh(const distributed::Job& job, JobMeshSpec spec) {
  DeviceMeshEnv env;
  env.rank = job.info().rank;
  env.world_size = job.info().world_size;
  env.store = job.store();
  env.group_factory = job.group_factory();
  env.mesh_name = std::move(spec.mesh_name);
  env.collective_timeout = absl::FromChrono(job.group_config().timeout);
  return InitDeviceMesh(spec.device_type, std::move(spec.shape), std::move(spec.dim_names), env);
}

}  // namespace tpudist::fsdp
