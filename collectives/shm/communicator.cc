#include "collectives/shm/communicator.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives::shm {
namespace {

constexpr uint64_t kMagic = 0x7470756473686d31ull;  // "tpudshm1"
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeaderBytes = 256;    // fastbox line + OpHeader
constexpr size_t kOpHeaderOffset = 64;  // after the fastbox line
static_assert(kOpHeaderOffset + sizeof(OpHeader) <= kHeaderBytes, "OpHeader too large");

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// True if `pid` no longer runs (gone, or a zombie awaiting its reaper).
bool ProcessDead(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

// `options` with the automatic choices (0 / nullopt) made for `size` ranks.
CommOptions Resolve(CommOptions options, int size) {
  const int cores = UsableCores();
  const SlotGeometry g = ChooseSlotGeometry(size, cores);
  if (options.slot_bytes == 0) options.slot_bytes = g.slot_bytes;
  if (options.num_slots == 0) options.num_slots = g.num_slots;
  if (!options.wait) options.wait = ChooseWaitPolicy(size, cores);
  // Polling peers is not the default: within one run it was 4-13% faster
  // at 8-48 B and no slower at 64 KiB-1 MiB (shm_sync_bench), but across 30
  // alternated collectives_bench runs at world 2 a 1 MiB all_reduce landed
  // in this box's slow mode (2.5-3x) in 9 runs against 2 with arrivals
  // (bench/README.md, "The fastbox").
  if (options.sync == CommOptions::Sync::kAuto) options.sync = CommOptions::Sync::kArrivals;
  return options;
}

const char* SyncName(CommOptions::Sync sync) {
  return sync == CommOptions::Sync::kPollPeers ? "poll-peers" : "arrivals";
}

}  // namespace

SlotGeometry ChooseSlotGeometry(int local_ranks, int usable_cores) {
  if (local_ranks > usable_cores) return {2 << 20, 2};
  return {256 << 10, 8};
}

struct Communicator::Control {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  int64_t slot_bytes;  // layout parameters, checked by every peer
  int32_t num_slots;
  int32_t world;
  int32_t sync;     // CommOptions::Sync, resolved; checked by every peer
  int32_t fastbox;  // CommOptions::fastbox; checked by every peer
  alignas(64) std::atomic<uint32_t> phase;
  alignas(64) std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<uint32_t> abort;
  // Used in rank 0's segment only: publishes so far, over all ranks (phase p
  // is complete at p * world, mod 2^32), and sleepers on that count. One
  // futex word for the whole group: a waiting rank sleeps at most once per
  // phase however many peers are late, and the last to arrive wakes all.
  alignas(64) std::atomic<uint32_t> arrivals;
  alignas(64) std::atomic<uint32_t> arrival_waiters;
  // Point-to-point (p2p.h): senders bump the receiver's doorbell.
  alignas(64) std::atomic<uint32_t> p2p_doorbell;
  std::atomic<uint32_t> p2p_doorbell_waiters;
  int64_t p2p_ring_bytes;  // layout parameter, checked by every peer
  // The CPU this rank's op thread last ran a phase on, -1 before
  // (SpreadIfColocated); written only when it changes.
  alignas(64) std::atomic<int32_t> cpu;
  char reason[1024];
};
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex needs 32-bit words");

// The first line of every slot (communicator.h). seq: the phase the slot
// holds, stored last (release) by PublishNext when ranks poll each other;
// its sleepers are counted in the owner's Control::waiters.
struct Communicator::Fastbox {
  std::atomic<uint32_t> seq;
  uint32_t unused;
  uint64_t digest;  // HeaderDigest of the phase's header; 0: none written
  char payload[Communicator::kFastboxBytes];
};

Communicator::Communicator(int rank, int size, CommOptions options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      wait_(options_.wait.value_or(WaitPolicy{})),
      slot_stride_(kHeaderBytes + ((options_.slot_bytes + 63) & ~int64_t{63})),
      segments_(size) {}

Communicator::~Communicator() = default;

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    c10d::Store& store, int rank, int size, const CommOptions& requested) {
  // absl::Mutex's deadlock detection is on in this absl build (Debian's is
  // built without NDEBUG): every Lock updates a process-wide lock graph under
  // a global lock, and every op creates and destroys Mutexes (its Work).
  // Measured on the 2-core box (bench/README.md, 2026-12-06 evening): a C++
  // 8 B all_reduce on 1 rank 1.63 -> 1.27 us. The runtime's locking is compiler-checked
  // (ABSL_GUARDED_BY) instead; the mode is process-wide and set once here.
  static const bool kNoDeadlockGraph = [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    return true;
  }();
  (void)kNoDeadlockGraph;
  const CommOptions options = Resolve(requested, size);
  static_assert(sizeof(Control) <= kControlBytes, "Control too large");
  if (options.p2p_ring_bytes != 0 && options.p2p_ring_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm communicator needs p2p_ring_bytes 0 (no rings) or >= 4096; got ",
        options.p2p_ring_bytes));
  }
  if (options.num_slots < 2 || options.slot_bytes < 64 * size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm communicator needs num_slots >= 2 and slot_bytes >= 64 * world (",
        64 * size, "); got ", options.num_slots, " slots of ",
        options.slot_bytes, " bytes"));
  }
  std::unique_ptr<Communicator> comm(new Communicator(rank, size, options));
  const size_t bytes = kControlBytes + comm->slot_stride_ * options.num_slots +
                       comm->ring_stride() * (options.p2p_ring_bytes > 0 ? size : 0);
  const auto timeout = ToChrono(options.setup_timeout);
  try {
    // Rank 0 picks the name prefix: its job id plus a random nonce, which
    // keeps names unique per group instance even when job ids and group
    // names repeat. Everyone else uses rank 0's choice.
    if (rank == 0) {
      std::random_device rd;
      const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd() ^ getpid();
      const std::string hex = absl::StrFormat("%016x", nonce);
      store.set("shm/prefix", Bytes(options.job_id.empty()
                                        ? hex
                                        : absl::StrCat(options.job_id, ".", hex)));
    }
    store.wait({"shm/prefix"}, timeout);
    const std::vector<uint8_t> p = store.get("shm/prefix");
    const std::string job(p.begin(), p.end());
    auto name = [&](int r) { return SegmentName(job, options.group_name, r); };

    absl::StatusOr<std::unique_ptr<Segment>> own = Segment::Create(name(rank), bytes);
    if (!own.ok()) return own.status();
    Control* me = static_cast<Control*>((*own)->data());
    me->pid = getpid();
    me->rank = rank;
    me->slot_bytes = options.slot_bytes;
    me->num_slots = options.num_slots;
    me->world = size;
    me->p2p_ring_bytes = options.p2p_ring_bytes;
    me->sync = static_cast<int32_t>(options.sync);
    me->fastbox = options.fastbox ? 1 : 0;
    me->cpu.store(-1, std::memory_order_relaxed);
    me->magic = kMagic;
    comm->segments_[rank] = std::move(*own);
    store.set(absl::StrCat("shm/ready/", rank), Bytes("1"));
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      store.wait({absl::StrCat("shm/ready/", r)}, timeout);
      absl::StatusOr<std::unique_ptr<Segment>> peer = Segment::Open(name(r), bytes);
      if (!peer.ok()) return peer.status();
      const Control* pc = static_cast<const Control*>((*peer)->data());
      if (pc->magic != kMagic) {
        return absl::InternalError(absl::StrCat("segment ", name(r), " has a bad magic"));
      }
      if (pc->slot_bytes != options.slot_bytes || pc->num_slots != options.num_slots ||
          pc->world != size || pc->rank != r || pc->p2p_ring_bytes != options.p2p_ring_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shm setup of group '", options.group_name, "' on rank ", rank,
            ": rank ", r, " uses ", pc->num_slots, " slots of ", pc->slot_bytes,
            " bytes and p2p rings of ", pc->p2p_ring_bytes, " bytes for world ", pc->world,
            ", this rank ", options.num_slots, " slots of ", options.slot_bytes,
            " bytes and p2p rings of ", options.p2p_ring_bytes, " bytes for world ", size));
      }
      if (pc->sync != static_cast<int32_t>(options.sync) ||
          pc->fastbox != (options.fastbox ? 1 : 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shm setup of group '", options.group_name, "' on rank ", rank, ": rank ", r,
            " syncs by ", SyncName(static_cast<CommOptions::Sync>(pc->sync)), " with fastboxes ",
            pc->fastbox ? "on" : "off", ", this rank by ", SyncName(options.sync),
            " with fastboxes ", options.fastbox ? "on" : "off",
            " (every rank must pass the same CommOptions::sync and fastbox)"));
      }
      comm->segments_[r] = std::move(*peer);
    }
    store.set(absl::StrCat("shm/mapped/", rank), Bytes("1"));
    for (int r = 0; r < size; ++r) {
      store.wait({absl::StrCat("shm/mapped/", r)}, timeout);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "shm setup of group '", options.group_name, "' on rank ", rank,
        " failed in the store: ", e.what()));
  }
  if (absl::Status s = comm->segments_[rank]->Unlink(); !s.ok()) return s;
  comm->spread_ = options.spread_colocated_ranks && size > 1 && size <= UsableCores();
  comm->poll_peers_ = options.sync == CommOptions::Sync::kPollPeers;
  return comm;
}

