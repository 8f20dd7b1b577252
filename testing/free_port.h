// FreePort: a TCP port on 127.0.0.1 that was free a moment ago, for tests
// (another process may take it before the caller binds it, which tests
// accept). The one implementation is tpurun's PickFreePort
// (tpu_runtime/launcher/free_port.h); this is its test-side spelling, which
// reports failure as port 0 instead of a Status.
// Thread-safety: thread-safe.
#ifndef TPU_DIST_TESTING_FREE_PORT_H_
#define TPU_DIST_TESTING_FREE_PORT_H_

#include "absl/status/statusor.h"
#include "tpu_runtime/launcher/free_port.h"

namespace tpudist::test_support {

// The port, or 0 when no socket could be bound.
inline int FreePort() {
  absl::StatusOr<int> port = tpu_runtime::launcher::PickFreePort();
  return port.ok() ? *port : 0;
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_FREE_PORT_H_
