// GroupConfig: everything a process group needs, resolved from who this
// process is (RankInfo), its environment (an EnvMap snapshot) and the
// caller's explicit choices (GroupInitOptions). The pure half of
// InitProcessGroup (init_process_group.h), and the only code that reads the
// environment for a group: collectives/ takes explicit values only.
//
// Rules (explicit option > environment > RankInfo > built-in default):
//   host id       options.host_id > TPU_DIST_HOST_ID > "slice_host_<h>" with
//                 h = RankInfo::host_index > "" (ProcessGroupTpuDist:
//                 hostname/boot id). The placement is RankInfo's field; the
//                 string is only the key the ranks exchange.
//   slice id      RankInfo::slice_index > -1 (unknown: slice 0)
//   job id        options.job_id > TPU_DIST_JOB_ID > RankInfo::job_id, with
//                 "_a<k>" appended on restart k > 0 > ""
//   bind address  options.bind_address > TPU_DIST_BIND_ADDRESS > "" (derived
//                 by collectives' ResolveBindAddress from worker_hostname)
//   worker host   RankInfo's hostnames[host_index] > ""
//   job secret    TPU_DIST_JOB_SECRET / TPU_DIST_JOB_SECRET_FILE > none
//   flight rec.   TPU_DIST_FLIGHT_RECORDER_SIZE entries per group (0: off) >
//                 2000; dumps to TPU_DIST_FLIGHT_RECORDER_DIR/tpu_dist_fr_rank_<r>
//                 > TORCH_FR_DUMP_TEMP_FILE<r> > none (docs/fault_tolerance.md)
//   store         options.store (given) > TCPStore at MASTER_ADDR:MASTER_PORT
//                 > RankInfo's master_addr:master_port
//   gloo address  bind address (unless a wildcard) > worker host >
//                 "127.0.0.1"
//   group names   GroupNameFor(options.group_name, ranks)
// Errors are InvalidArgument naming the variable (MASTER_PORT="x": ...).
// No TPU_* / MEGASCALE_* hardware variable is read here: discovery
// (tpu_runtime/env_discovery.h) reads them into the RankInfo, which is the
// one source of placement once it exists. Without a RankInfo (a thread or
// fork harness, a Python group made without info=) a group knows no slice
// placement: pass the RankInfo to get one.
//
// Thread-safety: pure functions of their arguments (a
// TPU_DIST_JOB_SECRET_FILE is read from disk).
#ifndef TPU_DIST_DISTRIBUTED_GROUP_CONFIG_H_
#define TPU_DIST_DISTRIBUTED_GROUP_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/process_group_tpu_dist.h"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::distributed {

enum class BackendKind { kTpuDist, kGloo };

// "tpu_dist" or "gloo" (the binaries' --backend values); InvalidArgument
// naming `name` otherwise.
absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name);
const char* BackendKindName(BackendKind kind);

// What the caller (flags, a test harness) decides. Empty strings are derived
// by the rules in the file comment.
struct GroupInitOptions {
  std::string backend = "tpu_dist";  // "tpu_dist" | "gloo"
  // Base of every group name (see GroupNameFor); namespaces store keys.
  std::string group_name = "default";
  absl::Duration timeout = absl::Minutes(5);  // per op, and store waits
  std::string host_id;
  std::string job_id;
  std::string bind_address;
  int gloo_threads = 2;
  // The store all ranks rendezvous over (e.g. the coordination runtime's
  // store()); null: a TCPStore at the master address, hosted by rank 0.
  c10::intrusive_ptr<c10d::Store> store;
};

// Where the store comes from when GroupInitOptions::store is null.
struct TcpStoreSpec {
  std::string master_addr;
  int master_port = 0;
  bool is_server = false;  // rank 0 hosts it
  int world_size = 1;
};

struct GroupConfig {
  BackendKind backend = BackendKind::kTpuDist;
  std::string group_name;  // the base name
  // Fully resolved tpu_dist options (group_name = the base name; timeout).
  collectives::ProcessGroupTpuDist::Options tpu_dist;
  std::string gloo_hostname;  // address the Gloo device binds
  int gloo_threads = 2;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> given_store;  // options.store
  TcpStoreSpec tcp_store;                       // used when given_store is null
};

// Resolves the rules above. `info` may be null (a process without
// discovery: thread/fork test harnesses, a Python group made without info=).
absl::StatusOr<GroupConfig> ResolveGroupConfig(const tpu_runtime::RankInfo* info,
                                               const tpu_runtime::EnvMap& env,
                                               const GroupInitOptions& options);

// The one group-naming rule: "<base>_<r0>_<r1>_..." for the global ranks of
// the group (DeviceMesh subgroups and the world group alike), or, when that
// would exceed 64 characters, "<base>_n<size>_<hash of the ranks>".
std::string GroupNameFor(absl::string_view base, absl::Span<const int> global_ranks);

}  // namespace tpudist::distributed

#endif  // TPU_DIST_DISTRIBUTED_GROUP_CONFIG_H_