Communicator::Control* Communicator::control(int r) const {
  return static_cast<Control*>(segments_[r]->data());
}

char* Communicator::slot(int r, uint64_t phase) const {
  // A mask for the usual power-of-two slot counts: no division per access.
  const uint64_t k = static_cast<uint64_t>(options_.num_slots);
  const uint64_t index = (k & (k - 1)) == 0 ? phase & (k - 1) : phase % k;
  return static_cast<char*>(segments_[r]->data()) + kControlBytes + slot_stride_ * index;
}

Communicator::Fastbox* Communicator::fastbox(int r, uint64_t phase) const {
  static_assert(sizeof(Fastbox) == 64, "a fastbox is one cache line");
  return reinterpret_cast<Fastbox*>(slot(r, phase));
}

int64_t Communicator::fastbox_bytes() const { return options_.fastbox ? kFastboxBytes : 0; }

void* Communicator::my_data() const {
  if (in_fastbox_) return fastbox(rank_, phase_ + 1)->payload;
  return slot(rank_, phase_ + 1) + kHeaderBytes;
}
OpHeader* Communicator::my_header() const {
  return reinterpret_cast<OpHeader*>(slot(rank_, phase_ + 1) + kOpHeaderOffset);
}
void Communicator::SetHeader(const OpHeader& header) {
  *my_header() = header;
  if (options_.fastbox) fastbox(rank_, phase_ + 1)->digest = HeaderDigest(header);
}
const void* Communicator::peer_data(int r) const {
  if (in_fastbox_) return fastbox(r, read_phase_)->payload;
  return slot(r, read_phase_) + kHeaderBytes;
}
const OpHeader* Communicator::peer_header(int r) const {
  return reinterpret_cast<const OpHeader*>(slot(r, phase_) + kOpHeaderOffset);
}

