#include "collectives/flight_recorder.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/time/clock.h"
#include "collectives/fast_clock.h"

namespace tpudist::collectives {
namespace {

// Process-wide counters: record ids order the entries of all groups in one
// dump (torch's analyzer aligns ranks by them), recorder ids are torch's
// pg_id. Plain counters, no registry.
std::atomic<uint64_t> next_record_id{0};
std::atomic<uint64_t> next_recorder_id{0};

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, Group group)
    : capacity_(capacity), id_(next_recorder_id.fetch_add(1)), group_(std::move(group)) {
  ring_.reserve(capacity_ < 4096 ? capacity_ : 4096);
}

uint64_t FlightRecorder::Record(Op op) {
  return RecordInPlace([&op](Op& e) { e = std::move(op); });
}

uint64_t FlightRecorder::RecordInPlace(absl::FunctionRef<void(Op&)> fill,
                                       int64_t started_at_ns) {
  const int64_t now = started_at_ns > 0 ? started_at_ns : FastUnixNanos();
  absl::MutexLock lock(&mu_);
  const uint64_t op_id = next_op_id_++;
  Entry* e;
  if (ring_.size() < capacity_) {
    e = &ring_.emplace_back();
  } else {
    e = &ring_[op_id % capacity_];
  }
  fill(e->op);
  e->record_id = next_record_id.fetch_add(1, std::memory_order_relaxed);
  e->op_id = op_id;
  e->time_created_ns = now;
  e->time_started_ns.reset();
  e->time_completed_ns.reset();
  e->state = State::kScheduled;
  e->retired = false;
  e->error.clear();
  if (!e->op.is_p2p) progress_.last_enqueued = static_cast<int64_t>(e->op.collective_seq_id);
  if (started_at_ns > 0) {
    e->time_started_ns = now;
    e->state = State::kStarted;
    if (!e->op.is_p2p) progress_.last_started = static_cast<int64_t>(e->op.collective_seq_id);
  }
  return op_id;
}

FlightRecorder::Entry* FlightRecorder::Find(uint64_t op_id) {
  if (op_id >= next_op_id_ || next_op_id_ - op_id > ring_.size()) return nullptr;
  Entry* e = &ring_[op_id % capacity_];
  return e->op_id == op_id ? e : nullptr;
}

void FlightRecorder::Started(uint64_t op_id) { Started(op_id, FastUnixNanos()); }

void FlightRecorder::Started(uint64_t op_id, int64_t now) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(op_id);
  if (e == nullptr) return;
  // Timestamps of one op may come from two threads' clocks (fast_clock.h:
  // within ~1 us of each other): an entry's times never run backwards.
  e->time_started_ns = std::max(now, e->time_created_ns);
  e->state = State::kStarted;
  if (!e->op.is_p2p) progress_.last_started = static_cast<int64_t>(e->op.collective_seq_id);
}

void FlightRecorder::Finished(uint64_t op_id, const absl::Status& status) {
  int64_t now = FastUnixNanos();
  absl::MutexLock lock(&mu_);
  Entry* e = Find(op_id);
  if (e == nullptr) return;
  now = std::max(now, e->time_started_ns.value_or(e->time_created_ns));  // see Started()
  e->retired = true;
  if (!e->time_started_ns.has_value()) {
    e->time_started_ns = now;  // a failed op ran too, however briefly
    e->state = State::kStarted;
  }
  if (status.ok()) {
    e->time_completed_ns = now;
    e->state = State::kCompleted;
    if (!e->op.is_p2p) {
      progress_.last_completed = static_cast<int64_t>(e->op.collective_seq_id);
    }
  } else {
    e->error = std::string(status.message());
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::Entries() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  out.reserve(ring_.size());
  if (ring_.size() < capacity_) {
    out = ring_;
  } else {
    const size_t oldest = next_op_id_ % capacity_;
    for (size_t i = 0; i < capacity_; ++i) out.push_back(ring_[(oldest + i) % capacity_]);
  }
  return out;
}

FlightRecorder::Group FlightRecorder::group() const {
  absl::MutexLock lock(&mu_);
  return group_;
}

void FlightRecorder::Rename(const std::string& name, const std::string& desc) {
  absl::MutexLock lock(&mu_);
  if (!name.empty()) group_.name = name;
  if (!desc.empty()) group_.desc = desc;
}

FlightRecorder::Progress FlightRecorder::progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

absl::string_view TorchOpName(absl::string_view c10d_name) {
  // torch's spelling (torch/distributed/flight_recorder/components/types.py
  // COLLECTIVES; what ProcessGroupGloo and c10d's FlightRecorderHook write).
  static constexpr std::pair<const char*, const char*> kNames[] = {
      {"allreduce", "all_reduce"},
      {"allgather", "all_gather"},
      {"_allgather_base", "_all_gather_base"},
      {"alltoall", "all_to_all"},
      {"alltoall_base", "all_to_all_single"},
      {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
  };
  for (const auto& [c10d, torch] : kNames) {
    if (c10d_name == c10d) return torch;
  }
  return c10d_name;
}

}  // namespace tpudist::collectives
