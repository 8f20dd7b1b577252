#include "train/checkpoint_storage.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "train/checkpoint_manager.h"
#include "train/internal/fs_util.h"

#if TPU_DIST_HAVE_ARROW
#include <cstdlib>
#include <mutex>

#include "arrow/filesystem/filesystem.h"
#include "arrow/filesystem/s3fs.h"
#include "arrow/buffer.h"
#include "arrow/io/interfaces.h"
#include "arrow/util/uri.h"
#endif

namespace tpudist::train {

bool IsStorageUri(absl::string_view storage_path) {
  const size_t colon = storage_path.find("://");
  if (colon == absl::string_view::npos || colon == 0) return false;
  for (char ch : storage_path.substr(0, colon)) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '+' || ch == '-' || ch == '.')) return false;
  }
  return true;
}

std::string RedactedUri(absl::string_view uri) {
  const size_t q = uri.find('?');
  return q == absl::string_view::npos ? std::string(uri) : absl::StrCat(uri.substr(0, q), "?...");
}

void CheckpointStorage::Warn(absl::string_view msg) const {
  if (options_.warn) {
    options_.warn(msg);
  } else {
    std::fprintf(stderr, "[storage] warning: %.*s\n", static_cast<int>(msg.size()), msg.data());
  }
}

CheckpointStorage::CheckpointStorage(CheckpointStorageOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {
  description_ = absl::StrCat(RedactedUri(options_.uri), "/", options_.run_name);
}

#if !TPU_DIST_HAVE_ARROW

struct CheckpointStorage::Impl {};

bool StorageUrisSupported() { return false; }

namespace {
absl::Status NoArrow(absl::string_view uri) {
  return absl::UnimplementedError(absl::StrCat(
      "--storage-path '", RedactedUri(uri),
      "' is a URI, but this build has no Arrow C++ (pyarrow's headers were not found at configure time): "
      "install requirements-lock.txt's pyarrow into .venv and reconfigure, or give a local directory"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStorage>> CheckpointStorage::Open(CheckpointStorageOptions options) {
  return NoArrow(options.uri);
}
CheckpointStorage::~CheckpointStorage() = default;
absl::Status CheckpointStorage::Upload(const std::string&) { return NoArrow(options_.uri); }
absl::StatusOr<std::vector<RemoteCheckpoint>> CheckpointStorage::ListComplete() const {
  return NoArrow(options_.uri);
}
absl::StatusOr<std::string> CheckpointStorage::Download(const RemoteCheckpoint&, const std::string&) {
  return NoArrow(options_.uri);
}
absl::StatusOr<std::optional<std::string>> CheckpointStorage::FetchNewestVerified(const std::string&) {
  return NoArrow(options_.uri);
}

#else  // TPU_DIST_HAVE_ARROW

struct CheckpointStorage::Impl {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::string root;  // the run's directory in fs's own path syntax: bucket/prefix/run or /dir/run
  bool atomic_put = false;  // S3: a PUT is all-or-nothing, so checkpoint.json needs no temp name
};

bool StorageUrisSupported() { return true; }

namespace {

constexpr int64_t kChunkBytes = 8 << 20;

// Arrow's S3 is process-wide: initialized once on first use, finalized at
// exit (after every CheckpointStorage is gone; Arrow warns and may crash at
// exit otherwise). The exit hook is registered once the first S3 client
// exists: registered earlier, it ran after the statics that client creation
// makes were destroyed and hung in Finalize (seen in a run that made none).
absl::Status EnsureS3() {
  static std::once_flag once;
  static arrow::Status init;
  std::call_once(once, [] { init = arrow::fs::EnsureS3Initialized(); });
  if (init.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot initialize Arrow's S3 filesystem: ", init.ToString()));
}

void FinalizeS3AtExit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { (void)arrow::fs::EnsureS3Finalized(); }); });
}

absl::Status FromArrow(const arrow::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsIOError()) return absl::UnavailableError(msg);
  if (s.IsInvalid()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  return absl::EndsWith(a, "/") ? absl::StrCat(a, b) : absl::StrCat(a, "/", b);
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status PutFile(arrow::fs::FileSystem& fs, const std::string& local, const std::string& remote) {
  std::ifstream in(local, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", local, "' for upload"));
  auto out = fs.OpenOutputStream(remote);
  if (!out.ok()) return FromArrow(out.status(), absl::StrCat("upload of '", local, "' to '", remote, "'"));
  std::string buf(kChunkBytes, '\0');
  while (in) {
    in.read(buf.data(), kChunkBytes);
    if (in.gcount() > 0) {
      arrow::Status s = (*out)->Write(buf.data(), in.gcount());
      if (!s.ok()) return FromArrow(s, absl::StrCat("upload of '", local, "' to '", remote, "'"));
    }
  }
  if (in.bad()) return absl::UnavailableError(absl::StrCat("I/O error reading '", local, "' for upload"));
  return FromArrow((*out)->Close(), absl::StrCat("upload of '", local, "' to '", remote, "' (close)"));
}

absl::Status GetFile(arrow::fs::FileSystem& fs, const std::string& remote, const std::string& local) {
  auto in = fs.OpenInputStream(remote);
  if (!in.ok()) return FromArrow(in.status(), absl::StrCat("download of '", remote, "'"));
  {
    std::ofstream out(local, std::ios::binary | std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot create '", local, "' for download"));
    for (;;) {
      auto chunk = (*in)->Read(kChunkBytes);
      if (!chunk.ok()) return FromArrow(chunk.status(), absl::StrCat("download of '", remote, "'"));
      if ((*chunk)->size() == 0) break;
      out.write(reinterpret_cast<const char*>((*chunk)->data()), (*chunk)->size());
    }
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("write error on '", local, "' during download"));
  }
  (void)(*in)->Close();
  return internal::FsyncPath(local);
}

absl::StatusOr<std::string> ReadRemote(arrow::fs::FileSystem& fs, const std::string& remote) {
  auto in = fs.OpenInputStream(remote);
  if (!in.ok()) return FromArrow(in.status(), absl::StrCat("read of '", remote, "'"));
  std::string text;
  for (;;) {
    auto chunk = (*in)->Read(kChunkBytes);
    if (!chunk.ok()) return FromArrow(chunk.status(), absl::StrCat("read of '", remote, "'"));
    if ((*chunk)->size() == 0) break;
    text.append(reinterpret_cast<const char*>((*chunk)->data()), (*chunk)->size());
  }
  (void)(*in)->Close();
  return text;
}

// An Arrow error about `uri`, with the URI (which may carry keys in its
// query) replaced by its redacted form.
absl::Status UriError(const arrow::Status& s, const std::string& uri) {
  std::string msg = s.ToString();
  const std::string redacted = RedactedUri(uri);
  for (size_t at = msg.find(uri); !uri.empty() && at != std::string::npos; at = msg.find(uri, at)) {
    msg.replace(at, uri.size(), redacted);
    at += redacted.size();
  }
  const size_t q = uri.find('?');
  if (q != std::string::npos) {
    const std::string query = uri.substr(q + 1);
    for (size_t at = msg.find(query); !query.empty() && at != std::string::npos; at = msg.find(query, at)) {
      msg.replace(at, query.size(), "...");
    }
  }
  return FromArrow(arrow::Status(s.code(), msg), absl::StrCat("--storage-path '", redacted, "'"));
}

absl::StatusOr<std::shared_ptr<arrow::fs::FileSystem>> OpenFileSystem(const std::string& uri, std::string* path,
                                                                      bool* is_s3) {
  *is_s3 = absl::StartsWith(uri, "s3://");
  if (!*is_s3) {
    auto fs = arrow::fs::FileSystemFromUri(uri, path);
    if (!fs.ok()) return UriError(fs.status(), uri);
    return *fs;
  }
  if (absl::Status s = EnsureS3(); !s.ok()) return s;
  auto options = arrow::fs::S3Options::FromUri(uri, path);
  if (!options.ok()) return UriError(options.status(), uri);
  // Every call has a deadline: a dead endpoint fails in seconds, not never.
  if (options->connect_timeout <= 0) options->connect_timeout = 10;
  if (options->request_timeout <= 0) options->request_timeout = 60;
  auto fs = arrow::fs::S3FileSystem::Make(*options);
  if (!fs.ok()) return UriError(fs.status(), uri);
  FinalizeS3AtExit();
  return std::shared_ptr<arrow::fs::FileSystem>(*fs);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStorage>> CheckpointStorage::Open(CheckpointStorageOptions options) {
  // The same run_name rules as the local run directory.
  if (absl::StatusOr<std::string> r = RunDirPath("x", options.run_name); !r.ok()) return r.status();
  std::string path;
  bool is_s3 = false;
  absl::StatusOr<std::shared_ptr<arrow::fs::FileSystem>> fs = OpenFileSystem(options.uri, &path, &is_s3);
  if (!fs.ok()) return fs.status();
  if (is_s3 && (path.empty() || path == "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--storage-path '", RedactedUri(options.uri), "' names no bucket (s3://bucket[/prefix])"));
  }
  auto impl = std::make_unique<Impl>();
  impl->fs = *std::move(fs);
  impl->root = JoinPath(path, options.run_name);
  impl->atomic_put = is_s3;
  return std::unique_ptr<CheckpointStorage>(new CheckpointStorage(std::move(options), std::move(impl)));
}

CheckpointStorage::~CheckpointStorage() = default;

absl::Status CheckpointStorage::Upload(const std::string& local_dir) {
  const std::string marker = JoinPath(local_dir, kCheckpointMetadataFile);
  absl::StatusOr<std::string> text = internal::ReadFile(marker);
  if (!text.ok()) return text.status();
  absl::StatusOr<CheckpointMetadata> meta = ParseCheckpointMetadata(*text, marker);
  if (!meta.ok()) return meta.status();
  arrow::fs::FileSystem& fs = *impl_->fs;
  const std::string remote = JoinPath(impl_->root, BaseName(local_dir));
  std::set<std::string> dirs = {remote};
  for (const CheckpointFile& f : meta->files) dirs.insert(ParentOf(JoinPath(remote, f.path)));
  for (const std::string& d : dirs) {
    if (absl::Status s = FromArrow(fs.CreateDir(d, /*recursive=*/true), absl::StrCat("mkdir '", d, "'")); !s.ok()) {
      return s;
    }
  }
  for (const CheckpointFile& f : meta->files) {
    if (absl::Status s = PutFile(fs, JoinPath(local_dir, f.path), JoinPath(remote, f.path)); !s.ok()) return s;
  }
  // The marker last. On S3 one PUT is atomic; elsewhere write a temp name
  // and move it over (rename on a local filesystem).
  const std::string remote_marker = JoinPath(remote, kCheckpointMetadataFile);
  if (impl_->atomic_put) return PutFile(fs, marker, remote_marker);
  const std::string tmp = JoinPath(remote, ".checkpoint.json.uploading");
  if (absl::Status s = PutFile(fs, marker, tmp); !s.ok()) return s;
  return FromArrow(fs.Move(tmp, remote_marker), absl::StrCat("rename to '", remote_marker, "'"));
}

absl::StatusOr<std::vector<RemoteCheckpoint>> CheckpointStorage::ListComplete() const {
  arrow::fs::FileSystem& fs = *impl_->fs;
  arrow::fs::FileSelector sel;
  sel.base_dir = impl_->root;
  sel.recursive = true;
  sel.allow_not_found = true;
  auto infos = fs.GetFileInfo(sel);
  if (!infos.ok()) return FromArrow(infos.status(), absl::StrCat("listing '", description_, "'"));
  std::map<std::string, int64_t> sizes;  // remote path -> bytes
  std::vector<std::string> markers;
  for (const arrow::fs::FileInfo& info : *infos) {
    if (!info.IsFile()) continue;
    sizes[info.path()] = info.size();
    const std::string dir = ParentOf(info.path());
    if (info.base_name() == kCheckpointMetadataFile && ParentOf(dir) == impl_->root &&
        absl::StartsWith(BaseName(dir), "checkpoint_")) {
      markers.push_back(info.path());
    }
  }
  std::sort(markers.begin(), markers.end());  // listings come in no set order
  std::vector<RemoteCheckpoint> out;
  for (const std::string& marker : markers) {
    const std::string dir = ParentOf(marker);
    const std::string where = absl::StrCat(description_, "/", BaseName(dir));
    absl::StatusOr<std::string> text = ReadRemote(fs, marker);
    if (!text.ok()) return text.status();  // an I/O error is not "incomplete": fail, retry later
    absl::StatusOr<CheckpointMetadata> meta = ParseCheckpointMetadata(*text, marker);
    if (!meta.ok()) {
      Warn(absl::StrCat("skipping remote checkpoint '", where, "': ", meta.status().message()));
      continue;
    }
    std::string missing;
    for (const CheckpointFile& f : meta->files) {
      auto it = sizes.find(JoinPath(dir, f.path));
      if (it == sizes.end() || it->second != f.bytes) {
        missing = absl::StrCat(f.path, it == sizes.end() ? " is missing" : " has the wrong size");
        break;
      }
    }
    if (!meta->complete || !missing.empty()) {
      Warn(absl::StrCat("skipping remote checkpoint '", where, "': ",
                        meta->complete ? missing : std::string("not marked complete")));
      continue;
    }
    out.push_back({BaseName(dir), *std::move(meta)});
  }
  std::sort(out.begin(), out.end(), [](const RemoteCheckpoint& a, const RemoteCheckpoint& b) {
    return a.metadata.sequence < b.metadata.sequence;
  });
  return out;
}

absl::StatusOr<std::string> CheckpointStorage::Download(const RemoteCheckpoint& checkpoint,
                                                        const std::string& local_run_dir) {
  arrow::fs::FileSystem& fs = *impl_->fs;
  const std::string remote = JoinPath(impl_->root, checkpoint.name);
  const std::string tmp = JoinPath(local_run_dir, absl::StrCat(".tmp_checkpoint_download_", checkpoint.name));
  const std::string final_dir = JoinPath(local_run_dir, checkpoint.name);
  if (absl::Status s = internal::RemoveAll(tmp); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    for (const CheckpointFile& f : checkpoint.metadata.files) {
      const std::string local = JoinPath(tmp, f.path);
      if (absl::Status s = internal::MakeDirs(ParentOf(local)); !s.ok()) return s;
      if (absl::Status s = GetFile(fs, JoinPath(remote, f.path), local); !s.ok()) return s;
    }
    // Byte-for-byte what the writer committed (CRC-32 of every file).
    if (absl::Status s = VerifyCheckpointFiles(tmp, checkpoint.metadata, VerifyMode::kChecksums); !s.ok()) {
      return s;
    }
    if (absl::Status s = internal::MakeDirs(tmp); !s.ok()) return s;
    return GetFile(fs, JoinPath(remote, kCheckpointMetadataFile), JoinPath(tmp, kCheckpointMetadataFile));
  }();
  if (status.ok()) {
    // The marker downloaded must be the one listed (no upload in between).
    absl::StatusOr<std::string> text = internal::ReadFile(JoinPath(tmp, kCheckpointMetadataFile));
    if (!text.ok()) {
      status = text.status();
    } else if (absl::StatusOr<CheckpointMetadata> m = ParseCheckpointMetadata(*text, remote);
               !m.ok() || m->sequence != checkpoint.metadata.sequence) {
      status = absl::DataLossError(absl::StrCat("remote checkpoint '", description_, "/", checkpoint.name,
                                                "' changed while it was downloaded"));
    }
  }
  if (status.ok() && internal::IsDirectory(final_dir)) status = internal::RemoveAll(final_dir);
  if (status.ok()) status = internal::RenamePath(tmp, final_dir);
  if (status.ok()) status = internal::FsyncPath(local_run_dir);
  if (!status.ok()) {
    (void)internal::RemoveAll(tmp);
    return status;
  }
  return final_dir;
}

absl::StatusOr<std::optional<std::string>> CheckpointStorage::FetchNewestVerified(
    const std::string& local_run_dir) {
  absl::StatusOr<std::vector<RemoteCheckpoint>> remote = ListComplete();
  if (!remote.ok()) return remote.status();
  for (auto it = remote->rbegin(); it != remote->rend(); ++it) {
    const std::string local = JoinPath(local_run_dir, it->name);
    if (internal::IsRegularFile(JoinPath(local, kCheckpointMetadataFile))) return local;
    absl::StatusOr<std::string> got = Download(*it, local_run_dir);
    if (got.ok()) return *got;
    if (!absl::IsDataLoss(got.status())) return got.status();
    Warn(absl::StrCat("remote checkpoint '", description_, "/", it->name,
                      "' is corrupt, trying the next older: ", got.status().message()));
  }
  return std::nullopt;
}

#endif  // TPU_DIST_HAVE_ARROW

}  // namespace tpudist::train
