// InitProcessGroup: the one way a C++ binary or test harness turns "who am
// I" (tpu_runtime::RankInfo) into a torch 2.x process group; the C++ twin of
// torch.distributed.init_process_group.
//
//   GroupInitOptions o;
//   o.backend = "tpu_dist";          // or "gloo"
//   o.group_name = "my_trainer";     // base of every group name
//   o.store = coord->store();        // or null: TCPStore at MASTER_ADDR:PORT
//   absl::StatusOr<InitializedGroup> g = InitProcessGroup(info, o);
//   g->group->allreduce(tensors)->wait();
//
// A DeviceMesh builds its own groups: hand it MakeGroupFactory(config),
// config from ResolveGroupConfigFromProcess (fsdp::DeviceMeshEnv::
// group_factory has the same type as GroupFactory).
//
// Every rule that turns the environment into group options (host id, job
// id, bind address, job secret, store address, group names) lives in
// group_config.h; this file only makes the store and the groups.
//
// Construction is collective (all ranks of a group call it). Errors are
// absl::Status: c10d's exceptions are caught and returned. Thread-safety:
// the functions may be called from any thread; the returned groups are as
// thread-safe as their backends.
#ifndef TPU_DIST_DISTRIBUTED_INIT_PROCESS_GROUP_H_
#define TPU_DIST_DISTRIBUTED_INIT_PROCESS_GROUP_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "distributed/group_config.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "tpu_runtime/rank_info.h"

namespace tpudist::distributed {

// Creates the process group of `global_ranks` for the caller, whose index in
// it is `group_rank`, over `store` (already namespaced for this group).
// Same type as fsdp::GroupFactory.
using GroupFactory = std::function<absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
    const std::vector<int>& global_ranks)>;

// ResolveGroupConfig over this process's environment (the only call that
// reads the real environment for a group).
absl::StatusOr<GroupConfig> ResolveGroupConfigFromProcess(const tpu_runtime::RankInfo* info,
                                                          const GroupInitOptions& options);

// A new group of config.backend over `store`, named
// GroupNameFor(config.group_name, global_ranks). REQUIRES: 0 <= group_rank <
// global_ranks.size().
absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroup(
    const GroupConfig& config, const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
    const std::vector<int>& global_ranks);

// NewGroup bound to `config` (copied).
GroupFactory MakeGroupFactory(GroupConfig config);

// The store `config` names: config.given_store, else a TCPStore at
// config.tcp_store (hosted by its is_server rank), waiting up to
// config.timeout for the world to join.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeStore(const GroupConfig& config);

struct InitializedGroup {
  GroupConfig config;
  c10::intrusive_ptr<c10d::Store> store;         // the rendezvous store
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // the world group
};

// The world group of this process (info.rank of info.world_size): resolves
// the config from the process environment, makes the store and the group.
absl::StatusOr<InitializedGroup> InitProcessGroup(const tpu_runtime::RankInfo& info,
                                                  const GroupInitOptions& options);

}  // namespace tpudist::distributed

#endif  // TPU_DIST_DISTRIBUTED_INIT_PROCESS_GROUP_H_
