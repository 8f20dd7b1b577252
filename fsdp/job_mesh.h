// InitJobDeviceMesh: a DeviceMesh over every rank of a distributed::Job --
// the one DeviceMesh set-up of the entry points (examples, the trainer, the
// bench programs).
//
//   absl::StatusOr<DeviceMesh> mesh =
//       InitJobDeviceMesh(job, {"tpu", {world / tp, tp}, {"dp", "tp"}, "finetune_dp"});
//
// The mesh's groups come from job.group_factory() (distributed/job.h): the
// job's backend and group options, the group names GroupNameFor(base,
// ranks), and the job owns them (a job error aborts them). Its keys live in
// job.store() under spec.mesh_name; every collective DTensor code issues on it
// has the job's group timeout as deadline.
//
// A target of its own (tpu_dist::fsdp_job): fsdp itself stays on the abstract
// c10d::ProcessGroup and links neither distributed/ nor collectives/.
// Collective: every rank of the job calls it with the same spec.
// Thread-safety: as InitDeviceMesh.
#ifndef TPU_DIST_FSDP_JOB_MESH_H_
#define TPU_DIST_FSDP_JOB_MESH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/job.h"
#include "fsdp/device_mesh.h"

namespace tpudist::fsdp {

struct JobMeshSpec {
  std::string device_type = "cpu";
  std::vector<int64_t> shape;  // product == the job's world size
  std::vector<std::string> dim_names;
  std::string mesh_name = "device_mesh";  // store key prefix; distinct per mesh
};

absl::StatusOr<DeviceMesh> InitJobDeviceMesh(const distributed::Job& job, JobMeshSpec spec);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_JOB_MESH_H_
