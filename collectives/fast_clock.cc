#include "collectives/fast_clock.h"

#include <time.h>

#include <atomic>
#include <fstream>
#include <string>

#include "absl/time/clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tpudist::collectives {
namespace {

constexpr int64_t kCalibrateAfterNs = 20'000'000;  // the shortest scale baseline
constexpr int64_t kReanchorEveryNs = 50'000'000;   // per thread
constexpr int64_t kClampBelowNs = 1'000'000;       // backward steps hidden per thread

int64_t ClockNanos(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

uint64_t ReadTsc() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return 0;
#endif
}

// The kernel's own judgement: it runs on the TSC only when the counter is
// invariant and synchronised across CPUs.
bool KernelUsesTsc() {
#if defined(__x86_64__)
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  f >> source;
  return source == "tsc";
#else
  return false;
#endif
}

// A system-clock reading paired with the TSC at that moment: the best of a
// few tries (the one whose two bracketing counter reads lie closest, so a
// preemption between the reads does not skew it).
struct Pairing {
  int64_t unix_ns = 0;
  int64_t mono_ns = 0;
  uint64_t tsc = 0;
  uint64_t window = ~uint64_t{0};  // ticks between the bracketing reads
};

Pairing ReadPairing() {
  Pairing best;
  for (int i = 0; i < 4; ++i) {
    const uint64_t t0 = ReadTsc();
    const int64_t unix_ns = ClockNanos(CLOCK_REALTIME);
    const int64_t mono_ns = ClockNanos(CLOCK_MONOTONIC);
    const uint64_t t1 = ReadTsc();
    if (t1 >= t0 && t1 - t0 < best.window) {
      best = Pairing{unix_ns, mono_ns, t0 + (t1 - t0) / 2, t1 - t0};
    }
  }
  return best;
}

struct Global {
  bool tsc = false;
  Pairing origin;
  std::atomic<double> ns_per_tick{0.0};  // 0 until a 20 ms baseline exists
};

Global& G() {
  static Global* const g = [] {
    auto* g = new Global;
    g->tsc = KernelUsesTsc();
    if (g->tsc) g->origin = ReadPairing();
    return g;
  }();
  return *g;
}

struct Anchor {
  int64_t unix_ns = 0;
  uint64_t tsc = 0;
  uint64_t valid_ticks = 0;  // re-anchor once this many ticks have passed
  double ns_per_tick = 0.0;  // 0: not anchored
  int64_t last_ns = 0;       // the last value returned on this thread
};
thread_local Anchor t_anchor;

// Reads the system clock, refines the scale, and re-anchors this thread.
int64_t Reanchor(Global& g, Anchor& a) {
  double scale = g.ns_per_tick.load(std::memory_order_relaxed);
  if (scale == 0.0 && ClockNanos(CLOCK_MONOTONIC) - g.origin.mono_ns < kCalibrateAfterNs) {
    return ClockNanos(CLOCK_REALTIME);  // too early to calibrate
  }
  const Pairing p = ReadPairing();
  const int64_t since = p.mono_ns - g.origin.mono_ns;
  const uint64_t ticks = p.tsc - g.origin.tsc;
  // The pairings' own uncertainty (their windows) must be small against the
  // baseline: under 20 ppm of it, so the scale is good to ~1 us over 50 ms.
  const uint64_t uncertainty = p.window + g.origin.window;
  if (since >= kCalibrateAfterNs && p.tsc > g.origin.tsc && uncertainty < ticks / 50'000) {
    // The longest baseline so far: the best estimate (it improves as the
    // process lives on).
    scale = static_cast<double>(since) / static_cast<double>(ticks);
    g.ns_per_tick.store(scale, std::memory_order_relaxed);
  }
  // Anchor only on a pairing good to ~1 us; otherwise read the clock again
  // on the next call.
  if (scale > 0.0 && static_cast<double>(p.window) * scale < 2'000.0) {
    a.unix_ns = p.unix_ns;
    a.tsc = p.tsc;
    a.ns_per_tick = scale;
    a.valid_ticks = static_cast<uint64_t>(static_cast<double>(kReanchorEveryNs) / scale);
  } else {
    a.ns_per_tick = 0.0;
  }
  return p.unix_ns;
}

}  // namespace

int64_t FastUnixNanos() {
  Global& g = G();
  if (!g.tsc) return absl::GetCurrentTimeNanos();
  Anchor& a = t_anchor;
  // Unsigned: a counter read behind the anchor (another CPU's counter a few
  // ticks behind) wraps to a huge delta and re-anchors.
  const uint64_t d = ReadTsc() - a.tsc;
  int64_t now;
  if (a.ns_per_tick > 0.0 && d < a.valid_ticks) {
    now = a.unix_ns + static_cast<int64_t>(static_cast<double>(d) * a.ns_per_tick);
  } else {
    now = Reanchor(g, a);
  }
  if (now < a.last_ns && a.last_ns - now < kClampBelowNs) return a.last_ns;
  a.last_ns = now;
  return now;
}

bool FastClockUsesTsc() { return G().tsc; }

}  // namespace tpudist::collectives
