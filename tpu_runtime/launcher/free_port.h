// PickFreePort: asks the kernel for a currently unused TCP port, for
// MASTER_PORT when the user gave none. The port is only free at the time of
// the call (it is closed again before returning); the rendezvous that binds it
// a moment later can, rarely, lose it to another process.
//
// Thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_FREE_PORT_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_FREE_PORT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::tpu_runtime::launcher {

// Binds port 0 on the IPv4 `address`, reads the port the kernel chose, closes.
absl::StatusOr<int> PickFreePort(absl::string_view address = "127.0.0.1");

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_FREE_PORT_H_
