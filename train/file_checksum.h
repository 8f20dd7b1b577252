// FileDigest: the byte count and CRC-32 of a file, what checkpoint.json
// records per file (checkpoint_metadata.h) and what the job fingerprint
// records for the model and data files (job_fingerprint.h).
//
// Why CRC-32, and zlib's:
//   - The damage to detect is accidental: a torn or partial write, bytes
//     overwritten in place, a truncated copy, bit rot. CRC-32 (the IEEE
//     polynomial of gzip, zip and PNG) catches every error burst up to 32
//     bits and any other random damage except with probability 2^-32 per
//     file. It is not a defence against someone forging a file on purpose;
//     nothing in a run directory is (whoever can write it can rewrite
//     checkpoint.json too).
//   - zlib (crc32_z) is already linked (gRPC and protobuf depend on it) and
//     is well kept. abseil here (Debian 12: 20220623) predates absl::crc32c
//     (20230125). OpenSSL's SHA-256 is linked too, through gRPC, but is half
//     as fast (1.5 vs 3.0 GB/s on one core of the dev machine) and its
//     strength buys nothing against accidents.
//   - Anyone can check a file by hand:
//       python3 -c 'import sys,zlib; print("%08x" % zlib.crc32(open(sys.argv[1],"rb").read()))' FILE
//
// Stateless; thread-safe.
#ifndef TPU_DIST_TRAIN_FILE_CHECKSUM_H_
#define TPU_DIST_TRAIN_FILE_CHECKSUM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::train {

struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32 = 0;

  bool operator==(const FileDigest& o) const {
    return bytes == o.bytes && crc32 == o.crc32;
  }
  bool operator!=(const FileDigest& o) const { return !(*this == o); }
};

// CRC-32 of `bytes` (zlib's crc32_z; 0 for empty input). Pure.
uint32_t Crc32(absl::string_view bytes);

// Reads `path` once, streaming, and returns its size and CRC-32. Errors name
// the path and the errno text (NotFound for a missing file).
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// "0a1b2c3d": 8 lowercase hex digits, as checkpoint.json stores it. Pure.
std::string Crc32ToHex(uint32_t crc);

// Inverse of Crc32ToHex; nullopt unless exactly 8 hex digits. Pure.
std::optional<uint32_t> Crc32FromHex(absl::string_view hex);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_FILE_CHECKSUM_H_
