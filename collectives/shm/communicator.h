// Communicator: W ranks on one host, each owning one shared-memory segment
// mapped by all the others, synchronized by a lock-step phase protocol.
//
// Segment layout (per rank):
//   Control   {magic, pid, rank, phase word, sleeper count, abort word,
//              arrival count and its sleepers (rank 0's only), p2p doorbell
//              and its sleepers, abort reason}     -- one 4 KiB page
//   Slot[K]   {Fastbox (64 B), OpHeader, data (slot_bytes)} in 256 B +
//              slot_bytes -- K = options.num_slots. The fastbox is one cache
//              line: the phase the slot holds (the sync word when ranks
//              poll each other), the digest of the phase's header and up
//              to kFastboxBytes of payload, so a small one-phase op moves
//              one line per peer instead of a header and a data line.
//   Ring[W]   {P2pRingControl, data (p2p_ring_bytes)} -- ring d carries this
//              rank's point-to-point messages to rank d (p2p.h); none when
//              p2p_ring_bytes is 0. Untouched rings cost no memory (tmpfs
//              pages are allocated on first write).
//
// Phase protocol. Every collective is a sequence of phases; every rank runs
// every phase of every op (ranks with nothing to send still publish), so all
// ranks agree on the phase number p. In phase p a rank
//   1. BeginPhase(): the slot (p mod K) is free once every peer has
//      published phase p-K+1, i.e. has finished reading phase p-K. That is
//      always true already: step 3 of phase p-1 saw every peer publish p-1
//      (>= p-K+1 for K >= 2), so BeginPhase only checks poison and abort;
//   2. writes its header/data into slot p mod K;
//   3. PublishAndWait(): stores p into its phase word and then waits until
//      every peer has published p, in one of two ways (CommOptions::sync,
//      the same on every rank):
//      - arrivals (the default): adds one to rank 0's arrival count and
//        waits until that reaches p * W (the last rank to arrive wakes the
//        sleepers: one futex word per group, so a rank sleeps at most once
//        per phase);
//      - poll peers (an option, for ranks with a core each): also stores p
//        into the fastbox of slot p mod K and waits on each peer's fastbox
//        in turn: no shared read-modify-write line, and a small op's
//        payload and header digest arrive in the line the wait fetched;
//   4. reads peers' slot p mod K (peer_data) until it next publishes.
// Reading phase p always happens before publishing p+1, which is what makes
// step 1 safe. (Ops may also run phases without the group barrier, next to a
// busy load: phases.h, RunPhasesAhead, with its own slot argument.) With K >= 2 slots there is no trailing barrier: a fast rank
// runs ahead by up to K-1 phases while slow ranks still read.
//
// Faults. Waits use WaitForSeq (spin, adaptive yield, futex) bounded by the op
// deadline. The slow path checks each awaited peer's abort word and whether
// its pid is alive (kill(pid, 0) and /proc/<pid>/stat for zombies). Any error
// poisons the communicator: it records the status, sets its own abort word
// with the reason (so peers fail fast instead of timing out) and every later
// op fails with the same status.
//
// Setup (Create) rendezvous through a c10d::Store: publish host segment
// readiness, map every peer, publish "mapped", wait for all "mapped", then
// unlink the own segment name -- so /dev/shm holds nothing once setup ends.
//
// Thread-safety: one op at a time (the process group's worker thread);
// RequestAbort() from any thread.
#ifndef TPU_DIST_COLLECTIVES_SHM_COMMUNICATOR_H_
#define TPU_DIST_COLLECTIVES_SHM_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collectives/core/op_header.h"
#include "collectives/shm/p2p_ring.h"
#include "collectives/shm/placement.h"
#include "collectives/shm/segment.h"
#include "collectives/shm/wait.h"

namespace c10d {
class Store;
}

