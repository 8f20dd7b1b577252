// FlightRecorder: a process group's bounded ring of its last N ops, for
// diagnosing hangs and desynchronised ranks after the fact (issue 33).
//
// Each ProcessGroupTpuDist owns one (Options::flight_recorder_entries > 0).
// The group records an op when it is issued ("scheduled"), marks it
// "started" when its body begins to run (on the worker thread or inline on
// the caller) and "completed" when it ends successfully. A failed op (timed
// out, aborted, mismatched) stays "started", retired, with its error: what
// torch's own recorder shows for a collective that timed out.
// When the ring is full the oldest entry is overwritten.
//
// The entries carry what torch's flight-recorder analyzer
// (torch.distributed.flight_recorder, `fr_trace`) matches ranks on:
// collective_seq_id (the group's op sequence number, getSequenceNumberForGroup),
// p2p_seq_id, the op name in torch's spelling ("tpu_dist:all_reduce",
// "tpu_dist:send 0->1", "tpu_dist:recv 1<-0"), input/output sizes and dtypes,
// state and timestamps. flight_recorder_dump.h writes them in torch's dump
// format (a pickled dict, one file per rank).
//
// Not recorded: the call site (Python or C++ frames). torch's own hook
// captures the Python stack per op
// (torch._C._distributed_c10d._dump_fr_trace(backend="tpu_dist")); the Python
// package attaches it to tpu_dist groups only with TPU_DIST_TORCH_FR_HOOK=1
// (python/tpu_dist/backend.py: it costs more per op than this recorder).
//
// Cost: one short critical section per state change (three per op, two for
// an op run at once on its issuer), the size/dtype vectors of the op's
// tensors, no allocation once the ring has wrapped (entries are reused), and
// timestamps from FastUnixNanos (fast_clock.h: the TSC, ~11 ns a read, within
// ~1 us of the system clock; an entry's times never run backwards).
// Measured in docs/fault_tolerance.md and bench/README.md.
//
// Thread-safety: every method is thread-safe.
#ifndef TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_H_
#define TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_H_

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tpudist::collectives {

class FlightRecorder {
 public:
  enum class State { kScheduled, kStarted, kCompleted };

  // What the group records when it issues an op.
  struct Op {
    // torch's profiling name without the library prefix: "all_reduce",
    // "_all_gather_base", "send 0->1" (group ranks src->dst), "recv 1<-0"
    // (dst<-src). See TorchOpName().
    std::string name;
    bool is_p2p = false;
    uint64_t collective_seq_id = 0;  // the group's sequence number
    uint64_t p2p_seq_id = 0;         // counts this group's send/recv
    std::vector<std::vector<int64_t>> input_sizes;   // one per input tensor
    std::vector<std::vector<int64_t>> output_sizes;  // one per output tensor
    std::vector<c10::ScalarType> input_dtypes;
    std::vector<c10::ScalarType> output_dtypes;
    int64_t timeout_ms = 0;
  };

  struct Entry {
    Op op;
    uint64_t record_id = 0;  // process-wide order of recording (dumps sort by it)
    uint64_t op_id = 0;      // this recorder's count of ops, from 0
    int64_t time_created_ns = 0;                   // Unix time
    std::optional<int64_t> time_started_ns;        // Unix time
    std::optional<int64_t> time_completed_ns;      // Unix time
    State state = State::kScheduled;
    bool retired = false;  // ended (completed, or failed: then `error`)
    std::string error;     // the error's message; "" when OK or not ended
  };

  // The group as torch's analyzer names it: `name` is torch's group name
  // (e.g. "0" for the default group), `desc` its description ("default_pg",
  // "undefined"), `global_ranks` the global rank of each group rank.
  struct Group {
    std::string name;
    std::string desc = "undefined";
    std::vector<int64_t> global_ranks;
  };

  // REQUIRES: capacity > 0.
  FlightRecorder(size_t capacity, Group group);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Records `op` as scheduled now; returns its op_id for Started/Finished.
  uint64_t Record(Op op);
  // Records an op as scheduled now, its fields written by `fill` into the
  // entry in place: `fill` must set every field of the Op it is given, which
  // holds the overwritten entry's values (so its strings and vectors keep
  // their capacity: once the ring has wrapped a record allocates nothing).
  // `fill` runs under the recorder's lock: it must not call back into it.
  // `started_at_ns` (Unix ns) > 0: the op is recorded as scheduled and
  // started at that time (an op run at once on the issuing thread: one
  // clock read and one lock instead of two each).
  uint64_t RecordInPlace(absl::FunctionRef<void(Op&)> fill, int64_t started_at_ns = 0);
  // The op began to run (at `now_ns`, Unix time; default: now). No-op if it
  // has been overwritten meanwhile.
  void Started(uint64_t op_id);
  void Started(uint64_t op_id, int64_t now_ns);
  // The op ended with `status`. No-op if it has been overwritten meanwhile.
  void Finished(uint64_t op_id, const absl::Status& status);

  // The entries still held, oldest first.
  std::vector<Entry> Entries() const;
  Group group() const;
  // torch may name the group after construction (ProcessGroup::setGroupName
  // / setGroupDesc reach the backend then); empty values leave it unchanged.
  void Rename(const std::string& name, const std::string& desc);
  // This process's global rank (the group rank's entry of global_ranks).
  int64_t global_rank() const { return global_rank_; }
  void set_global_rank(int64_t r) { global_rank_ = r; }
  // Process-unique id of this recorder (torch's pg_id).
  uint64_t id() const { return id_; }
  size_t capacity() const { return capacity_; }
  // Highest collective_seq_id recorded / started / completed (torch's
  // pg_status: last_enqueued/started/completed_collective); -1 = none.
  struct Progress {
    int64_t last_enqueued = -1;
    int64_t last_started = -1;
    int64_t last_completed = -1;
  };
  Progress progress() const;

 private:
  Entry* Find(uint64_t op_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const uint64_t id_;
  int64_t global_rank_ = 0;
  mutable absl::Mutex mu_;
  Group group_ ABSL_GUARDED_BY(mu_);
  std::vector<Entry> ring_ ABSL_GUARDED_BY(mu_);  // [min(recorded, capacity)]
  uint64_t next_op_id_ ABSL_GUARDED_BY(mu_) = 0;
  Progress progress_ ABSL_GUARDED_BY(mu_);
};

// torch's profiling-name spelling of a tpu_dist op (c10d method name):
// "allreduce" -> "all_reduce", "_allgather_base" -> "_all_gather_base",
// "alltoall_base" -> "all_to_all_single", ...; unknown names unchanged.
// Returns static storage, or c10d_name's own characters when unknown.
absl::string_view TorchOpName(absl::string_view c10d_name);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_FLIGHT_RECORDER_H_
