#include "train/checkpoint_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "train/checkpoint_retention.h"
#include "train/file_checksum.h"
#include "train/internal/fs_util.h"
#include "io/atomic_file.h"

namespace tpudist::train {
namespace {

constexpr char kTempPrefix[] = ".tmp_checkpoint_";
constexpr char kFinalPrefix[] = "checkpoint_";
constexpr char kNameTimeFormat[] = "%Y-%m-%d_%H-%M-%E6S";
constexpr char kQuarantinedMarker[] = "checkpoint.json.corrupt";

std::string Join(absl::string_view a, absl::string_view b) {
  return absl::StrCat(a, "/", b);
}

}  // namespace

absl::StatusOr<std::string> RunDirPath(const std::string& storage_path,
                                       const std::string& run_name) {
  if (storage_path.empty()) {
    return absl::InvalidArgumentError("checkpoint storage_path is empty");
  }
  if (run_name.empty() || run_name == "." || run_name == ".." ||
      absl::StrContains(run_name, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint run_name '", run_name,
                     "' must be a single non-empty path component"));
  }
  return Join(storage_path, run_name);
}

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    CheckpointManagerOptions options) {
  absl::StatusOr<std::string> run_dir = RunDirPath(options.storage_path, options.run_name);
  if (!run_dir.ok()) return run_dir.status();
  if (!options.now) options.now = [] { return absl::Now(); };
  if (!options.warn) {
    options.warn = [](absl::string_view msg) {
      std::fprintf(stderr, "[checkpoint] warning: %.*s\n",
                   static_cast<int>(msg.size()), msg.data());
    };
  }
  if (!options.error) {
    options.error = [](absl::string_view msg) {
      std::fprintf(stderr, "[checkpoint] error: %.*s\n",
                   static_cast<int>(msg.size()), msg.data());
    };
  }
  if (absl::Status st = internal::MakeDirs(*run_dir); !st.ok()) return st;
  std::unique_ptr<CheckpointManager> m(
      new CheckpointManager(std::move(options), *std::move(run_dir)));
  if (absl::Status st = m->RemoveStaleTempDirs(); !st.ok()) return st;
  return m;
}

void CheckpointManager::Warn(absl::string_view msg) const {
  options_.warn(msg);
}

