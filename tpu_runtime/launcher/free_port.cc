#include "tpu_runtime/launcher/free_port.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime::launcher {

absl::StatusOr<int> PickFreePort(absl::string_view address) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  const std::string host(address);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PickFreePort: address \"", host, "\" is not an IPv4 address"));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("PickFreePort: socket: ", strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("PickFreePort: bind ", host, ":0: ", strerror(err)));
  }
  socklen_t len = sizeof(addr);
  int rc = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int err = errno;
  close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("PickFreePort: getsockname: ", strerror(err)));
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace tpudist::tpu_runtime::launcher
