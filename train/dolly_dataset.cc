#include "train/dolly_dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "train/split_spec.h"

namespace tpudist::train {
namespace {

constexpr const char* kFields[] = {"instruction", "context", "response",
                                   "category"};

absl::Status LineError(absl::string_view file, int64_t line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", what));
}

// `bytes` of the line were seen; `complete`: that is all of it.
absl::Status RowTooLong(absl::string_view file, int64_t line, int64_t bytes,
                        bool complete, int64_t max_row_bytes) {
  return LineError(
      file, line,
      absl::StrCat("row is ", complete ? "" : "at least ", bytes,
                   " bytes, over the limit of ", max_row_bytes,
                   " bytes per row (", kMaxRowBytesPerToken,
                   " bytes per token of the sequence length, at least ",
                   kMinMaxRowBytes,
                   "; truncation would drop almost all of it): shorten or "
                   "remove the row"));
}

// Appends the record on `line` (unless blank) to `out`.
absl::Status AddLine(absl::string_view line, absl::string_view file,
                     int64_t line_no, std::vector<DollyExample>* out) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (absl::StripAsciiWhitespace(line).empty()) return absl::OkStatus();
  auto ex = ParseDollyLine(line, file, line_no);
  if (!ex.ok()) return ex.status();
  out->push_back(*std::move(ex));
  return absl::OkStatus();
}

absl::Status OpenError(absl::string_view op, const std::string& path, int err) {
  const std::string msg = absl::StrCat(op, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);  // as internal/fs_util.h's errors
}

absl::Status EmptyFile(absl::string_view file) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": empty file (no records)"));
}

}  // namespace

int64_t MaxRowBytesForSeqLen(int64_t max_seq_len) {
  if (max_seq_len <= 0) return kMinMaxRowBytes;
  // Bounded by the flags' kMaxSeqLen (2^20) in practice; saturate anyway.
  const int64_t per_token = std::min<int64_t>(max_seq_len, (int64_t{1} << 40) / kMaxRowBytesPerToken);
  return std::max(kMinMaxRowBytes, per_token * kMaxRowBytesPerToken);
}

absl::StatusOr<DollyExample> ParseDollyLine(absl::string_view text,
                                            absl::string_view file,
                                            int64_t line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return LineError(file, line, absl::StrCat("bad JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return LineError(file, line,
                     absl::StrCat("expected a JSON object, got ",
                                  j.type_name()));
  }
  DollyExample ex;
  ex.line = line;
  std::string* outs[] = {&ex.instruction, &ex.context, &ex.response,
                         &ex.category};
  for (int i = 0; i < 4; ++i) {
    auto it = j.find(kFields[i]);
    if (it == j.end()) {
      return LineError(file, line,
                       absl::StrCat("missing field \"", kFields[i], "\""));
    }
    if (!it->is_string()) {
      return LineError(file, line,
                       absl::StrCat("field \"", kFields[i],
                                    "\" must be a string, got ",
                                    it->type_name()));
    }
    *outs[i] = it->get<std::string>();
  }
  return ex;
}

absl::StatusOr<std::vector<DollyExample>> ParseDollyJsonl(
    absl::string_view contents, absl::string_view file,
    int64_t max_row_bytes) {
  std::vector<DollyExample> out;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < contents.size()) {
    size_t nl = contents.find('\n', pos);
    if (nl == absl::string_view::npos) nl = contents.size();
    absl::string_view line = contents.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (static_cast<int64_t>(line.size()) > max_row_bytes) {
      return RowTooLong(file, line_no, static_cast<int64_t>(line.size()),
                        /*complete=*/true, max_row_bytes);
    }
    if (absl::Status s = AddLine(line, file, line_no, &out); !s.ok()) return s;
  }
  if (out.empty()) return EmptyFile(file);
  return out;
}

absl::StatusOr<std::vector<DollyExample>> ReadDollyJsonl(
    const std::string& path, int64_t max_row_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError("open", path, errno);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return OpenError("stat", path, errno);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is a directory, expected a file"));
  }
  // An oversize line is measured (without being kept) up to this many bytes.
  const int64_t measure_limit =
      std::max<int64_t>(max_row_bytes, int64_t{64} * max_row_bytes);
  std::vector<DollyExample> out;
  std::string line;     // the current line while it is within the limit
  int64_t line_no = 1;  // of the current line
  int64_t oversize = -1;  // bytes of the current line once over the limit
  std::vector<char> buf(size_t{1} << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return OpenError("read", path, errno);
    if (n == 0) break;
    const char* p = buf.data();
    const char* end = p + n;
    while (p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
      const char* stop = nl != nullptr ? nl : end;
      const int64_t len = stop - p;
      if (oversize < 0 &&
          static_cast<int64_t>(line.size()) + len > max_row_bytes) {
        oversize = static_cast<int64_t>(line.size());
        std::string().swap(line);
      }
      if (oversize >= 0) {
        oversize += len;
        if (nl != nullptr || oversize >= measure_limit) {
          return RowTooLong(path, line_no, oversize, nl != nullptr,
                            max_row_bytes);
        }
      } else {
        line.append(p, static_cast<size_t>(len));
      }
      if (nl == nullptr) break;
      if (absl::Status s = AddLine(line, path, line_no, &out); !s.ok()) {
        return s;
      }
      line.clear();
      ++line_no;
      p = nl + 1;
    }
  }
  if (oversize >= 0) {
    return RowTooLong(path, line_no, oversize, /*complete=*/true,
                      max_row_bytes);
  }
  if (!line.empty()) {
    if (absl::Status s = AddLine(line, path, line_no, &out); !s.ok()) return s;
  }
  if (out.empty()) return EmptyFile(path);
  return out;
}

absl::StatusOr<std::vector<DollyExample>> LoadDollySplit(
    const std::string& path, absl::string_view split, int64_t max_row_bytes) {
  auto spec = ParseSplit(split);
  if (!spec.ok()) return spec.status();
  if (spec->name != "train") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unknown split '", spec->name, "' in '", split,
        "' (a JSONL file has one split, 'train')"));
  }
  auto rows = ReadDollyJsonl(path, max_row_bytes);
  if (!rows.ok()) return rows.status();
  auto range = ResolveSplit(*spec, static_cast<int64_t>(rows->size()), split);
  if (!range.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", range.status().message()));
  }
  return std::vector<DollyExample>(rows->begin() + range->begin,
                                   rows->begin() + range->end);
}

}  // namespace tpudist::train
