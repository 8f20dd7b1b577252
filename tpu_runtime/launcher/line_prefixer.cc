#include "tpu_runtime/launcher/line_prefixer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpudist::tpu_runtime::launcher {

std::string RankLabel(int rank, int world_size) {
  int width = 1;
  for (int largest = world_size - 1; largest >= 10; largest /= 10) ++width;
  return absl::StrFormat("[rank %*d] ", width, rank);
}

LinePrefixer::LinePrefixer(std::string prefix, size_t max_line)
    : prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}

std::string LinePrefixer::Feed(absl::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    size_t newline = bytes.find('\n');
    size_t room = max_line_ > pending_.size() ? max_line_ - pending_.size() : 0;
    if (newline != absl::string_view::npos && newline <= room) {
      // A complete line: held bytes + this piece up to and including '\n'.
      absl::StrAppend(&out, prefix_, pending_, bytes.substr(0, newline + 1));
      pending_.clear();
      bytes.remove_prefix(newline + 1);
    } else if (bytes.size() < room) {
      // No newline and still room: hold it.
      pending_.append(bytes.data(), bytes.size());
      bytes = absl::string_view();
    } else {
      // Overlong line: emit max_line_ bytes as a line of their own.
      absl::StrAppend(&out, prefix_, pending_, bytes.substr(0, room), "\n");
      pending_.clear();
      bytes.remove_prefix(room);
    }
  }
  return out;
}

std::string LinePrefixer::Finish() {
  if (pending_.empty()) return "";
  std::string out = absl::StrCat(prefix_, pending_, "\n");
  pending_.clear();
  return out;
}

}  // namespace tpudist::tpu_runtime::launcher