namespace tpudist::collectives::shm {

// Slot size and count for `local_ranks` ranks sharing `usable_cores` cores
// (pure). Every phase is a barrier that needs each rank to run once, so when
// ranks outnumber cores (each barrier costs context switches) the slots are
// big and few: 2 of 2 MiB (16 MiB reduce_scatter: 8 phases instead of 64).
// Otherwise 8 of 256 KiB (L2-sized chunks; 8 beat 4 and 16 at 16 MiB).
// The large all_reduce uses only AllReducePhaseBytes of a slot per phase
// (at most 512 KiB: what a phase writes must stay cached).
// Measured: bench/README.md, "Waiting under load" and "Goal 2 after".
struct SlotGeometry {
  int64_t slot_bytes;
  int num_slots;
};
SlotGeometry ChooseSlotGeometry(int local_ranks, int usable_cores);

struct CommOptions {
  std::string job_id;      // rank 0's value prefixes segment names (+ nonce)
  std::string group_name = "default";
  // Data bytes per slot (>= 64 * world) and slots (>= 2); 0 for either:
  // ChooseSlotGeometry(world, UsableCores()). Every rank must end up with the
  // same values (Create fails otherwise), so ranks with different CPU
  // affinity masks must pass them explicitly.
  int64_t slot_bytes = 0;
  int num_slots = 0;
  absl::Duration setup_timeout = absl::Minutes(5);
  // nullopt: ChooseWaitPolicy(world, UsableCores()).
  std::optional<WaitPolicy> wait;
  // How ranks learn that every peer published a phase (the header comment,
  // step 3). kAuto: kArrivals (one futex word lets a rank sleep once per
  // phase when ranks share cores; kPollPeers, for ranks with a core each,
  // measured faster at small sizes but more often slow at 1 MiB: see
  // Resolve in communicator.cc). Every rank must end up with the same mode
  // (Create fails otherwise).
  enum class Sync { kAuto, kArrivals, kPollPeers };
  Sync sync = Sync::kAuto;
  // One-phase ops whose payload fits kFastboxBytes carry it in the slot's
  // fastbox line, and every header phase compares header digests before
  // reading whole headers. false: payloads in the slot's data, whole headers
  // read (experiments: bench A/B). The same on every rank.
  bool fastbox = true;
  // SawForeignLoad() always true (tests and experiments: the paths taken
  // next to a busy load, e.g. broadcast's streaming chunks).
  bool assume_foreign_load = false;
  // Bytes of each point-to-point ring (p2p.h; at least 4096), or 0: no
  // rings (point-to-point then goes over TCP). The same on every rank.
  // 1 MiB: a 1 MiB message goes in at once, and 16 MiB ping-pong at 2 ranks
  // took 5.3-5.7 ms against 9.3-10.2 with 256 KiB rings (bench/README.md,
  // Goal 5). Only the rings a rank sends on take memory.
  int64_t p2p_ring_bytes = 1 << 20;
  // Ranks that have a core each (world <= UsableCores()) move themselves
  // apart when the scheduler puts two on one CPU and their waits see no
  // foreign load (SawForeignLoad(); placement.h). false:
  // never (tests of placement-sensitive timing, experiments).
  bool spread_colocated_ranks = true;
  // Rank numbers used in error messages: rank_labels[r] names local rank r
  // (the multi-host path passes group ranks); empty = local numbering.
  std::vector<int> rank_labels;
};

class Communicator {
 public:
  // Collective over `store`: every one of `size` ranks calls it.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      c10d::Store& store, int rank, int size, const CommOptions& options);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t slot_bytes() const { return options_.slot_bytes; }
  const WaitPolicy& wait_policy() const { return wait_; }

  // OK, or the status that poisoned this communicator.
  const absl::Status& poison_status() const { return poison_; }

  // Step 1 of a phase. Returns the poison status if poisoned. in_fastbox:
  // this phase's payload lives in the fastbox (my_data() and peer_data()
  // point there until the next BeginPhase): only for a lock-step phase whose
  // payload is at most fastbox_bytes() on every rank, every rank passing the
  // same value (a one-phase op decides it from its header's fields).
  absl::Status BeginPhase(const OpContext& ctx, bool in_fastbox = false);
  // Payload bytes a fastbox carries: kFastboxBytes, or 0 when
  // CommOptions::fastbox is off.
  int64_t fastbox_bytes() const;
  static constexpr int64_t kFastboxBytes = 48;
  void* my_data() const;
  // Writes this phase's header (and, with fastboxes, its digest), read by
  // CheckHeaders() and peer_header() after PublishAndWait.
  void SetHeader(const OpHeader& header);
  // Steps 3 of a phase: PublishNext() then WaitAllPublished().
  absl::Status PublishAndWait(const OpContext& ctx);
  // Step 4: peer r's slot of the read phase: the last published phase, or
  // the one ReadFrom() chose since (its fastbox payload in a fastbox phase).
  const void* peer_data(int r) const;
  const OpHeader* peer_header(int r) const;

  // Streaming phases, for ops where one rank writes and the others only read
  // (broadcast): no group barrier per phase. Readers wait for the writer's
  // phase word (WaitPeerPublished), read its slot of the phase they publish
  // next (peer_data_next) and then publish; the writer, before reusing the
  // slot of phase q, waits for every reader to have published q. Such an op
  // must start with a lock-step phase and end with WaitAllPublished at a
  // phase every rank publishes last (the arrival count is a barrier only
  // while no rank can be past that phase); a reader may read the last phase
  // after it, as in a lock-step phase. That restores the invariant above
  // for the next op.
  //
  // Publishes the next phase (this rank's phase word and the group's
  // arrival count) without waiting.
  absl::Status PublishNext(const OpContext& ctx);
  // Waits until every rank has published this rank's current phase.
  absl::Status WaitAllPublished(const OpContext& ctx);
  // Waits until peer r has published (absolute) phase `phase`.
  absl::Status WaitPeerPublished(int r, uint64_t phase, const OpContext& ctx);
  // Peer r's slot of the phase this rank publishes next.
  const void* peer_data_next(int r) const;
  // Whether this rank's waits have recently found the cores busy with other
  // processes (its YieldGate closed, or closed lately and not yet decayed).
  // A local hint; an op that acts on it shares it first (broadcast puts it
  // in its phase-0 header and streams if any rank saw a foreign load).
  bool SawForeignLoad() const { return options_.assume_foreign_load || yield_gate_.backoff_ns > 0; }
  // Makes peer_data() read phase `phase` until the next PublishNext (which
  // resets it to the phase published). For ops that run ahead: a rank that
  // has published phases up to p reads an earlier one (phases.h).
  // REQUIRES: phase() - num_slots() < phase <= phase().
  void ReadFrom(uint64_t phase) { read_phase_ = phase; }
  // This rank's last published (absolute) phase; slots: num_slots().
  uint64_t phase() const { return phase_; }
  int num_slots() const { return options_.num_slots; }

