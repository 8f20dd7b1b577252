#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "io/atomic_file.h"

namespace tpudist::io {
namespace {

struct DtypeRow {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeRow kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": corrupt safetensors file: ", what));
}

}  // namespace

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) munmap(addr, size);
  }
};

absl::StatusOr<at::ScalarType> SafetensorsDtype(absl::string_view name) {
  for (const auto& row : kDtypes) {
    if (name == row.name) return row.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", name, "'"));
}

absl::StatusOr<std::string> SafetensorsDtypeName(at::ScalarType type) {
  for (const auto& row : kDtypes) {
    if (type == row.type) return std::string(row.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(type), " has no safetensors name"));
}

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": fstat failed"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Corrupt(path, absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  auto mapping = std::make_shared<Mapping>();
  // Copy-on-write private mapping: tensors handed out may be written to.
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  mapping->addr = addr;
  mapping->size = size;
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(absl::string_view(static_cast<const char*>(addr), size), path);
  if (!header.ok()) return header.status();
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->data_ = static_cast<const uint8_t*>(addr) + header->data_offset;
  file->entries_ = std::move(header->entries);
  file->metadata_ = std::move(header->metadata);
  for (const auto& [name, e] : file->entries_) {
    // The header parser and kDtypes list the same names (safetensors_test).
    if (!SafetensorsDtype(e.dtype).ok()) return Corrupt(path, absl::StrCat("tensor '", name, "': dtype ", e.dtype));
  }
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

absl::StatusOr<at::Tensor> SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  const SafetensorsEntry& e = it->second;
  const at::ScalarType type = *SafetensorsDtype(e.dtype);
  const uint8_t* ptr = data_ + e.begin;
  const auto options = at::TensorOptions().dtype(type);
  if (reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(type) == 0) {
    std::shared_ptr<Mapping> keep = mapping_;
    return at::from_blob(const_cast<uint8_t*>(ptr), e.shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  at::Tensor out = at::empty(e.shape, options);
  std::memcpy(out.data_ptr(), ptr, e.end - e.begin);
  return out;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  absl::StatusOr<std::shared_ptr<const SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  SafetensorsContents out;
  out.metadata = (*file)->metadata();
  for (const auto& [name, entry] : (*file)->entries()) {
    absl::StatusOr<at::Tensor> t = (*file)->Get(name);
    if (!t.ok()) return t.status();
    out.tensors.emplace(name, t->clone());  // owned: the mapping goes with `file`
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> data;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor '", name, "'"));
    }
    auto dtype = SafetensorsDtypeName(tensor.scalar_type());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", dtype.status().message()));
    }
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", *dtype}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);
  std::vector<absl::string_view> pieces = {absl::string_view(len, 8), h};
  for (const auto& t : data) {
    pieces.emplace_back(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  absl::Status st = WriteFileAtomically(path, pieces);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(st.message(), " (", 8 + h.size() + offset,
                                                " bytes of safetensors in all)"));
  }
  return absl::OkStatus();
}

}  // namespace tpudist::io
