#include "testing/device_mesh_ranks.h"

#include <cstdlib>

#include <unistd.h>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "distributed/init_process_group.h"
#include "gtest/gtest.h"
#include "testing/rank_threads.h"

namespace tpudist::test_support {

fsdp::GroupFactory MakeGroupFactory(const std::string& backend, absl::Duration timeout) {
  // Groups by the one rule of distributed/group_config.h. Threads of one
  // process share a host: tpu_dist uses shared memory, whose segment names
  // must be unique per concurrent group: a job id per run.
  distributed::GroupInitOptions o;
  o.backend = backend;
  o.group_name = "g";
  o.timeout = timeout;
  o.job_id = absl::StrCat("fsdp_test_", ::getpid(), "_", absl::ToUnixMicros(absl::Now()));
  o.gloo_threads = 1;
  absl::StatusOr<distributed::GroupConfig> config =
      distributed::ResolveGroupConfigFromProcess(/*info=*/nullptr, o);
  if (!config.ok()) {
    return [status = config.status()](const c10::intrusive_ptr<c10d::Store>&, int,
                                      const std::vector<int>&)
               -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> { return status; };
  }
  return distributed::MakeGroupFactory(*config);
}

bool BackendHasReduceScatter(const std::string& backend) { return true; }

std::string TestBackend() {
  const char* env = std::getenv("TPU_DIST_TEST_BACKEND");
  if (env != nullptr && *env != '\0') return env;
#ifdef TPU_DIST_FSDP_TEST_HAVE_TPU_DIST
  return "tpu_dist";
#else
  return "gloo";
#endif
}

void RunMeshRanks(int world_size, const std::function<void(const RankContext&)>& body,
              absl::Duration deadline) {
  at::set_num_threads(1);  // ranks are threads on a 2-core machine
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string backend = TestBackend();
  // One factory per run (its job id names the run's shm segments).
  const fsdp::GroupFactory factory = MakeGroupFactory(backend, absl::Seconds(30));
  RunRankThreads(
      world_size,
      [&](int r) {
        RankContext ctx;
        ctx.rank = r;
        ctx.world_size = world_size;
        ctx.env.rank = r;
        ctx.env.world_size = world_size;
        ctx.env.store = store;
        ctx.env.group_factory = factory;
        ctx.env.mesh_name = "mesh";  // a fresh store per run
        ctx.env.collective_timeout = absl::Seconds(30);
        body(ctx);
      },
      deadline);
}

}  // namespace tpudist::test_support
