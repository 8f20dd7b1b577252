// A POSIX shared-memory segment (shm_open + mmap) owned by this object.
//
// Lifecycle: the creating rank calls Create(); peers call Open() on the same
// name; once every peer has mapped it the creator calls Unlink() so the name
// disappears from /dev/shm while the mappings stay valid. The destructor
// unmaps and, if the name is still linked and this object created it,
// unlinks it, so error paths leave nothing behind either.
//
// Thread-safety: not thread-safe; the mapped memory itself is shared and is
// synchronized by the users of data().
#ifndef TPU_DIST_COLLECTIVES_SHM_SEGMENT_H_
#define TPU_DIST_COLLECTIVES_SHM_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::collectives::shm {

// Builds a valid POSIX shm name "/tpud_<job>_<group>_<rank>": characters
// outside [A-Za-z0-9_.-] become '_', and job/group parts are truncated so the
// name stays within NAME_MAX. Pure; unit tested.
std::string SegmentName(absl::string_view job, absl::string_view group,
                        int rank);

class Segment {
 public:
  // Creates (O_EXCL) and maps a zero-filled segment of `bytes` bytes.
  static absl::StatusOr<std::unique_ptr<Segment>> Create(
      const std::string& name, size_t bytes);
  // Maps an existing segment; fails if it is smaller than `bytes`.
  static absl::StatusOr<std::unique_ptr<Segment>> Open(const std::string& name,
                                                       size_t bytes);

  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Removes the name (idempotent). The mapping stays valid.
  absl::Status Unlink();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  Segment(std::string name, void* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), linked_(owner) {}

  std::string name_;
  void* data_;
  size_t bytes_;
  bool linked_;  // true while this (creating) object still owns the name
};

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_SEGMENT_H_
