// FreePort: a TCP port on 127.0.0.1 that was free a moment ago (the kernel
// picks it; another process may take it before the caller binds it, which
// tests accept). Header-only and torch-free.
// Thread-safety: thread-safe.
#ifndef TPU_DIST_TESTING_FREE_PORT_H_
#define TPU_DIST_TESTING_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tpudist::test_support {

// The port, or 0 when no socket could be bound.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_FREE_PORT_H_