size_t Communicator::ring_stride() const {
  return kP2pRingControlBytes + ((options_.p2p_ring_bytes + 63) & ~int64_t{63});
}

P2pRing Communicator::p2p_ring(int src, int dst) const {
  char* ring = static_cast<char*>(segments_[src]->data()) + kControlBytes +
               slot_stride_ * options_.num_slots + ring_stride() * dst;
  return P2pRing(reinterpret_cast<P2pRingControl*>(ring), ring + kP2pRingControlBytes,
                 static_cast<uint64_t>(options_.p2p_ring_bytes));
}

std::atomic<uint32_t>* Communicator::p2p_doorbell(int r) const {
  return &control(r)->p2p_doorbell;
}

std::atomic<uint32_t>* Communicator::p2p_doorbell_waiters(int r) const {
  return &control(r)->p2p_doorbell_waiters;
}

absl::Status Communicator::PeerAlive(int r) const {
  const Control* c = control(r);
  if (c->pid != getpid() && ProcessDead(c->pid)) {
    return absl::UnavailableError(
        absl::StrCat("peer rank ", Label(r), " (pid ", c->pid, ") died"));
  }
  return absl::OkStatus();
}

int Communicator::Label(int r) const {
  return r < static_cast<int>(options_.rank_labels.size()) ? options_.rank_labels[r] : r;
}

