// Which ranks of a group share a host, computed from the host ids that every
// rank publishes through the store. The hierarchical path (intra-host shm
// reduce -> inter-host TCP among leaders -> intra-host broadcast) is planned
// on this layout; today the process group uses it to decide shm-only vs
// "spans hosts" (Unimplemented until the TCP path is integrated).
//
// Thread-safety: pure functions / value types.
#ifndef TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_
#define TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/types/span.h"

namespace tpudist::collectives {

struct HostLayout {
  // Hosts in order of their lowest rank; hosts[h] lists its group ranks in
  // ascending order.
  std::vector<std::vector<int>> hosts;
  std::vector<int> host_of_rank;   // [world] index into hosts
  std::vector<int> local_index;    // [world] position within its host
  std::vector<int> leaders;        // [num hosts] hosts[h][0]

  bool single_host() const { return hosts.size() <= 1; }
  int num_hosts() const { return static_cast<int>(hosts.size()); }
};

// Groups ranks by identical host id. host_ids[r] is rank r's id.
HostLayout ComputeHostLayout(absl::Span<const std::string> host_ids);

// This process's host id: `configured` if non-empty, else env
// TPU_DIST_HOST_ID, else "<hostname>/<boot_id>" (boot_id from
// /proc/sys/kernel/random/boot_id). Emulated hosts on one machine (network
// namespaces) share the boot id, so they must set TPU_DIST_HOST_ID.
std::string DefaultHostId(const std::string& configured);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_
