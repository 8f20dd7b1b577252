#include "distributed/init_process_group.h"

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectives/process_group_factory.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "tpu_runtime/env_discovery.h"

namespace tpudist::distributed {
namespace {

// c10d reports failures as exceptions; this layer returns Status.
template <typename F>
auto Catching(absl::string_view what, F&& f) -> absl::StatusOr<decltype(f())> {
  try {
    return f();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace

absl::StatusOr<GroupConfig> ResolveGroupConfigFromProcess(const tpu_runtime::RankInfo* info,
                                                          const GroupInitOptions& options) {
  return ResolveGroupConfig(info, tpu_runtime::EnvMapFromProcess(), options);
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> NewGroup(
    const GroupConfig& config, const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
    const std::vector<int>& global_ranks) {
  const int size = static_cast<int>(global_ranks.size());
  if (group_rank < 0 || group_rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewGroup: group rank ", group_rank, " of a group of ", size));
  }
  const std::string name = GroupNameFor(config.group_name, global_ranks);
  return Catching(absl::StrCat("creating ", BackendKindName(config.backend), " group '", name, "'"),
                  [&] {
                    if (config.backend == BackendKind::kGloo) {
                      return collectives::NewGlooProcessGroup(store, group_rank, size,
                                                              config.gloo_hostname, config.timeout,
                                                              name, config.gloo_threads);
                    }
                    collectives::ProcessGroupTpuDist::Options o = config.tpu_dist;
                    o.group_name = name;
                    // Flight-recorder dumps and messages name global ranks.
                    o.global_ranks.assign(global_ranks.begin(), global_ranks.end());
                    return collectives::NewTpuDistProcessGroup(store, group_rank, size, o);
                  });
}

GroupFactory MakeGroupFactory(GroupConfig config) {
  return [config = std::move(config)](const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                                      const std::vector<int>& global_ranks) {
    return NewGroup(config, store, group_rank, global_ranks);
  };
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> MakeStore(const GroupConfig& config) {
  if (config.given_store) return config.given_store;
  const TcpStoreSpec& spec = config.tcp_store;
  return Catching(
      absl::StrCat("TCPStore at MASTER_ADDR:MASTER_PORT ", spec.master_addr, ":", spec.master_port),
      [&]() -> c10::intrusive_ptr<c10d::Store> {
        c10d::TCPStoreOptions o;
        o.port = static_cast<uint16_t>(spec.master_port);
        o.isServer = spec.is_server;
        o.numWorkers = spec.world_size;
        o.timeout = config.timeout;
        return c10::make_intrusive<c10d::TCPStore>(spec.master_addr, o);
      });
}

absl::StatusOr<InitializedGroup> InitProcessGroup(const tpu_runtime::RankInfo& info,
                                                  const GroupInitOptions& options) {
  InitializedGroup g;
  absl::StatusOr<GroupConfig> config = ResolveGroupConfigFromProcess(&info, options);
  if (!config.ok()) return config.status();
  g.config = *std::move(config);
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store = MakeStore(g.config);
  if (!store.ok()) return store.status();
  g.store = *store;
  std::vector<int> world(info.world_size);
  for (int r = 0; r < info.world_size; ++r) world[r] = r;
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group =
      NewGroup(g.config, g.store, info.rank, world);
  if (!group.ok()) return group.status();
  g.group = *group;
  return g;
}

}  // namespace tpudist::distributed
