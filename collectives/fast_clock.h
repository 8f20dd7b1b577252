// FastUnixNanos: the Unix time in nanoseconds, read from the CPU's
// time-stamp counter where the kernel itself trusts it, for the timestamps a
// process group takes on every op (when an op starts, when its flight-recorder
// entry completes).
//
// Why: on the machines this project is measured on (KVM guests) a system-clock
// read (clock_gettime through the vDSO) costs 30-50 ns inside the op path,
// and a small inline op took two of them: ~15% of a world-1 8 B all_reduce
// (bench/README.md, "The per-op clock"). A TSC read costs ~11 ns.
//
// How: each thread keeps an anchor (a system-clock reading and the TSC at
// that moment) and extrapolates from it with a process-wide ns-per-tick
// scale; it re-reads the system clock every 50 ms of TSC ticks (so clock
// adjustments and steps are followed within 50 ms). The scale is measured
// against CLOCK_MONOTONIC over the whole life of the process (never from a
// baseline shorter than 20 ms; until then every call reads the system clock).
// Accuracy: within ~1 us of absl::GetCurrentTimeNanos() (extrapolation over
// <= 50 ms with a scale error of a few ppm); per thread, readings never go
// backwards by less than 1 ms (a re-anchor that lands slightly behind the
// extrapolated value is clamped; a real clock step back of >= 1 ms is shown).
//
// Where the TSC is not used (not x86-64, or the kernel's clocksource is not
// "tsc": it then does not consider the counter invariant and synchronised
// across CPUs), FastUnixNanos() is absl::GetCurrentTimeNanos().
//
// Thread-safety: thread-safe; no locks (a thread-local anchor, an atomic scale).
#ifndef TPU_DIST_COLLECTIVES_FAST_CLOCK_H_
#define TPU_DIST_COLLECTIVES_FAST_CLOCK_H_

#include <cstdint>

namespace tpudist::collectives {

// The Unix time in ns (see above for accuracy).
int64_t FastUnixNanos();

// Whether FastUnixNanos() extrapolates from the TSC (false: it reads the
// system clock every time).
bool FastClockUsesTsc();

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_FAST_CLOCK_H_
