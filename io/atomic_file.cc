#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tpudist::io {
namespace {

// The directory holding `path` ("." for a bare name, "/" for "/name").
std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status Failed(int err, const std::string& file, absl::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat(file, ": ", what, " failed"));
}

// Writes `pieces` to `fd` (a fresh temp file), then fsyncs and closes it.
// Closes `fd` on every path.
absl::Status WriteAndClose(int fd, const std::string& tmp, const std::string& path,
                           absl::Span<const absl::string_view> pieces) {
  uint64_t total = 0;
  for (absl::string_view p : pieces) total += p.size();
  uint64_t written = 0;
  for (absl::string_view p : pieces) {
    while (!p.empty()) {
      const ssize_t n = ::write(fd, p.data(), p.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        ::close(fd);
        return Failed(err, tmp,
                      absl::StrCat("writing ", p.size(), " bytes at offset ", written, " of ", total,
                                   " (for ", path, ")"));
      }
      p.remove_prefix(static_cast<size_t>(n));
      written += static_cast<uint64_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return Failed(err, tmp, absl::StrCat("fsync of ", total, " bytes (for ", path, ")"));
  }
  if (::close(fd) != 0) return Failed(errno, tmp, absl::StrCat("closing (for ", path, ")"));
  return absl::OkStatus();
}

}  // namespace

std::string AtomicTempPath(const std::string& path) { return path + ".tmp"; }

absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> pieces) {
  const std::string tmp = AtomicTempPath(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Failed(errno, tmp, absl::StrCat("creating the temp file for ", path));
  if (absl::Status st = WriteAndClose(fd, tmp, path, pieces); !st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Failed(err, tmp, absl::StrCat("renaming it to ", path));
  }
  // The rename is only durable once the directory entry is.
  const std::string dir = DirOf(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Failed(errno, dir, absl::StrCat("opening the directory to fsync the rename of ", path));
  const int rc = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (rc != 0) return Failed(err, dir, absl::StrCat("fsync after renaming ", tmp, " to ", path));
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(path, absl::Span<const absl::string_view>(&contents, 1));
}

}  // namespace tpudist::io
