#include "collectives/process_group_factory.h"

#include <utility>

#include "collectives/generation_store.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace tpudist::collectives {

c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    const c10::intrusive_ptr<c10d::Backend>& backend,
    const std::string& group_name) {
  TORCH_CHECK(backend, "tpu_dist: WrapBackend: null backend");
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(),
                                                    backend->getSize());
  const auto type = backend->getBackendName() == "gloo"
                        ? c10d::ProcessGroup::BackendType::GLOO
                        : c10d::ProcessGroup::BackendType::CUSTOM;
  pg->setBackend(c10::DeviceType::CPU, type, backend);
  pg->setDefaultBackend(type);
  pg->setGroupName(group_name);
  return pg;
}

c10::intrusive_ptr<c10d::ProcessGroup> NewTpuDistProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    ProcessGroupTpuDist::Options options) {
  const std::string name = options.group_name;
  auto backend = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, size,
                                                          std::move(options));
  return WrapBackend(store, backend, name);
}

c10::intrusive_ptr<c10d::ProcessGroup> NewGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::string& hostname, std::chrono::milliseconds timeout,
    const std::string& group_name, int threads) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->threads = threads;
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  // Gloo's rendezvous keys ("rank_<r>" per context) live at its store's top
  // level: each group gets its own namespace (generation_store.h).
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
      GenerationStore(store, "gloo", group_name, rank), rank, size, opts);
  return WrapBackend(store, backend, group_name);
}

c10::intrusive_ptr<ProcessGroupTpuDist> TpuDistBackendOf(
    const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  if (!pg || !pg->hasBackendForDeviceType(c10::DeviceType::CPU)) return {};
  c10::intrusive_ptr<c10d::Backend> b = pg->getBackend(c10::DeviceType::CPU);
  auto* ours = dynamic_cast<ProcessGroupTpuDist*>(b.get());
  if (ours == nullptr) return {};
  return c10::intrusive_ptr<ProcessGroupTpuDist>::unsafe_reclaim_from_nonowning(ours);
}

}  // namespace tpudist::collectives
