// The one call that gives a C++ trainer a ready torch 2.x process group.
//
// In torch 2.x a c10d::ProcessGroup is a front end that dispatches each op to
// the c10d::Backend registered for the tensors' device; Python's
// init_process_group builds one around the backend it creates. These
// functions do the same in C++:
//
//   auto pg = NewTpuDistProcessGroup(store, rank, world, options);
//   pg->allreduce(tensors)->wait();       // runs on ProcessGroupTpuDist
//
// Everything above collectives/ (DeviceMesh, DTensor, FullyShard, trainers)
// takes a c10d::ProcessGroup, so tpu_dist and Gloo are interchangeable there.
//
// Construction is collective (all ranks, same store, same group name) and
// throws c10::Error on failure, as the backends' constructors do. The returned
// group owns its backend. Thread-safety: as the backend's.
#ifndef TPU_DIST_COLLECTIVES_PROCESS_GROUP_FACTORY_H_
#define TPU_DIST_COLLECTIVES_PROCESS_GROUP_FACTORY_H_

#include <chrono>
#include <string>

#include "collectives/process_group_tpu_dist.h"
#include "torch/csrc/distributed/c10d/Backend.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

// Wraps `backend` (CPU; tpu_dist, Gloo or any other c10d::Backend) in a
// c10d::ProcessGroup over `store` named `group_name`. REQUIRES: backend
// non-null.
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    const c10::intrusive_ptr<c10d::Backend>& backend,
    const std::string& group_name);

// A process group whose CPU backend is a new ProcessGroupTpuDist(store, rank,
// size, options); named options.group_name.
c10::intrusive_ptr<c10d::ProcessGroup> NewTpuDistProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    ProcessGroupTpuDist::Options options);

// The same for torch's own Gloo backend (the oracle, and --backend=gloo):
// one TCP device bound to `hostname` (an address or name of this host).
c10::intrusive_ptr<c10d::ProcessGroup> NewGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::string& hostname, std::chrono::milliseconds timeout,
    const std::string& group_name = "gloo", int threads = 2);

// The Backend behind a group made by the functions above (for backend-only
// API such as ProcessGroupTpuDist::status()); null if it is not tpu_dist.
c10::intrusive_ptr<ProcessGroupTpuDist> TpuDistBackendOf(
    const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_PROCESS_GROUP_FACTORY_H_
