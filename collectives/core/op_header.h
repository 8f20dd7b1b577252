// What a collective call is, as every backend describes and checks it: the
// op kind, the OpSpec a process group hands to a backend (context, sequence
// number, dtype, per-rank shape) and the fixed-size OpHeader that ranks
// exchange before touching each other's data -- through shared memory inside
// a host (collectives/shm) and over TCP between host leaders
// (hierarchical_backend.cc). Two ranks called the same collective iff their
// headers agree (HeadersAgree); mismatch messages list DescribeHeader of each.
//
// Thread-safety: plain values and pure functions.
#ifndef TPU_DIST_COLLECTIVES_CORE_OP_HEADER_H_
#define TPU_DIST_COLLECTIVES_CORE_OP_HEADER_H_

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "collectives/core/reduce_kernels.h"

namespace tpudist::collectives {

enum class OpKind : uint32_t {
  kAllreduce = 1,
  kAllgather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
};
// "allreduce", "reduce_scatter", ...
const char* OpKindName(OpKind kind);

// Per-op header each rank publishes before an op. Fields a given op does not
// use stay 0. Trivially copyable: it lives in shared memory and travels over
// TCP as raw bytes (all ranks run the same build on the same architecture).
struct OpHeader {
  static constexpr int kMaxDims = 8;
  uint32_t op = 0;        // OpKind
  uint32_t op_seq = 0;    // per-group op counter
  uint8_t dtype = 0;      // DataType
  uint8_t reduce = 0;     // ReduceKind
  uint8_t check_count = 1;  // 0: counts may legitimately differ (alltoall)
  uint8_t ndim = 0;
  int32_t root = -1;
  // This rank's hints to the algorithm; not compared by HeadersAgree (ranks
  // may differ; every rank reads all of them and decides alike).
  uint8_t saw_foreign_load = 0;  // Communicator::SawForeignLoad()
  int64_t count = 0;      // elements (or bytes for untyped ops)
  int64_t dims[kMaxDims] = {};
};
static_assert(std::is_trivially_copyable_v<OpHeader>);

// "allreduce #3 dtype=float32 shape=[10] count=10 op=SUM", for messages.
std::string DescribeHeader(const OpHeader& h);
// True if two ranks' headers describe the same call (counts are compared
// only when both set check_count).
bool HeadersAgree(const OpHeader& a, const OpHeader& b);
// A 64-bit digest of the fields HeadersAgree compares (counts and dims only
// when check_count is set), never 0. Equal digests: the headers agree
// (barring a 2^-64 collision); different digests prove nothing (one rank may
// not check counts), so a reader that finds them different falls back to
// HeadersAgree on the full headers. Lets ranks compare one 8-byte word per
// peer instead of reading each peer's whole header (collectives/shm).
uint64_t HeaderDigest(const OpHeader& h);

// Work an op's issuer can do while this rank waits for its peers (its
// flight-recorder entry, its c10d Work): a rank that reaches a peer's data
// late gains nothing from it, one that waits hides it in the wait. Runs its
// function at most once, on the thread that calls Run(). Not thread-safe.
class WaitHook {
 public:
  WaitHook(void (*fn)(void*), void* arg) : fn_(fn), arg_(arg) {}
  WaitHook(const WaitHook&) = delete;
  WaitHook& operator=(const WaitHook&) = delete;
  // Calls the function unless a previous Run() did.
  void Run() {
    if (fn_ == nullptr) return;
    void (*fn)(void*) = fn_;
    fn_ = nullptr;
    fn(arg_);
  }

 private:
  void (*fn_)(void*);
  void* arg_;
};

// What an op is, for error messages and deadlines.
struct OpContext {
  std::string name;  // e.g. "allreduce"
  int64_t bytes = 0;
  absl::Time start;
  absl::Duration timeout;
  // Not owned; may be null. A backend that is about to wait for a peer
  // that has not arrived calls while_waiting->Run() first (only the first
  // such wait of the op matters: Run() acts once); the issuer runs it after
  // the op in any case. A backend that does this for every wait says so
  // (CollectiveBackend::RunsWaitHooks); for the others the issuer runs it
  // before the op.
  WaitHook* while_waiting = nullptr;
  absl::Time deadline() const { return start + timeout; }
};

// What every rank publishes about an op. `shape` is this rank's per-rank
// piece shape (for checks and messages), `count` its element count.
struct OpSpec {
  OpContext ctx;
  uint32_t seq = 0;
  DataType dtype = DataType::kUInt8;
  // The tensor's dims; inline up to 6 (no allocation per op).
  absl::InlinedVector<int64_t, 6> shape;
  int64_t count = 0;
};

// The header for `spec` as op `kind`. root -1 and op ReduceKind{} (0) where
// unused; check_count false where counts may differ per rank (alltoall).
// Dims past OpHeader::kMaxDims are dropped (count still compares).
OpHeader MakeHeader(const OpSpec& spec, OpKind kind, ReduceKind op, int root,
                    bool check_count);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_OP_HEADER_H_