absl::Status Communicator::PeerHealth(int r) const {
  const Control* c = control(r);
  if (c->abort.load(std::memory_order_acquire) != 0) {
    return absl::AbortedError(absl::StrCat("peer rank ", Label(r), " aborted: ",
                                           std::string(c->reason, strnlen(c->reason, sizeof(c->reason)))));
  }
  return PeerAlive(r);
}

absl::Status Communicator::WaitPeer(int r, const std::atomic<uint32_t>* word,
                                    uint32_t target, const OpContext& ctx, const char* what) {
  Control* c = control(r);
  absl::Status s = WaitForSeq(word, &c->waiters, target, ctx.deadline(),
                              wait_, &yield_gate_, [&] {
                                if (abort_requested_.load(std::memory_order_acquire)) {
                                  return absl::AbortedError("abort requested");
                                }
                                return PeerHealth(r);
                              });
  if (s.ok()) return s;
  if (abort_requested_.load(std::memory_order_acquire)) return FailRequested(ctx);
  const absl::Duration elapsed = absl::Now() - ctx.start;
  std::string detail = absl::StrCat(
      ctx.name, " on rank ", Label(rank_), " of group '", options_.group_name, "': ",
      s.message(), " while waiting for peer rank ", Label(r), " ", what, " (phase ",
      target, ", peer at ", word->load(), "); bytes ", ctx.bytes,
      ", elapsed ", absl::FormatDuration(elapsed), " vs timeout ",
      absl::FormatDuration(ctx.timeout));
  if (absl::IsDeadlineExceeded(s)) {
    return Poison(absl::DeadlineExceededError(absl::StrCat("timed out: ", detail)));
  }
  return Poison(absl::Status(s.code(), detail));
}

absl::Status Communicator::BeginPhase(const OpContext& ctx, bool in_fastbox) {
  // The slot of phase p + 1 is free once every peer has published phase
  // p + 2 - K (K = num_slots >= 2), i.e. at most p. The successful
  // PublishAndWait(p) this rank returned from already saw the group's
  // arrival count reach p * W, which happens only once every rank has
  // published p (no rank publishes p + 1 before that count). So there is
  // nothing to wait for here: no per-peer reads, which at 16 ranks on 2
  // cores were 15 cache misses per phase.
  in_fastbox_ = in_fastbox && options_.fastbox;
  if (!poison_.ok()) return poison_;
  if (abort_requested_.load(std::memory_order_acquire)) return FailRequested(ctx);
  if (spread_ && !SawForeignLoad()) SpreadIfColocated();
  return absl::OkStatus();
}

