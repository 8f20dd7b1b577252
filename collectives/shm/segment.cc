#include "collectives/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::collectives::shm {
namespace {

std::string Sanitize(absl::string_view s, size_t max_len) {
  std::string out;
  for (char c : s.substr(0, max_len)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out;
}

absl::Status ErrnoError(absl::string_view what, const std::string& name) {
  return absl::InternalError(
      absl::StrCat(what, " ", name, ": ", std::strerror(errno)));
}

}  // namespace

std::string SegmentName(absl::string_view job, absl::string_view group,
                        int rank) {
  return absl::StrCat("/tpud_", Sanitize(job, 64), "_", Sanitize(group, 120),
                      "_", rank);
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(
    const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoError("shm_open(create)", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = ErrnoError("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    absl::Status s = ErrnoError("mmap", name);
    shm_unlink(name.c_str());
    return s;
  }
  return std::unique_ptr<Segment>(new Segment(name, data, bytes, true));
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Open(const std::string& name,
                                                       size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return ErrnoError("shm_open(open)", name);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", name, " is smaller than ", bytes, " bytes"));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) return ErrnoError("mmap", name);
  return std::unique_ptr<Segment>(new Segment(name, data, bytes, false));
}

Segment::~Segment() {
  (void)Unlink();
  munmap(data_, bytes_);
}

absl::Status Segment::Unlink() {
  if (!linked_) return absl::OkStatus();
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("shm_unlink", name_);
  }
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::shm
