// A memcpy whose stores bypass the caches (non-temporal), for destinations
// that are not read again soon: the final copy-out of a large all-reduce
// into the caller's buffer. A normal store first reads the destination line
// into the cache (read-for-ownership), so copying into a buffer that is no
// longer cached costs a read, a write and a later write-back; a streaming
// store costs the write only, and leaves the caches (shared with the peers
// still reading their slots) to the shared-memory slots. Measured on the
// 2-core box: chunked 256 KiB copies through a 64 MiB buffer 5.6 GB/s with
// memcpy, 6.8-7.3 GB/s streaming (bench/README.md, "Goal 2 after").
//
// x86-64: SSE2 streaming stores (every x86-64 CPU), an sfence at the end so
// the data is globally visible before the caller publishes it; elsewhere a
// plain memcpy. Thread-safety: a pure function over caller-owned memory.
#ifndef TPU_DIST_COLLECTIVES_CORE_STREAM_COPY_H_
#define TPU_DIST_COLLECTIVES_CORE_STREAM_COPY_H_

#include <cstddef>
#include <cstdint>

namespace tpudist::collectives {

// Copies `bytes` from `src` to `dst` like memcpy (no overlap), with
// non-temporal stores where the target supports them.
void StreamCopy(void* dst, const void* src, size_t bytes);

// Whether an all-reduce of `message_bytes` per rank should copy its result
// out with StreamCopy: only when the message is too large to still be in
// the cache when the caller next touches it (>= kStreamCopyMinBytes), so
// that small and medium results stay cache-hot for the caller.
inline constexpr int64_t kStreamCopyMinBytes = int64_t{4} << 20;
inline bool UseStreamCopy(int64_t message_bytes) {
  return message_bytes >= kStreamCopyMinBytes;
}

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_STREAM_COPY_H_
