#include "train/file_checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpudist::train {
namespace {

constexpr size_t kChunk = size_t{1} << 20;

uint32_t Update(uint32_t crc, const char* data, size_t n) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(data), n));
}

}  // namespace

uint32_t Crc32(absl::string_view bytes) {
  return Update(static_cast<uint32_t>(crc32_z(0L, Z_NULL, 0)), bytes.data(),
                bytes.size());
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string msg =
        absl::StrCat("open '", path, "': ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg)
                           : absl::InternalError(msg);
  }
  FileDigest d;
  d.crc32 = static_cast<uint32_t>(crc32_z(0L, Z_NULL, 0));
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("read '", path, "': ", std::strerror(err)));
    }
    if (n == 0) break;
    d.crc32 = Update(d.crc32, buf.data(), static_cast<size_t>(n));
    d.bytes += n;
  }
  ::close(fd);
  return d;
}

std::string Crc32ToHex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

std::optional<uint32_t> Crc32FromHex(absl::string_view hex) {
  if (hex.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
    const char l = absl::ascii_tolower(static_cast<unsigned char>(c));
    v = (v << 4) | static_cast<uint32_t>(l <= '9' ? l - '0' : l - 'a' + 10);
  }
  return v;
}

}  // namespace tpudist::train
