// LaunchConfig -> the ranks tpurun starts: argv, environment and labels of
// every process of one attempt. Pure functions (no I/O), thread-safe.
//
// Two modes:
//   * slice (--accelerator-type/--topology): each rank gets the environment
//     it would see on its TPU host (SliceEnvironment: KubeRay, GKE, TorchTPU
//     and torchrun variables). With hosts_emulated, all hosts of the slice
//     run here, host h as address 127.0.1.<h+1>. Without it, only the ranks
//     of host `host_index` are planned: one tpurun per real host, all with the
//     same flags, hostnames and master port.
//     With num_slices > 1 (needs hosts_emulated), N slices of that shape run
//     here, each with its own hosts (slice s, host h at 127.0.<s+1>.<h+1>;
//     slice 0 keeps 127.0.1.<h+1>): every rank also gets what GKE + the
//     KubeRay TPU webhook set per replica (TPU_WORKER_ID / _HOSTNAMES of its
//     own slice, TPU_NAME tpu-slice-<s>, MEGASCALE_NUM_SLICES,
//     MEGASCALE_SLICE_ID, MEGASCALE_COORDINATOR_ADDRESS = slice 0's first
//     host, MEGASCALE_PORT), and the torchrun variables (RANK, WORLD_SIZE,
//     GROUP_RANK, ...) count every slice, slice-major: rank = slice x devices
//     per slice + rank in slice. num_slices == 1 sets no MEGASCALE_* at all.
//   * plain (--nproc N): N ranks with torchrun's variables (RANK, LOCAL_RANK,
//     WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_*, TORCHELASTIC_RUN_ID), no TPU
//     variables: what `torchrun --nproc-per-node N` gives a single node.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_LAUNCH_PLAN_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_LAUNCH_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tpu_runtime/launcher/process_group_supervisor.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime::launcher {

// The most ranks one tpurun starts (plain --nproc N, or every rank of an
// emulated slice): each is a process with its own threads and shm segments,
// and the largest TPU slice host runs 8. Beyond this, a typo (--nproc 100000)
// would fork until the machine gives out.
inline constexpr int kMaxLocalRanks = 4096;

// The most emulated slices: slice s's hosts are 127.0.<s+1>.<h+1>.
inline constexpr int kMaxEmulatedSlices = 254;

struct LaunchConfig {
  enum class Mode { kPlain, kSlice };
  Mode mode = Mode::kPlain;
  int nproc = 1;                // kPlain: number of ranks
  SliceSpec slice;              // kSlice: from SliceSpecFromFlags
  bool hosts_emulated = false;  // kSlice: run every host's ranks here
  // kSlice: slices of `slice`'s shape (--num-slices); > 1 needs
  // hosts_emulated. MEGASCALE_PORT of every rank when > 1.
  int num_slices = 1;
  int megascale_port = 8081;
  int host_index = 0;           // kSlice, not emulated: which host this is
  // kSlice: one address per host of every slice, slice-major; empty means
  // 127.0.<s+1>.<h+1> for host h of slice s.
  std::vector<std::string> hostnames;
  // Empty: 127.0.0.1 (plain) or the first host (slice).
  std::string master_addr;
  std::vector<std::string> command;  // the rank binary and its arguments
  std::string job_id;                // TPU_DIST_JOB_ID / TORCHELASTIC_RUN_ID
  bool set_omp_num_threads = false;  // OMP_NUM_THREADS=1 (torchrun's default)
  // How every rank gets the job secret (tpu_runtime/job_secret.h), at most
  // one set: TPU_DIST_JOB_SECRET=<hex> or TPU_DIST_JOB_SECRET_FILE=<path>.
  // Neither: no secret (unauthenticated listeners).
  std::string job_secret_hex;
  std::string job_secret_file;
};

// Checks a config before anything starts; errors name the field (the flag
// for num_slices: "--num-slices=0: ...") and value. The ranks started here
// must number at most kMaxLocalRanks.
absl::Status ValidateLaunchConfig(const LaunchConfig& config);

// The ranks this tpurun starts for attempt `restart_count`, in rank order.
// REQUIRES: ValidateLaunchConfig(config).ok(); 1 <= master_port <= 65535.
absl::StatusOr<std::vector<ProcessSpec>> PlanRanks(const LaunchConfig& config, int restart_count,
                                                   int master_port);

// Whether tpurun may pick MASTER_PORT itself (a free local port per attempt):
// true unless the job spans real hosts, which must agree on one port.
bool MayPickMasterPort(const LaunchConfig& config);

// True when this tpurun starts only its own host's ranks of a slice with
// more than one host (one tpurun per real host).
bool IsOneOfManyHosts(const LaunchConfig& config);

// --max-restarts N: InvalidArgument when N < 0, or N > 0 and
// IsOneOfManyHosts(config): each host's tpurun sees only its own ranks, the
// hosts cannot yet agree on an attempt, and a restart on one host alone
// would meet the other hosts' stopped ranks (the message says what to use
// instead).
absl::Status ValidateMaxRestarts(const LaunchConfig& config, int max_restarts);

// For SupervisorOptions::peer_failure_hint: where the root cause is when
// every rank of this tpurun stopped because another rank failed. With one
// tpurun per host: "the rank that failed is on another host (this tpurun
// runs host 0 of 2, ranks 0-3): see the tpurun of host 1 (127.0.1.2)".
// Else "" (this tpurun saw every rank).
std::string PeerFailureHint(const LaunchConfig& config);

// For SupervisorOptions::describe_failed_ranks: one line per slice of a
// multi-slice job (num_slices > 1) all of whose ranks are in `failed_ranks`
// (RankFailure::failed_on_their_own), e.g. "slice 1 (ranks 8-15, hosts
// 127.0.2.1-127.0.2.2) lost: all 8 of its ranks failed before tpurun stopped
// the job". Empty for one slice, or when no slice lost every rank.
std::vector<std::string> LostSliceLines(const LaunchConfig& config,
                                        const std::vector<int>& failed_ranks);

// The start line (without "tpurun: "):
//   "v6e 4x4, 16 devices on 4 hosts x 4 (emulated), job <id>"
//   "tpu7x 2x2x2, 16 devices on 2 hosts x 8 (host 1 of 2), job <id>"
//   "4 processes (plain), job <id>"
//   "v6e 2x2 x 2 slices, 8 devices on 2 hosts x 4 (emulated), job <id>"
std::string StartBanner(const LaunchConfig& config);

// A job id unique on this machine: "tpurun-<pid>-<hex time>". Not pure.
std::string GenerateJobId();

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_LAUNCH_PLAN_H_
