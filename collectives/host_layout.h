// Which ranks of a group share a host, computed from the host ids that every
// rank publishes through the store, and which address a rank binds for the
// inter-host (TCP) path. The process group uses the layout to choose shm-only
// (one host) or the hierarchical shm + TCP backend (hierarchical_backend.h).
//
// Thread-safety: pure functions / value types.
#ifndef TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_
#define TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
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

// This process's host id: `configured` if non-empty, else
// "<hostname>/<boot_id>" (boot_id from /proc/sys/kernel/random/boot_id).
// Emulated hosts on one machine (network namespaces) share the boot id, so
// they must be given distinct ids (distributed/group_config.h reads
// TPU_DIST_HOST_ID for them). Reads no environment variable.
std::string DefaultHostId(const std::string& configured);

// Where this rank's TCP listeners bind and what peers dial.
struct BindAddress {
  std::string bind;       // numeric IPv4/IPv6
  std::string advertise;  // "" = bind
};

// The inter-host address of this process, first match wins. Listeners bind
// the one address peers dial, never every interface unless asked to:
//   1. `configured` (Options::bind_address; distributed/group_config.h fills
//      it from TPU_DIST_BIND_ADDRESS) if non-empty; "0.0.0.0" / "::" mean
//      every interface, advertising the address rules 2-4 find (127.0.0.1
//      if none);
//   2. `worker_hostname` (this host's entry of the slice's host list,
//      RankInfo's hostnames[host_index]): if it is a numeric IP, bound;
//      if it is a name that resolves (KubeRay's pod names), its first IPv4
//      address;
//   3. `host_id` if it is a numeric IP (tpurun --hosts-emulated sets
//      TPU_DIST_HOST_ID=127.0.1.<h+1>, the emulated host's own address);
//   4. the first IPv4 address gethostname() resolves to; 127.0.0.1 if it
//      resolves to nothing.
// FailedPrecondition when the name of rule 2 or 4 resolves to an address
// this host does not own (NAT, a stale /etc/hosts): the message names the
// name, the address and TPU_DIST_BIND_ADDRESS (set it to a local address, or
// to 0.0.0.0 to listen everywhere and advertise the resolved one). Reads no
// environment variable.
absl::StatusOr<BindAddress> ResolveBindAddress(const std::string& configured,
                                               const std::string& worker_hostname,
                                               const std::string& host_id);

// True if `s` parses as a numeric IPv4 or IPv6 address. Pure.
bool IsNumericAddress(const std::string& s);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_HOST_LAYOUT_H_