absl::Status CheckpointManager::RemoveStaleTempDirs() {
  auto names = internal::ListDir(run_dir_);
  if (!names.ok()) return names.status();
  for (const std::string& n : *names) {
    if (!absl::StartsWith(n, kTempPrefix)) continue;
    const std::string path = Join(run_dir_, n);
    Warn(absl::StrCat("removing stale temporary checkpoint '", path, "'"));
    if (absl::Status st = internal::RemoveAll(path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<PendingCheckpoint> CheckpointManager::BeginWrite() {
  const std::string stamp =
      absl::FormatTime(kNameTimeFormat, options_.now(), absl::UTCTimeZone());
  PendingCheckpoint p;
  p.path = Join(run_dir_, absl::StrCat(kTempPrefix, stamp, "_", ::getpid(),
                                       "_", temp_counter_++));
  if (internal::IsDirectory(p.path)) {
    return absl::AlreadyExistsError(
        absl::StrCat("temporary checkpoint '", p.path, "' already exists"));
  }
  if (absl::Status st = internal::MakeDirs(p.path); !st.ok()) return st;
  return p;
}

std::string CheckpointManager::UniqueFinalName() const {
  const std::string base = absl::StrCat(
      kFinalPrefix,
      absl::FormatTime(kNameTimeFormat, options_.now(), absl::UTCTimeZone()));
  std::string name = base;
  for (int i = 1; internal::IsDirectory(Join(run_dir_, name)); ++i) {
    name = absl::StrCat(base, "_", i);
  }
  return name;
}

absl::StatusOr<CheckpointInfo> CheckpointManager::Commit(
    const PendingCheckpoint& pending, const CheckpointReport& report) {
  const std::string prefix = Join(run_dir_, kTempPrefix);
  if (!absl::StartsWith(pending.path, prefix) ||
      absl::StrContains(pending.path.substr(prefix.size()), '/') ||
      !internal::IsDirectory(pending.path)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", pending.path, "' is not a pending checkpoint of ", run_dir_));
  }
  auto files = internal::ListFilesRecursive(pending.path);
  if (!files.ok()) return files.status();

  CheckpointMetadata meta;
  meta.epoch = report.epoch;
  meta.step = report.step;
  meta.loss = report.loss;
  meta.complete = true;
  meta.created = options_.now();
  meta.job = report.job;
  std::set<std::string> subdirs;
  for (const std::string& rel : *files) {
    if (rel == kCheckpointMetadataFile) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", Join(pending.path, rel), "': the name ",
                       kCheckpointMetadataFile, " is reserved"));
    }
    const std::string path = Join(pending.path, rel);
    absl::StatusOr<FileDigest> digest = DigestFile(path);
    if (!digest.ok()) return digest.status();
    if (absl::Status st = internal::FsyncPath(path); !st.ok()) return st;
    meta.files.push_back({rel, digest->bytes, digest->crc32});
    for (size_t slash = rel.find('/'); slash != std::string::npos;
         slash = rel.find('/', slash + 1)) {
      subdirs.insert(rel.substr(0, slash));
    }
  }
  // Directories deepest first, then the checkpoint root.
  for (auto it = subdirs.rbegin(); it != subdirs.rend(); ++it) {
    if (absl::Status st = internal::FsyncPath(Join(pending.path, *it));
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = internal::FsyncPath(pending.path); !st.ok()) return st;

  absl::StatusOr<Scan> existing = ScanRunDir();
  if (!existing.ok()) return existing.status();
  int64_t max_seq = 0;
  for (const CheckpointInfo& c : existing->complete) {
    max_seq = std::max(max_seq, c.metadata.sequence);
  }
  meta.sequence = max_seq + 1;

  CheckpointInfo info;
  info.path = Join(run_dir_, UniqueFinalName());
  if (absl::Status st = internal::RenamePath(pending.path, info.path); !st.ok())
    return st;
  if (absl::Status st = internal::FsyncPath(run_dir_); !st.ok()) return st;

  // The marker goes in last, itself atomically.
  const std::string marker = Join(info.path, kCheckpointMetadataFile);
  if (absl::Status st =
          io::WriteFileAtomically(marker, CheckpointMetadataToJson(meta));
      !st.ok()) {
    return st;
  }
  info.metadata = std::move(meta);

  if (absl::Status st = Prune(info.metadata.sequence); !st.ok()) return st;
  return info;
}

absl::Status CheckpointManager::Abandon(const PendingCheckpoint& pending) {
  if (!absl::StartsWith(pending.path, Join(run_dir_, kTempPrefix))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", pending.path, "' is not a pending checkpoint of ", run_dir_));
  }
  return internal::RemoveAll(pending.path);
}

absl::StatusOr<CheckpointManager::Scan> CheckpointManager::ScanRunDir() const {
  auto names = internal::ListDir(run_dir_);
  if (!names.ok()) return names.status();
  Scan out;
  for (const std::string& n : *names) {
    if (!absl::StartsWith(n, kFinalPrefix)) continue;
    const std::string dir = Join(run_dir_, n);
    if (!internal::IsDirectory(dir)) continue;
    const std::string marker = Join(dir, kCheckpointMetadataFile);
    absl::StatusOr<std::string> body = reader_.ReadFile(marker);
    if (!body.ok()) {
      if (IsCheckpointIoError(body.status())) {
        out.unreadable.push_back({dir, std::string(body.status().message())});
      } else if (!absl::IsNotFound(body.status())) {
        out.corrupt.push_back({dir, std::string(body.status().message())});
      } else if (internal::IsRegularFile(Join(dir, kQuarantinedMarker))) {
        out.quarantined.push_back(dir);
      } else {
        out.incomplete.push_back(dir);
      }
      continue;
    }
    auto meta = ParseCheckpointMetadata(*body, marker);
    if (!meta.ok()) {
      out.corrupt.push_back({dir, std::string(meta.status().message())});
      continue;
    }
    if (!meta->complete) {
      out.corrupt.push_back({dir, absl::StrCat(marker, ": not marked complete")});
      continue;
    }
    if (absl::Status st =
            VerifyCheckpointFiles(dir, *meta, VerifyMode::kSizes, {}, reader_);
        !st.ok()) {
      (IsCheckpointIoError(st) ? out.unreadable : out.corrupt)
          .push_back({dir, std::string(st.message())});
      continue;
    }
    out.complete.push_back({dir, *std::move(meta)});
  }
  std::sort(out.complete.begin(), out.complete.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) {
              return a.metadata.sequence < b.metadata.sequence;
            });
  return out;
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointManager::ListComplete()
    const {
  absl::StatusOr<Scan> scan = ScanRunDir();
  if (!scan.ok()) return scan.status();
  for (const std::string& dir : scan->incomplete) {
    Warn(absl::StrCat("skipping incomplete checkpoint '", dir, "': no ",
                      kCheckpointMetadataFile));
  }
  for (const auto& [dir, why] : scan->corrupt) {
    Warn(absl::StrCat("skipping checkpoint '", dir, "': ", why));
  }
  for (const auto& [dir, why] : scan->unreadable) {
    Warn(absl::StrCat("skipping checkpoint '", dir, "' for now: ", why));
  }
  return std::move(scan->complete);
}

absl::Status CheckpointManager::Verify(const CheckpointInfo& c) const {
  return VerifyCheckpointFiles(c.path, c.metadata, VerifyMode::kChecksums, {},
                               reader_);
}

absl::Status CheckpointManager::UnreadableError(absl::string_view why) const {
  return absl::UnavailableError(absl::StrCat(
      "cannot verify the checkpoints in '", run_dir_, "': ", why,
      ". Nothing was quarantined (an I/O error is not evidence of corruption)"));
}

void CheckpointManager::Quarantine(const std::string& dir,
                                   absl::string_view why) {
  const std::string marker = Join(dir, kCheckpointMetadataFile);
  const std::string moved = Join(dir, kQuarantinedMarker);
  absl::Status st = internal::RenamePath(marker, moved);
  if (st.ok()) st = internal::FsyncPath(dir);
  options_.error(absl::StrCat(
      "checkpoint '", dir, "' is corrupt and will not be loaded: ", why,
      st.ok() ? absl::StrCat(" (", kCheckpointMetadataFile, " renamed to ",
                             kQuarantinedMarker, "; directory kept for inspection)")
              : absl::StrCat(" (could not quarantine it: ", st.message(), ")")));
}

absl::StatusOr<std::optional<CheckpointInfo>>
CheckpointManager::LatestVerified() {
  absl::StatusOr<Scan> scan = ScanRunDir();
  if (!scan.ok()) return scan.status();
  for (const std::string& dir : scan->incomplete) {
    Warn(absl::StrCat("skipping incomplete checkpoint '", dir, "': no ",
                      kCheckpointMetadataFile, " (a commit that did not finish)"));
  }
  std::vector<std::string> bad;
  for (const auto& [dir, why] : scan->corrupt) {
    Quarantine(dir, why);
    bad.push_back(why);
  }
  // A marker that cannot be read hides the checkpoint's sequence: it may be
  // the newest one, so no other can be picked safely.
  if (!scan->unreadable.empty()) {
    std::vector<std::string> whys;
    for (const auto& [dir, why] : scan->unreadable) whys.push_back(why);
    return UnreadableError(absl::StrJoin(whys, "; "));
  }
  for (auto it = scan->complete.rbegin(); it != scan->complete.rend(); ++it) {
    absl::Status st = Verify(*it);
    if (st.ok()) {
      if (!it->metadata.manifest_checksum) {
        Warn(absl::StrCat(
            "checkpoint '", it->path, "' was written by an older build: its ",
            kCheckpointMetadataFile, " (format 2) has no checksum of its own, so damage to "
            "its fields (epoch, step, ...) cannot be detected; its files' CRC-32s did verify. "
            "Checkpoints written from now on carry one"));
      }
      return std::optional<CheckpointInfo>(*it);
    }
    if (IsCheckpointIoError(st)) return UnreadableError(st.message());
    if (!absl::IsDataLoss(st)) return st;
    Quarantine(it->path, st.message());
    bad.push_back(std::string(st.message()));
  }
  if (bad.empty() && scan->quarantined.empty()) {
    return std::optional<CheckpointInfo>();
  }
  std::string why = absl::StrJoin(bad, "; ");
  if (!scan->quarantined.empty()) {
    absl::StrAppend(&why, bad.empty() ? "" : "; ", "found corrupt earlier (",
                    kQuarantinedMarker, "): ", absl::StrJoin(scan->quarantined, ", "));
  }
  return absl::DataLossError(absl::StrCat(
      "no checkpoint in '", run_dir_, "' passes verification (",
      bad.size() + scan->quarantined.size(), " corrupt: ", why, ")"));
}

absl::StatusOr<std::optional<CheckpointInfo>>
CheckpointManager::LatestComplete() const {
  auto all = ListComplete();
  if (!all.ok()) return all.status();
  if (all->empty()) return std::optional<CheckpointInfo>();
  return std::optional<CheckpointInfo>(all->back());
}

absl::StatusOr<std::optional<CheckpointInfo>> CheckpointManager::Best() const {
  auto all = ListComplete();
  if (!all.ok()) return all.status();
  std::optional<CheckpointInfo> best;
  for (CheckpointInfo& c : *all) {
    if (!best || BetterCheckpoint({c.metadata.sequence, c.metadata.loss},
                                  {best->metadata.sequence,
                                   best->metadata.loss})) {
      best = std::move(c);
    }
  }
  return best;
}

absl::Status CheckpointManager::Prune(int64_t latest_sequence) {
  absl::StatusOr<Scan> scan = ScanRunDir();
  if (!scan.ok()) return scan.status();
  // Commits that never finished: garbage whatever num_to_keep says (as the
  // one writer, no commit of ours is in flight).
  for (const std::string& dir : scan->incomplete) {
    Warn(absl::StrCat("removing incomplete checkpoint '", dir, "': no ",
                      kCheckpointMetadataFile));
    if (absl::Status st = internal::RemoveAll(dir); !st.ok()) return st;
  }
  if (options_.num_to_keep <= 0) return absl::OkStatus();
  const std::vector<CheckpointInfo>& all = scan->complete;
  std::vector<RetentionCandidate> candidates;
  for (const CheckpointInfo& c : all) {
    candidates.push_back({c.metadata.sequence, c.metadata.loss});
  }
  const std::vector<int64_t> doomed =
      CheckpointsToDelete(candidates, options_.num_to_keep, latest_sequence);
  for (const CheckpointInfo& c : all) {
    if (!std::binary_search(doomed.begin(), doomed.end(),
                            c.metadata.sequence)) {
      continue;
    }
    // Remove the marker first so a crash mid-delete leaves an incomplete
    // directory, never a complete-looking partial one.
    const std::string marker = Join(c.path, kCheckpointMetadataFile);
    if (::unlink(marker.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot remove '", marker, "' while pruning"));
    }
    if (absl::Status st = internal::RemoveAll(c.path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace tpudist::train