  // Point-to-point rings and doorbells, for ShmP2p (p2p.h). Unlike the rest,
  // thread-safe: plain views of shared memory, independent of the phases.
  // p2p_ring(src, dst): the ring of local rank src's messages to dst (in
  // src's segment). p2p_doorbell(r): bumped (BumpSeq) by every sender after
  // writing into a ring to r; r's reader sleeps on it.
  // REQUIRES: p2p_ring_bytes() > 0, src != dst, ranks in [0, size()).
  int64_t p2p_ring_bytes() const { return options_.p2p_ring_bytes; }
  P2pRing p2p_ring(int src, int dst) const;
  std::atomic<uint32_t>* p2p_doorbell(int r) const;
  std::atomic<uint32_t>* p2p_doorbell_waiters(int r) const;
  // OK while local rank r's process runs; Unavailable naming it (its group
  // rank) and its pid once it died. Thread-safe.
  absl::Status PeerAlive(int r) const;
  // The group rank that names local rank r in messages. Thread-safe.
  int Label(int r) const;  // options_.rank_labels[r], or r

  // Compares every rank's header of the current phase with ours (with
  // fastboxes, the digests first: whole headers only when they differ); on
  // mismatch poisons and returns InvalidArgument listing each rank's header.
  // Every rank sees the same headers, so every rank fails with the same
  // message. Also fails (Aborted) if any peer has already poisoned itself.
  absl::Status CheckHeaders(const OpContext& ctx);

  // Poisons with `status` (if not already) and tells peers.
  absl::Status Poison(absl::Status status);

  // Thread-safe, unlike the rest: asks the op in flight (within one futex
  // slice of its wait) and every later op to fail with `status`, which then
  // poisons the communicator as any error does. The first request wins.
  // Used to abort a group from outside (the job failed elsewhere).
  void RequestAbort(absl::Status status);

 private:
  struct Control;
  struct Fastbox;
  Communicator(int rank, int size, CommOptions options);
  Control* control(int r) const;
  char* slot(int r, uint64_t phase) const;
  Fastbox* fastbox(int r, uint64_t phase) const;
  OpHeader* my_header() const;
  // Waits until `word` of peer r (its phase word, or its fastbox of the
  // awaited phase) reaches `target`; on failure poisons with a message
  // naming the op, the peer and `what` it was waited for.
  absl::Status WaitPeer(int r, const std::atomic<uint32_t>* word, uint32_t target,
                        const OpContext& ctx, const char* what);
  absl::Status PeerHealth(int r) const;
  size_t ring_stride() const;
  // Publishes this thread's CPU and, when ranks have a core each and a
  // lower-ranked peer keeps reporting the same CPU, moves (placement.h).
  void SpreadIfColocated();

  int rank_;
  int size_;
  CommOptions options_;
  WaitPolicy wait_;  // options_.wait or the chosen one
  YieldGate yield_gate_;  // this rank's adaptive yield stage (wait.h)
  bool spread_ = false;  // SpreadIfColocated() acts (ranks <= cores, option on)
  bool poll_peers_ = false;  // options_.sync resolved: kPollPeers
  bool in_fastbox_ = false;  // the current phase's payload is in the fastbox
  ColocationTracker colocation_;
  size_t slot_stride_;
  std::vector<std::unique_ptr<Segment>> segments_;  // [size]; own at rank_
  uint64_t phase_ = 0;  // last published phase; phases start at 1
  uint64_t read_phase_ = 0;  // peer_data()'s phase: phase_ unless ReadFrom()
  absl::Status poison_;
  // RequestAbort(): the flag is read in every wait's slow path.
  std::atomic<bool> abort_requested_{false};
  absl::Mutex abort_mu_;
  absl::Status requested_abort_ ABSL_GUARDED_BY(abort_mu_);
  absl::Status RequestedAbort() ABSL_LOCKS_EXCLUDED(abort_mu_);
  // Poisons with the requested abort, naming the op and this rank.
  absl::Status FailRequested(const OpContext& ctx);
};

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_COMMUNICATOR_H_
