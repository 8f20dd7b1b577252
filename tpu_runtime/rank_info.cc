#include "tpu_runtime/rank_info.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::tpu_runtime {

bool SliceSpec::operator==(const SliceSpec& o) const {
  return accelerator_type == o.accelerator_type && chip_topology == o.chip_topology &&
         chiplets_per_chip == o.chiplets_per_chip && process_topology == o.process_topology &&
         num_hosts == o.num_hosts && devices_per_host == o.devices_per_host &&
         slice_name == o.slice_name;
}

const char* DiscoverySourceName(DiscoverySource source) {
  switch (source) {
    case DiscoverySource::kKubeRayTpu: return "kuberay-tpu";
    case DiscoverySource::kTorchTpu: return "torch-tpu";
    case DiscoverySource::kTorchrun: return "torchrun";
    case DiscoverySource::kMpi: return "mpi";
    case DiscoverySource::kSlurm: return "slurm";
    case DiscoverySource::kSingleProcess: return "single-process";
  }
  return "unknown";
}

const std::string& RankInfo::slicebuilder_address() const {
  static const std::string* const kEmpty = new std::string();
  if (rank < 0 || rank >= static_cast<int>(slicebuilder_addresses.size())) return *kEmpty;
  return slicebuilder_addresses[rank];
}

bool RankInfo::operator==(const RankInfo& o) const {
  return rank == o.rank && world_size == o.world_size && local_rank == o.local_rank &&
         local_world_size == o.local_world_size && host_index == o.host_index &&
         num_hosts == o.num_hosts && master_addr == o.master_addr &&
         master_port == o.master_port && hostnames == o.hostnames &&
         slicebuilder_addresses == o.slicebuilder_addresses && slice == o.slice &&
         source == o.source && restart_count == o.restart_count && job_id == o.job_id;
}

std::string ToString(const RankInfo& info) {
  std::string topo = info.slice.chip_topology.empty()
                         ? std::string("-")
                         : absl::StrJoin(info.slice.chip_topology, "x");
  return absl::StrCat("rank ", info.rank, "/", info.world_size, " local ", info.local_rank, "/",
                      info.local_world_size, " host ", info.host_index, "/", info.num_hosts, " (",
                      info.slice.accelerator_type, " ", topo, ", ",
                      DiscoverySourceName(info.source), ")");
}

}  // namespace tpudist::tpu_runtime
