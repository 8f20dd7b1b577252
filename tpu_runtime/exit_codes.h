// Exit codes shared by ranks and their launchers (tpurun, tpu_dist-ray-run).
//
// A rank that stops because another rank failed (the job's coordination
// service blamed another task, a peer died or aborted, the service itself
// went away) exits with kPeerFailureExitCode instead of 1, so a launcher can
// tell the root cause (the first rank that failed for a reason of its own)
// from the ranks that merely followed it. 75 is EX_TEMPFAIL in sysexits.h:
// "try again", which is what a restart does.
#ifndef TPU_DIST_TPU_RUNTIME_EXIT_CODES_H_
#define TPU_DIST_TPU_RUNTIME_EXIT_CODES_H_

namespace tpudist::tpu_runtime {

inline constexpr int kPeerFailureExitCode = 75;

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_EXIT_CODES_H_
