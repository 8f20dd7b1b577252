// The DCN between emulated slices as a shaped link (tpurun --dcn-rate /
// --dcn-delay with --hosts-emulated --num-slices N > 1).
//
// Without shaping, emulated hosts are loopback addresses 127.0.<s+1>.<h+1> of
// the launcher's own network namespace, and every byte between slices moves
// as fast as one between hosts of a slice. With shaping, DcnLink builds:
//   * a namespace per slice, tpudcn<pid>s<s>, holding every host of that
//     slice: host h is 10.251.<s>.<h+1> on the slice's eth0 (traffic between
//     hosts of one slice stays on that namespace's lo: unshaped, as ICI);
//   * a namespace tpudcn<pid>b with bridge br0 joining the slices' eth0
//     (veth pairs): the DCN;
//   * on each slice's eth0 (its egress into the DCN): an htb qdisc at the
//     rate, and/or a netem qdisc with the delay. The rate is per slice, each
//     direction: all hosts of a slice share its link.
// Ranks run inside their slice's namespace (`ip netns exec`), so every byte a
// slice sends to another slice crosses its eth0, and eth0's tx_bytes counts
// them (TxBytes): the DCN bytes, measured by the kernel.
//
// The namespaces are deleted by the destructor; those of a launcher that
// died without it (SIGKILL) are removed by RemoveStaleDcnNamespaces, which
// tpurun runs before it builds its own. Needs root (CAP_NET_ADMIN,
// CAP_SYS_ADMIN) and iproute2; the delay needs the kernel's sch_netem.
//
// Thread-safety: the pure functions are; a DcnLink is used by one thread.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_DCN_LINK_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_DCN_LINK_H_

#include <stdint.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpudist::tpu_runtime::launcher {

struct DcnShape {
  std::string rate;                               // tc rate ("10gbit"); "" = unshaped
  absl::Duration delay = absl::ZeroDuration();  // zero = no added delay
  bool enabled() const { return !rate.empty() || delay > absl::ZeroDuration(); }
};

// Parses --dcn-rate / --dcn-delay ("" / 0 = off). The rate is a positive
// number and one of tc's bit units: bit, kbit, mbit, gbit, tbit (e.g.
// "10gbit", "2.5gbit"); the delay at most 10 s. Errors name the flag and
// value: `--dcn-rate="10 gb": expected ...`.
absl::StatusOr<DcnShape> ParseDcnShape(absl::string_view rate, absl::Duration delay);

// Shaping needs emulated slices: InvalidArgument naming the flag unless
// num_slices > 1, hosts_emulated and no explicit hostnames.
absl::Status CheckDcnShapeUsable(const DcnShape& shape, int num_slices, bool hosts_emulated,
                                 bool hostnames_given);

// Host h of slice s inside the shaped layout: "10.251.<s>.<h+1>".
std::string DcnHostAddress(int slice, int host);

// The names of a launcher's namespaces: tpudcn<pid>b, tpudcn<pid>s<s>.
std::string DcnBridgeNamespace(int pid);
std::string DcnSliceNamespace(int pid, int slice);

// The commands (argv) that build the layout, in order. Pure.
std::vector<std::vector<std::string>> DcnSetupCommands(int pid, int num_slices,
                                                       int hosts_per_slice,
                                                       const DcnShape& shape);

class DcnLink {
 public:
  // Builds the layout for this process (getpid()); on any failure removes
  // what it built and returns the failing command's stderr, naming the flag
  // whose qdisc failed (--dcn-delay when the kernel has no netem).
  static absl::StatusOr<std::unique_ptr<DcnLink>> Create(int num_slices, int hosts_per_slice,
                                                         const DcnShape& shape);
  ~DcnLink();  // deletes every namespace of the layout (and so its qdiscs)
  DcnLink(const DcnLink&) = delete;
  DcnLink& operator=(const DcnLink&) = delete;

  // Every host's address, slice-major (LaunchConfig::hostnames).
  std::vector<std::string> Hostnames() const;
  // `argv` run inside slice `slice`'s namespace.
  std::vector<std::string> WrapArgv(int slice, const std::vector<std::string>& argv) const;
  // Bytes slice `slice` has sent into the DCN (its eth0's tx_bytes).
  absl::StatusOr<int64_t> TxBytes(int slice) const;
  // "v6e DCN: 2 slices, 1gbit, delay 100us per slice link (namespaces tpudcn12s0..)".
  std::string Describe() const;

  static constexpr const char* kInterface = "eth0";  // each slice's DCN interface

 private:
  DcnLink(int pid, int num_slices, int hosts_per_slice, DcnShape shape);
  int pid_;
  int num_slices_;
  int hosts_per_slice_;
  DcnShape shape_;
};

// Deletes tpudcn<pid>* namespaces whose launcher process is gone.
void RemoveStaleDcnNamespaces();

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_DCN_LINK_H_
