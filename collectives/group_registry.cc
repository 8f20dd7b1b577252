#include "collectives/group_registry.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collectives/process_group_tpu_dist.h"

namespace tpudist::collectives {
namespace {

struct Registry {
  absl::Mutex mu;
  std::vector<ProcessGroupTpuDist*> groups ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used at exit
  return *registry;
}

}  // namespace

void RegisterGroup(ProcessGroupTpuDist* group) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.groups.push_back(group);
}

void UnregisterGroup(ProcessGroupTpuDist* group) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.groups.erase(std::remove(r.groups.begin(), r.groups.end(), group), r.groups.end());
}

int AbortAllGroups(const absl::Status& cause) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  for (ProcessGroupTpuDist* group : r.groups) group->Abort(cause);
  return static_cast<int>(r.groups.size());
}

int StopAllGroupThreads() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  int not_stopped = 0;
  for (ProcessGroupTpuDist* group : r.groups) {
    if (!group->StopThreads()) ++not_stopped;
  }
  return not_stopped;
}

std::function<void(const absl::Status&)> AbortAllGroupsCallback() {
  return [](const absl::Status& error) {
    AbortAllGroups(absl::Status(error.code(), absl::StrCat("job failed: ", error.message())));
  };
}

}  // namespace tpudist::collectives
