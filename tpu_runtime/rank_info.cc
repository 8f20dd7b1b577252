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

namespace {
const std::string& Empty() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}
}  // namespace

const std::string& RankInfo::hostname() const {
  if (num_slices < 1 || num_hosts < num_slices || host_index < 0 || host_index >= num_hosts) {
    return Empty();
  }
  const int h = host_in_slice();
  if (h < 0 || h >= static_cast<int>(hostnames.size())) return Empty();
  return hostnames[h];
}

const std::string& RankInfo::slicebuilder_address() const {
  if (num_slices < 1 || world_size < num_slices || rank < 0 || rank >= world_size) return Empty();
  const int r = rank_in_slice();
  if (r < 0 || r >= static_cast<int>(slicebuilder_addresses.size())) return Empty();
  return slicebuilder_addresses[r];
}

bool RankInfo::operator==(const RankInfo& o) const {
  return rank == o.rank && world_size == o.world_size && local_rank == o.local_rank &&
         local_world_size == o.local_world_size && host_index == o.host_index &&
         num_hosts == o.num_hosts && slice_index == o.slice_index &&
         num_slices == o.num_slices && megascale_coordinator == o.megascale_coordinator &&
         master_addr == o.master_addr &&
         master_port == o.master_port && hostnames == o.hostnames &&
         slicebuilder_addresses == o.slicebuilder_addresses && slice == o.slice &&
         source == o.source && restart_count == o.restart_count && job_id == o.job_id;
}

std::string ToString(const RankInfo& info) {
  std::string topo = info.slice.chip_topology.empty()
                         ? std::string("-")
                         : absl::StrJoin(info.slice.chip_topology, "x");
  return absl::StrCat("rank ", info.rank, "/", info.world_size, " local ", info.local_rank, "/",
                      info.local_world_size, " host ", info.host_index, "/", info.num_hosts,
                      info.num_slices > 1
                          ? absl::StrCat(" slice ", info.slice_index, "/", info.num_slices)
                          : std::string(),
                      " (",
                      info.slice.accelerator_type, " ", topo, ", ",
                      DiscoverySourceName(info.source), ")");
}

}  // namespace tpudist::tpu_runtime
