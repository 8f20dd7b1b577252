// Test harness: N ranks as threads of one process over one c10d::HashStore,
// and backend-agnostic group factories for DeviceMesh. Test-only.
//
//   RunMeshRanks(4, [&](const RankContext& ctx) { ... InitDeviceMesh(..., ctx.env) ... });
//
// Each rank body runs on its own thread; failures inside it are reported
// with gtest macros (thread-safe). RunMeshRanks waits at most `deadline` for all
// ranks; a rank that is still running then is a hang: the test aborts with
// a message instead of blocking the binary.
#ifndef TPU_DIST_TESTING_DEVICE_MESH_RANKS_H_
#define TPU_DIST_TESTING_DEVICE_MESH_RANKS_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "fsdp/device_mesh.h"

namespace tpudist::test_support {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  fsdp::DeviceMeshEnv env;  // rank, world, shared store, factory, mesh name
};

// The factory the fixture uses: "gloo" (c10d::ProcessGroupGloo over
// loopback) or, once the tpu_dist backend is linked, "tpu_dist".
fsdp::GroupFactory MakeGroupFactory(const std::string& backend, absl::Duration timeout);

// Whether `backend`'s groups implement reduce_scatter (Gloo 1.13 does not).
bool BackendHasReduceScatter(const std::string& backend);

// The backend tests use: $TPU_DIST_TEST_BACKEND, else the best available.
std::string TestBackend();

void RunMeshRanks(int world_size, const std::function<void(const RankContext&)>& body,
              absl::Duration deadline = absl::Seconds(90));

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_DEVICE_MESH_RANKS_H_
