#include "train/internal/fs_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tpudist::train::internal {
namespace {

absl::Status Errno(absl::string_view op, const std::string& path, int err) {
  const std::string msg =
      absl::StrCat(op, " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status WriteWithFlags(const std::string& path, absl::string_view data,
                            int flags) {
  const int fd = ::open(path.c_str(), flags | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path, errno);
  absl::Status st = WriteAll(fd, data, path);
  if (st.ok() && ::fsync(fd) != 0) st = Errno("fsync", path, errno);
  if (::close(fd) != 0 && st.ok()) st = Errno("close", path, errno);
  return st;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("stat", path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is a directory, expected a file"));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Errno("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status WriteFileSynced(const std::string& path,
                             absl::string_view contents) {
  return WriteWithFlags(path, contents, O_CREAT | O_TRUNC);
}

absl::Status AppendFileSynced(const std::string& path,
                              absl::string_view contents) {
  return WriteWithFlags(path, contents, O_CREAT | O_APPEND);
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  absl::Status st;
  if (::fsync(fd) != 0) st = Errno("fsync", path, errno);
  ::close(fd);
  return st;
}

absl::Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Errno(absl::StrCat("rename to '", to, "' from"), from, errno);
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Errno("mkdir -p", path, ec.value());
  if (!IsDirectory(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Errno("rm -rf", path, ec.value());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Errno("opendir", dir, errno);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<std::string>> ListFilesRecursive(
    const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(dir, ec), end;
  if (ec) return Errno("list", dir, ec.value());
  for (; it != end; it.increment(ec)) {
    if (ec) return Errno("list", dir, ec.value());
    if (it->is_regular_file(ec)) {
      out.push_back(
          std::filesystem::relative(it->path(), dir, ec).generic_string());
    }
  }
  if (ec) return Errno("list", dir, ec.value());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tpudist::train::internal
