#include "fsdp/testing/rank_threads.h"

#include <cstdlib>

#include <unistd.h>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/process_group_factory.h"
#include "gtest/gtest.h"
#include "testing/rank_threads.h"

namespace tpudist::fsdp::testing {

GroupFactory MakeGroupFactory(const std::string& backend, absl::Duration timeout) {
  const auto ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (backend == "gloo") {
    return [ms](const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                const std::vector<int>& ranks)
               -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
      return collectives::NewGlooProcessGroup(store, group_rank, static_cast<int>(ranks.size()),
                                              "127.0.0.1", ms,
                                              absl::StrCat("gloo_", absl::StrJoin(ranks, "_")),
                                              /*threads=*/1);
    };
  }
#ifdef TPU_DIST_FSDP_TEST_HAVE_TPU_DIST
  if (backend == "tpu_dist") {
    // Threads of one process share a host: the group uses shared memory.
    // Segment names must be unique per concurrent group: job id per run.
    const std::string job =
        absl::StrCat("fsdp_test_", ::getpid(), "_", absl::ToUnixMicros(absl::Now()));
    return [ms, job](const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                     const std::vector<int>& ranks)
               -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
      collectives::ProcessGroupTpuDist::Options opts;
      opts.timeout = ms;
      opts.group_name = absl::StrCat("g", absl::StrJoin(ranks, "_"));
      opts.job_id = job;
      return collectives::NewTpuDistProcessGroup(store, group_rank,
                                                 static_cast<int>(ranks.size()), opts);
    };
  }
#endif
  return [backend](const c10::intrusive_ptr<c10d::Store>&, int, const std::vector<int>&)
             -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
    return absl::UnimplementedError(absl::StrCat("test backend '", backend, "' is not linked"));
  };
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

void RunRanks(int world_size, const std::function<void(const RankContext&)>& body,
              absl::Duration deadline) {
  at::set_num_threads(1);  // ranks are threads on a 2-core machine
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string backend = TestBackend();
  // One factory per run (its job id names the run's shm segments).
  const GroupFactory factory = MakeGroupFactory(backend, absl::Seconds(30));
  ::tpudist::testing::RunRankThreads(
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

}  // namespace tpudist::fsdp::testing