void Communicator::SpreadIfColocated() {
  const int cpu = sched_getcpu();
  if (cpu < 0) return;
  Control* me = control(rank_);
  if (me->cpu.load(std::memory_order_relaxed) != cpu) {
    me->cpu.store(cpu, std::memory_order_relaxed);
  }
  // Only the higher rank of a pair moves, so two never swap.
  bool colocated = false;
  for (int r = 0; r < rank_ && !colocated; ++r) {
    colocated = control(r)->cpu.load(std::memory_order_relaxed) == cpu;
  }
  if (!ShouldMove(colocation_, colocated, colocated ? SteadyNanos() : 0)) return;
  std::vector<int> busy;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) busy.push_back(control(r)->cpu.load(std::memory_order_relaxed));
  }
  if (MoveToFreeCpu(busy)) me->cpu.store(sched_getcpu(), std::memory_order_relaxed);
}

absl::Status Communicator::PublishAndWait(const OpContext& ctx) {
  if (absl::Status s = PublishNext(ctx); !s.ok()) return s;
  return WaitAllPublished(ctx);
}

absl::Status Communicator::PublishNext(const OpContext& ctx) {
  if (!poison_.ok()) return poison_;
  if (abort_requested_.load(std::memory_order_acquire)) return FailRequested(ctx);
  ++phase_;
  read_phase_ = phase_;
  Control* me = control(rank_);
  const uint32_t phase = static_cast<uint32_t>(phase_);
  if (poll_peers_) {
    // Both words, then one fence before looking for sleepers (a sleeper
    // counts itself in `waiters` before it re-reads the word it sleeps on).
    std::atomic<uint32_t>* seq = &fastbox(rank_, phase_)->seq;
    seq->store(phase, std::memory_order_release);
    me->phase.store(phase, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (me->waiters.load(std::memory_order_relaxed) != 0) {
      WakeAll(seq);
      WakeAll(&me->phase);
    }
    return absl::OkStatus();
  }
  PublishSeq(&me->phase, &me->waiters, phase);
  if (size_ == 1) return absl::OkStatus();
  Control* hub = control(0);
  const uint32_t target = phase * static_cast<uint32_t>(size_);
  if (hub->arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 == target &&
      hub->arrival_waiters.load(std::memory_order_seq_cst) != 0) {
    WakeAll(&hub->arrivals);
  }
  return absl::OkStatus();
}

absl::Status Communicator::WaitPeerPublished(int r, uint64_t phase, const OpContext& ctx) {
  if (!poison_.ok()) return poison_;
  const std::atomic<uint32_t>* word = &control(r)->phase;
  if (ctx.while_waiting != nullptr &&
      !SeqReached(word->load(std::memory_order_acquire), static_cast<uint32_t>(phase))) {
    ctx.while_waiting->Run();
  }
  return WaitPeer(r, word, static_cast<uint32_t>(phase), ctx, "to publish");
}

const void* Communicator::peer_data_next(int r) const { return slot(r, phase_ + 1) + kHeaderBytes; }

absl::Status Communicator::WaitAllPublished(const OpContext& ctx) {
  if (!poison_.ok()) return poison_;
  if (size_ == 1) return absl::OkStatus();
  const uint32_t phase = static_cast<uint32_t>(phase_);
  if (poll_peers_) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::atomic<uint32_t>* seq = &fastbox(r, phase_)->seq;
      if (SeqReached(seq->load(std::memory_order_acquire), phase)) continue;
      if (ctx.while_waiting != nullptr) {  // the issuer's bookkeeping, in the wait
        ctx.while_waiting->Run();
        if (SeqReached(seq->load(std::memory_order_acquire), phase)) continue;
      }
      if (absl::Status s = WaitPeer(r, seq, phase, ctx, "to publish"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  Control* hub = control(0);
  const uint32_t target = phase * static_cast<uint32_t>(size_);
  if (SeqReached(hub->arrivals.load(std::memory_order_acquire), target)) return absl::OkStatus();
  if (ctx.while_waiting != nullptr) {
    ctx.while_waiting->Run();
    if (SeqReached(hub->arrivals.load(std::memory_order_acquire), target)) {
      return absl::OkStatus();
    }
  }
  const absl::Status all = WaitForSeq(
      &hub->arrivals, &hub->arrival_waiters, target, ctx.deadline(), wait_, &yield_gate_, [&] {
        if (abort_requested_.load(std::memory_order_acquire)) {
          return absl::AbortedError("abort requested");
        }
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          if (absl::Status h = PeerHealth(r); !h.ok()) return h;
        }
        return absl::OkStatus();
      });
  if (all.ok()) return all;
  // Failed (deadline, abort, a peer died or aborted): redo the wait on each
  // peer's own word, which fails at once for the same cause and names the
  // peer, the op, the bytes and the elapsed time.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (absl::Status s = WaitPeer(r, &control(r)->phase, phase, ctx, "to publish"); !s.ok()) {
      return s;
    }
  }
  return Poison(absl::Status(all.code(), absl::StrCat(ctx.name, " on rank ", Label(rank_),
                                                      ": ", all.message())));
}

