// The live tpu_dist process groups of this process, so that one failure
// signal can abort them all.
//
// A job fails somewhere else (a peer hung, a rank reported an error, the
// coordination service lost a task): this process learns it from the
// coordination client's error callback, on a background thread, while its
// ranks may sit in a collective that would otherwise wait out its timeout.
// AbortAllGroups() fails the op in flight of every registered group within
// milliseconds, with an error carrying the cause:
//
//   coordination::RuntimeOptions ro;
//   ro.client.error_callback = collectives::AbortAllGroupsCallback();
//   auto runtime = coordination::StartOrConnect(info, ro);
//
// Every ProcessGroupTpuDist registers itself when constructed and leaves
// when destroyed (subgroups included).
//
// Thread-safety: all functions are thread-safe. AbortAllGroups() holds the
// registry lock while it aborts (each Abort only sets flags and shuts
// sockets down), so a group being destroyed waits for it and is never
// aborted after its destructor started.
#ifndef TPU_DIST_COLLECTIVES_GROUP_REGISTRY_H_
#define TPU_DIST_COLLECTIVES_GROUP_REGISTRY_H_

#include <functional>

#include "absl/status/status.h"

namespace tpudist::collectives {

class ProcessGroupTpuDist;

// Called by ProcessGroupTpuDist's constructor / destructor.
void RegisterGroup(ProcessGroupTpuDist* group);
void UnregisterGroup(ProcessGroupTpuDist* group);

// Aborts every live group with `cause` (see ProcessGroupTpuDist::Abort);
// groups created afterwards are not affected. Returns how many were aborted.
// REQUIRES: !cause.ok().
int AbortAllGroups(const absl::Status& cause);

// Interpreter exit (python/tpu_dist registers it with atexit): StopThreads()
// on every live group, so that no group thread is left to take the GIL while
// the interpreter finalizes. Returns how many groups' threads did not stop.
// Holds the registry lock throughout (a group destroyed meanwhile waits).
int StopAllGroupThreads();

// A coordination error callback (ClientOptions::error_callback) that aborts
// every group with the job error, prefixed "job failed: ".
std::function<void(const absl::Status&)> AbortAllGroupsCallback();

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_GROUP_REGISTRY_H_
