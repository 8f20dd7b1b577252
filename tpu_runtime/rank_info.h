// RankInfo and SliceSpec: who this process is inside a (possibly emulated)
// TPU slice, as discovered from the environment a launcher gives.
//
// Both are plain values: copyable, comparable, no hidden state, safe to share
// read-only across threads. They are produced by DiscoverRankInfo()
// (tpu_runtime/env_discovery.h) and by the tpurun launcher
// (tpu_runtime/launcher/), and consumed by the coordination service,
// the tpu_dist process group and DeviceMesh.
#ifndef TPU_DIST_TPU_RUNTIME_RANK_INFO_H_
#define TPU_DIST_TPU_RUNTIME_RANK_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tpudist::tpu_runtime {

// The physical shape of a slice. Example values for the two seed slices:
//
//   v6e 4x4:    accelerator "v6e",   chip_topology {4,4},   chiplets 1,
//               process_topology {4,4,1}, 16 devices, 4 hosts x 4.
//   TPU7x 2x2x2: accelerator "tpu7x", chip_topology {2,2,2}, chiplets 2,
//               process_topology {2,2,2,2}, 16 devices, 2 hosts x 8.
struct SliceSpec {
  // Normalized generation name: "v4", "v5e", "v5p", "v6e", "tpu7x", or "cpu"
  // when nothing TPU-like was found (plain torchrun / mpirun jobs), or "tpu"
  // when only TORCH_TPU_TOPOLOGY describes the slice (generation unknown;
  // chip_topology is then the first 3 process dims).
  std::string accelerator_type;
  // Chips per axis, as in GKE's TPU_TOPOLOGY "4x4" / "2x2x2". Empty for cpu.
  std::vector<int> chip_topology;
  // Devices (one process each) per chip: 2 on TPU7x (RAY_TPU_RESOURCE_PER_CHIP
  // or the 4th TORCH_TPU_TOPOLOGY dim), else 1.
  int chiplets_per_chip = 1;
  // TORCH_TPU_TOPOLOGY in process units: chip_topology padded to 3 dims,
  // with chiplets_per_chip appended as a 4th dim when it is > 1.
  std::vector<int> process_topology;
  int num_hosts = 1;
  int devices_per_host = 1;  // processes per host
  // TPU_NAME (the KubeRay "<group>-<replica>"), or "" when unknown.
  std::string slice_name;

  int num_devices() const { return num_hosts * devices_per_host; }
  bool operator==(const SliceSpec& o) const;
  bool operator!=(const SliceSpec& o) const { return !(*this == o); }
};

// Where a RankInfo came from, for logs and error messages.
enum class DiscoverySource {
  kKubeRayTpu,  // TPU_WORKER_ID / TPU_WORKER_HOSTNAMES (+ GKE variables)
  kTorchTpu,    // TORCH_TPU_TOPOLOGY / TORCH_TPU_SLICEBUILDER_ADDRESSES
  kTorchrun,    // RANK / WORLD_SIZE / LOCAL_RANK (torchrun, Ray Train)
  kMpi,         // OMPI_COMM_WORLD_* / PMI_RANK
  kSlurm,       // SLURM_PROCID / SLURM_NTASKS
  kSingleProcess,  // nothing found: world of one
};
const char* DiscoverySourceName(DiscoverySource source);

// One process's place in the job. A job may span several slices joined by
// the data-centre network (MEGASCALE_*, tpu_runtime/megascale_env.h); ranks
// and hosts are then numbered slice-major: rank = slice_index x
// devices_per_slice() + rank_in_slice(), host_index = slice_index x
// hosts_per_slice() + host_in_slice().
struct RankInfo {
  int rank = 0;              // global rank, 0 <= rank < world_size
  int world_size = 1;        // every device of every slice
  int local_rank = 0;        // index among the processes of this host
  int local_world_size = 1;  // processes on this host
  // Job-wide host index, 0 <= host_index < num_hosts; within one slice it is
  // TPU_WORKER_ID. Two ranks share a host (shared memory) iff equal.
  int host_index = 0;
  int num_hosts = 1;         // hosts of every slice
  int slice_index = 0;       // MEGASCALE_SLICE_ID, 0 <= slice_index < num_slices
  int num_slices = 1;        // MEGASCALE_NUM_SLICES
  // "host:port" of the multi-slice coordinator (MEGASCALE_COORDINATOR_ADDRESS
  // + MEGASCALE_PORT), or "" for a single-slice job that names none.
  std::string megascale_coordinator;
  std::string master_addr = "127.0.0.1";  // where rank 0 hosts rendezvous
  int master_port = 29500;
  // Hostname or address of every host of THIS slice, host_in_slice() order
  // (TPU_WORKER_HOSTNAMES); may be empty where unknown.
  std::vector<std::string> hostnames;
  // One "host:port" per device of this slice, rank_in_slice() order
  // (TORCH_TPU_SLICEBUILDER_ADDRESSES).
  std::vector<std::string> slicebuilder_addresses;
  SliceSpec slice;
  DiscoverySource source = DiscoverySource::kSingleProcess;
  // How many times the launcher restarted the group (TORCHELASTIC_RESTART_COUNT
  // or TPU_DIST_RESTART_COUNT); 0 on the first run.
  int restart_count = 0;
  // Identifies the job for the coordination service and shm segment names
  // (TPU_DIST_JOB_ID, TORCHELASTIC_RUN_ID, else derived from master addr:port).
  std::string job_id;

  int devices_per_slice() const { return world_size / num_slices; }
  int hosts_per_slice() const { return num_hosts / num_slices; }
  int rank_in_slice() const { return rank % devices_per_slice(); }
  int host_in_slice() const { return host_index % hosts_per_slice(); }
  // This host's name (hostnames[host_in_slice()]), or "" when unknown.
  const std::string& hostname() const;
  // This device's slicebuilder address, or "" when none are known.
  const std::string& slicebuilder_address() const;
  bool operator==(const RankInfo& o) const;
  bool operator!=(const RankInfo& o) const { return !(*this == o); }
};

// One line, for logs: "rank 3/16 local 3/4 host 0/4 (v6e 4x4, kuberay-tpu)";
// with several slices "rank 19/32 local 3/4 host 4/8 slice 1/2 (...)".
std::string ToString(const RankInfo& info);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_RANK_INFO_H_
