#include "testing/tcp_util.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "testing/rank_threads.h"

namespace tpudist::test_support {

absl::StatusOr<std::vector<std::unique_ptr<collectives::tcp::TcpMesh>>> ConnectAll(
    c10d::Store& store, int world, const collectives::tcp::TcpMeshOptions& options) {
  using collectives::tcp::TcpMesh;
  std::vector<std::unique_ptr<TcpMesh>> meshes(world);
  absl::Mutex mu;
  absl::Status first;
  RunRankThreads(world, [&](int rank) {
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

}  // namespace tpudist::test_support
