// Writing flight-recorder dumps (flight_recorder.h) in the format torch's
// analyzer reads, and the triggers that write them.
//
// Format (torch's FlightRecorder::dump, version "2.10"): one file per global
// rank, named <prefix><rank>, holding a pickled dict
//   {"version": "2.10", "comm_lib_version": "tpu_dist",
//    "pg_config": {group name: {"name", "desc", "ranks": "[0, 1]"}},
//    "pg_status": {str(pg_id): {"last_enqueued_collective", ...}},
//    "entries": [{"record_id", "pg_id", "process_group": (name, desc),
//                 "collective_seq_id", "p2p_seq_id", "op_id",
//                 "profiling_name": "tpu_dist:all_reduce", "time_created_ns",
//                 "input_sizes", "input_dtypes", "output_sizes",
//                 "output_dtypes", "state", "time_discovered_started_ns",
//                 "time_discovered_completed_ns", "retired", "timeout_ms",
//                 "is_p2p", "frames": [], "thread_name", "thread_id",
//                 "error" (tpu_dist's addition: the failed op's message)}]}
// with every group of the process that lives at dump time (entries sorted by
// record_id). Read it with
//   python -m torch.distributed.flight_recorder.fr_trace <dir>
// (or torch's `torchfrtrace`), which loads every <prefix><rank> file.
//
// The live recorders are found in a process-wide list of weak references
// (recorders only, never groups): a dump is per process (one file per rank,
// every group in it) and one of its triggers, SIGUSR1, is process-wide too.
// A process that holds groups of several global ranks (ranks as threads in a
// test) writes one file per rank.
//
// Thread-safety: all functions are thread-safe; dumps are serialized.
#ifndef TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_DUMP_H_
#define TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_DUMP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/flight_recorder.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

// The dump of `recorders` (all of one global rank) as torch's pickle.
std::string FlightRecorderPickle(
    absl::Span<const std::shared_ptr<FlightRecorder>> recorders);

// Adds `recorder` to the process's list of live recorders (held weakly;
// `dump_prefix` is where automatic dumps of its rank go, "" = none).
void RegisterFlightRecorder(const std::shared_ptr<FlightRecorder>& recorder,
                            const std::string& dump_prefix);

// Writes one file per global rank of the live recorders, <prefix><rank>
// (created atomically: written under a temporary name, then renamed; the
// prefix's directory is created). `prefix` "" = the registered prefix of
// the rank's recorders (FailedPrecondition if none has one). Returns the
// paths written. `reason` is printed in one stderr line per file unless
// `quiet`.
absl::StatusOr<std::vector<std::string>> DumpFlightRecorders(const std::string& prefix,
                                                             const std::string& reason,
                                                             bool quiet = false);

// Automatic dumps (op failure, abort, another rank's request, SIGUSR1):
// DumpFlightRecorders("", reason) for the live recorders that have a dump
// prefix, at most once per second per process unless `force`; errors go to
// stderr. Returns whether it wrote.
bool AutoDumpFlightRecorders(const std::string& reason, bool force);

// Per group: a thread ("tpud-fr") that polls the group's store every `poll`
// for a dump request from another rank of the group (a counter key under
// the group's store prefix) and wakes on SIGUSR1 (a handler installed once
// per process if SIGUSR1 still has its default action); on either it calls
// AutoDumpFlightRecorders. RequestDumpEverywhere() bumps the counter (from
// the thread: the caller never blocks on the store). The thread polls on a
// clone of the store (its own connection) with a short store timeout, and
// stops polling after the store's first error (the job is ending).
class FlightRecorderWatcher {
 public:
  FlightRecorderWatcher(const c10::intrusive_ptr<c10d::Store>& store, absl::Duration poll);
  FlightRecorderWatcher(const FlightRecorderWatcher&) = delete;
  FlightRecorderWatcher& operator=(const FlightRecorderWatcher&) = delete;
  ~FlightRecorderWatcher();  // Stop()

  // Asks every rank of the group to dump (asynchronously).
  void RequestDumpEverywhere();
  // Ends the thread (within the store timeout if it is in a store call).
  // Idempotent.
  void Stop();

 private:
  void Loop();

  c10::intrusive_ptr<c10d::Store> store_;
  const absl::Duration poll_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> request_{false};
  int wake_fd_ = -1;  // eventfd
  std::thread thread_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_DUMP_H_
