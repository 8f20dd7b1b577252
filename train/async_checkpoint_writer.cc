#include "train/async_checkpoint_writer.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "collectives/exception_message.h"

namespace tpudist::train {
namespace {

constexpr char kOk[] = "ok";

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

}  // namespace

AsyncCheckpointWriter::AsyncCheckpointWriter(AsyncCheckpointWriterOptions options)
    : options_(std::move(options)), result_(std::string()) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  cancelled_ = true;
  if (thread_) thread_->join();
}

void AsyncCheckpointWriter::Start(int64_t sequence, std::function<absl::Status()> write,
                                  std::function<absl::StatusOr<std::string>()> commit) {
  if (thread_) std::terminate();  // programmer error: REQUIRES !in_flight()
  thread_.emplace([this, sequence, write = std::move(write), commit = std::move(commit)] {
    result_ = Run(sequence, write, commit);
  });
}

absl::StatusOr<std::string> AsyncCheckpointWriter::Wait() {
  if (!thread_) return std::string();
  thread_->join();
  thread_.reset();
  absl::StatusOr<std::string> out = std::move(result_);
  result_ = std::string();
  return out;
}

absl::StatusOr<std::string> AsyncCheckpointWriter::WaitForKey(const std::string& key, absl::Time deadline) {
  absl::Duration nap = absl::Milliseconds(2);
  while (true) {
    try {
      if (options_.store->check({key})) {
        const std::vector<uint8_t> v = options_.store->get(key);
        return std::string(v.begin(), v.end());
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("async checkpoint: rank ", options_.rank, ": store lookup of ",
                                                 key, ": ", collectives::ExceptionMessage(e)));
    }
    if (cancelled_) {
      return absl::CancelledError(absl::StrCat("async checkpoint: rank ", options_.rank, ": cancelled waiting for ", key));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("async checkpoint: rank ", options_.rank, ": no ", key,
                                                      " after ", absl::FormatDuration(options_.timeout)));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(50));
  }
}

absl::StatusOr<std::string> AsyncCheckpointWriter::Run(
    int64_t sequence, const std::function<absl::Status()>& write,
    const std::function<absl::StatusOr<std::string>()>& commit) {
  const std::string base = absl::StrCat(options_.key_prefix, "/", sequence);
  const std::string committed_key = base + "/committed";
  const absl::Status mine = write();
  try {
    options_.store->set(absl::StrCat(base, "/done/", options_.rank),
                        Bytes(mine.ok() ? std::string(kOk) : mine.ToString()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("async checkpoint: rank ", options_.rank,
                                               ": posting its part: ", collectives::ExceptionMessage(e)));
  }
  if (!mine.ok()) return mine;
  const absl::Time deadline = absl::Now() + options_.timeout;
  if (options_.rank != 0) {
    absl::StatusOr<std::string> v = WaitForKey(committed_key, deadline);
    if (!v.ok()) return v.status();
    if (!absl::StartsWith(*v, "ok:")) {
      return absl::AbortedError(absl::StrCat("async checkpoint ", sequence, " not committed: ", *v));
    }
    return std::string();
  }
  // Rank 0: every part written, then commit.
  absl::Status all = absl::OkStatus();
  for (int r = 0; r < options_.world_size && all.ok(); ++r) {
    absl::StatusOr<std::string> v = WaitForKey(absl::StrCat(base, "/done/", r), deadline);
    if (!v.ok()) {
      all = v.status();
    } else if (*v != kOk) {
      all = absl::AbortedError(absl::StrCat("async checkpoint ", sequence, ": rank ", r, "'s part failed: ", *v));
    }
  }
  if (all.ok() && cancelled_) all = absl::CancelledError("async checkpoint: rank 0: cancelled before the commit");
  absl::StatusOr<std::string> path = all.ok() ? commit() : absl::StatusOr<std::string>(all);
  try {
    options_.store->set(committed_key,
                        Bytes(path.ok() ? absl::StrCat("ok:", *path) : path.status().ToString()));
  } catch (const std::exception& e) {
    if (path.ok()) {
      return absl::UnavailableError(absl::StrCat("async checkpoint: rank 0: posting the commit of ", *path, ": ",
                                                 collectives::ExceptionMessage(e)));
    }
  }
  return path;
}

}  // namespace tpudist::train
