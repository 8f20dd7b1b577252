// Which ranks of a group share a host and which share a slice, computed from
// the (host id, slice id) that every member publishes through the group's
// store (never from the job's LOCAL_WORLD_SIZE), and which address a rank
// binds for the inter-host (TCP) path. The process group uses the layout's
// Locality to choose shm-only (one host), the hierarchical shm + TCP backend
// (hosts of one slice, hierarchical_backend.h) or the slice backend (shm +
// intra-slice TCP + DCN, slice_backend.h).
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
  // Slices in order of their lowest rank; slices[s] lists its group ranks in
  // ascending order (a rank's position there is its in-slice position).
  std::vector<std::vector<int>> slices;
  std::vector<int> slice_of_rank;  // [world] index into slices
  std::vector<int> slice_index;    // [world] position within its slice

  bool single_host() const { return hosts.size() <= 1; }
  int num_hosts() const { return static_cast<int>(hosts.size()); }
  int num_slices() const { return static_cast<int>(slices.size()); }
  // Every slice holds the same number of the group's ranks (the DCN rails
  // between ranks of equal in-slice position exist).
  bool uniform_slices() const;
};

// The link class a group's collectives need, from its members' placement.
enum class Locality {
  kShm,       // one host: shared memory only
  kIntraSlice,  // several hosts of one slice: shm + TCP (ICI stand-in)
  kDcn,       // several slices: shm + intra-slice TCP + DCN between slices
};
Locality LocalityOf(const HostLayout& layout);
const char* LocalityName(Locality locality);  // "shm", "intra_slice", "dcn"

// Groups ranks by identical (slice id, host id): host_ids[r] / slice_ids[r]
// are rank r's; slice_ids empty (or all equal) = one slice. A host id seen
// in two slices names two hosts (hosts never span slices).
// REQUIRES: slice_ids empty or of host_ids' size.
HostLayout ComputeHostLayout(absl::Span<const std::string> host_ids,
                             absl::Span<const int> slice_ids = {});

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
