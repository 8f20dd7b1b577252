#include "examples/finetune/checkpoint_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "examples/finetune/checkpoint_retention.h"
#include "examples/finetune/internal/fs_util.h"

namespace tpudist::finetune {
namespace {

constexpr char kTempPrefix[] = ".tmp_checkpoint_";
constexpr char kFinalPrefix[] = "checkpoint_";
constexpr char kNameTimeFormat[] = "%Y-%m-%d_%H-%M-%E6S";

std::string Join(absl::string_view a, absl::string_view b) {
  return absl::StrCat(a, "/", b);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    CheckpointManagerOptions options) {
  if (options.storage_path.empty()) {
    return absl::InvalidArgumentError("checkpoint storage_path is empty");
  }
  const std::string& name = options.run_name;
  if (name.empty() || name == "." || name == ".." ||
      absl::StrContains(name, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint run_name '", name,
                     "' must be a single non-empty path component"));
  }
  if (!options.now) options.now = [] { return absl::Now(); };
  if (!options.warn) {
    options.warn = [](absl::string_view msg) {
      std::fprintf(stderr, "[checkpoint] warning: %.*s\n",
                   static_cast<int>(msg.size()), msg.data());
    };
  }
  std::string run_dir = Join(options.storage_path, name);
  if (absl::Status st = internal::MakeDirs(run_dir); !st.ok()) return st;
  std::unique_ptr<CheckpointManager> m(
      new CheckpointManager(std::move(options), std::move(run_dir)));
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
  std::set<std::string> subdirs;
  for (const std::string& rel : *files) {
    if (rel == kCheckpointMetadataFile) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", Join(pending.path, rel), "': the name ",
                       kCheckpointMetadataFile, " is reserved"));
    }
    const std::string path = Join(pending.path, rel);
    auto size = internal::FileSize(path);
    if (!size.ok()) return size.status();
    if (absl::Status st = internal::FsyncPath(path); !st.ok()) return st;
    meta.files.push_back({rel, *size});
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

  auto existing = ListComplete();
  if (!existing.ok()) return existing.status();
  int64_t max_seq = 0;
  for (const CheckpointInfo& c : *existing) {
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
  const std::string marker_tmp = absl::StrCat(marker, ".tmp");
  if (absl::Status st =
          internal::WriteFileSynced(marker_tmp, CheckpointMetadataToJson(meta));
      !st.ok()) {
    return st;
  }
  if (absl::Status st = internal::RenamePath(marker_tmp, marker); !st.ok())
    return st;
  if (absl::Status st = internal::FsyncPath(info.path); !st.ok()) return st;
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

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointManager::ListComplete()
    const {
  auto names = internal::ListDir(run_dir_);
  if (!names.ok()) return names.status();
  std::vector<CheckpointInfo> out;
  for (const std::string& n : *names) {
    if (!absl::StartsWith(n, kFinalPrefix)) continue;
    const std::string dir = Join(run_dir_, n);
    if (!internal::IsDirectory(dir)) continue;
    const std::string marker = Join(dir, kCheckpointMetadataFile);
    auto body = internal::ReadFile(marker);
    if (!body.ok()) {
      Warn(absl::StrCat("skipping incomplete checkpoint '", dir, "': no ",
                        kCheckpointMetadataFile, " (", body.status().message(),
                        ")"));
      continue;
    }
    auto meta = ParseCheckpointMetadata(*body, marker);
    if (!meta.ok()) {
      Warn(absl::StrCat("skipping checkpoint '", dir,
                        "': ", meta.status().message()));
      continue;
    }
    if (!meta->complete) {
      Warn(absl::StrCat("skipping checkpoint '", dir,
                        "': not marked complete"));
      continue;
    }
    if (absl::Status st = VerifyCheckpointFiles(dir, *meta); !st.ok()) {
      Warn(absl::StrCat("skipping checkpoint '", dir, "': ", st.message()));
      continue;
    }
    out.push_back({dir, *std::move(meta)});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) {
              return a.metadata.sequence < b.metadata.sequence;
            });
  return out;
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
  if (options_.num_to_keep <= 0) return absl::OkStatus();
  auto all = ListComplete();
  if (!all.ok()) return all.status();
  std::vector<RetentionCandidate> candidates;
  for (const CheckpointInfo& c : *all) {
    candidates.push_back({c.metadata.sequence, c.metadata.loss});
  }
  const std::vector<int64_t> doomed =
      CheckpointsToDelete(candidates, options_.num_to_keep, latest_sequence);
  for (const CheckpointInfo& c : *all) {
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

}  // namespace tpudist::finetune