absl::Status Communicator::CheckHeaders(const OpContext& ctx) {
  // A peer that already failed may still have published this phase; join
  // its failure rather than completing against a poisoned group.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || control(r)->abort.load(std::memory_order_acquire) == 0) continue;
    return Poison(absl::Status(PeerHealth(r).code(),
                               absl::StrCat(ctx.name, " on rank ", Label(rank_), ": ",
                                            PeerHealth(r).message())));
  }
  if (options_.fastbox) {  // one digest word per peer, in the line the wait fetched
    const uint64_t digest = fastbox(rank_, phase_)->digest;
    bool same = true;
    for (int r = 0; r < size_ && same; ++r) same = fastbox(r, phase_)->digest == digest;
    if (same) return absl::OkStatus();
  }
  const OpHeader& mine = *peer_header(rank_);
  bool agree = true;
  for (int r = 0; r < size_ && agree; ++r) agree = HeadersAgree(mine, *peer_header(r));
  if (agree) return absl::OkStatus();
  std::vector<std::string> lines;
  for (int r = 0; r < size_; ++r) {
    lines.push_back(absl::StrCat("rank ", Label(r), ": ", DescribeHeader(*peer_header(r))));
  }
  return Poison(absl::InvalidArgumentError(absl::StrCat(
      ctx.name, " on rank ", Label(rank_), " of group '", options_.group_name,
      "': ranks called mismatched collectives: ", absl::StrJoin(lines, "; "))));
}

absl::Status Communicator::Poison(absl::Status status) {
  if (poison_.ok()) {
    poison_ = std::move(status);
    Control* me = control(rank_);
    const std::string reason(poison_.message());
    const size_t n = std::min(reason.size(), sizeof(me->reason) - 1);
    std::memcpy(me->reason, reason.data(), n);
    me->reason[n] = '\0';
    me->abort.store(1, std::memory_order_release);
    WakeAll(&me->phase);
    for (int k = 0; k < options_.num_slots; ++k) WakeAll(&fastbox(rank_, k)->seq);
    WakeAll(&control(0)->arrivals);  // peers asleep in PublishAndWait
  }
  return poison_;
}

void Communicator::RequestAbort(absl::Status status) {
  absl::MutexLock lock(&abort_mu_);
  if (abort_requested_.load(std::memory_order_relaxed)) return;
  requested_abort_ = status.ok() ? absl::AbortedError("abort requested") : std::move(status);
  abort_requested_.store(true, std::memory_order_release);
}

absl::Status Communicator::RequestedAbort() {
  absl::MutexLock lock(&abort_mu_);
  return requested_abort_;
}

absl::Status Communicator::FailRequested(const OpContext& ctx) {
  const absl::Status cause = RequestedAbort();
  return Poison(absl::Status(
      cause.code(), absl::StrCat(ctx.name, " on rank ", Label(rank_), " of group '",
                                 options_.group_name, "' aborted after ",
                                 absl::FormatDuration(absl::Now() - ctx.start), ": ",
                                 cause.message())));
}

}  // namespace tpudist::collectives::shm
