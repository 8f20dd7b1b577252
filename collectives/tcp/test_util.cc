#include "collectives/tcp/test_util.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tpudist::collectives::tcp::testing {

void RunRanks(int world, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::vector<std::unique_ptr<TcpMesh>>> ConnectAll(c10d::Store& store, int world,
                                                                 const TcpMeshOptions& options) {
  std::vector<std::unique_ptr<TcpMesh>> meshes(world);
  absl::Mutex mu;
  absl::Status first;
  RunRanks(world, [&](int rank) {
    absl::StatusOr<std::unique_ptr<TcpMesh>> mesh = TcpMesh::Connect(store, rank, world, options);
    absl::MutexLock lock(&mu);
    if (mesh.ok()) {
      meshes[rank] = std::move(*mesh);
    } else if (first.ok()) {
      first = mesh.status();
    }
  });
  if (!first.ok()) return first;
  return meshes;
}

std::string UniqueKey(const std::string& prefix) {
  static std::atomic<int> counter{0};  // Test-only helper state.
  return absl::StrCat(prefix, "-", getpid(), "-", counter++);
}

}  // namespace tpudist::collectives::tcp::testing
