// What the benchmarks print next to their figures about the machine and the
// process: the load average (a run on a busy box reads differently) and the
// process's CPU time (less noisy than wall time on a shared machine: it
// leaves out time spent runnable but not running).
//
// Thread-safety: both are safe from any thread.
#ifndef TPU_DIST_BENCH_PROC_STATS_H_
#define TPU_DIST_BENCH_PROC_STATS_H_

namespace tpudist::bench {

// The 1-minute load average from /proc/loadavg; -1 when unreadable.
double LoadAverage();

// CPU time of this process, every thread (the training thread, the backend's
// op worker, rail helpers, Gloo's threads), in seconds.
double ProcessCpuSeconds();

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_PROC_STATS_H_
