#include "train/progress_reporter.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tpudist::train {

std::string FormatBar(int64_t step, int64_t total, int width) {
  width = std::max(width, 1);
  int64_t filled = 0;
  if (total > 0) {
    filled = std::clamp<int64_t>(step, 0, total) * width / total;
  }
  return "[" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(width - filled), '.') + "]";
}

std::string FormatProgressBarLine(int64_t epoch, int64_t num_epochs,
                                  int64_t step, int64_t total, double loss,
                                  int width) {
  const int digits = static_cast<int>(absl::StrFormat("%d", total).size());
  return absl::StrFormat("Epoch %d/%d %s %*d/%d loss=%.4f", epoch, num_epochs,
                         FormatBar(step, total, width), digits, step, total,
                         loss);
}

std::string FormatProgressPlainLine(int64_t epoch, int64_t num_epochs,
                                    int64_t step, int64_t total, double loss) {
  return absl::StrFormat("Epoch %d/%d step %d/%d loss=%.4f", epoch, num_epochs,
                         step, total, loss);
}

bool IsTerminal(std::FILE* f) { return f != nullptr && ::isatty(::fileno(f)); }

void ProgressReporter::BeginEpoch(int64_t epoch, int64_t num_epochs,
                                  int64_t total_steps) {
  epoch_ = epoch;
  num_epochs_ = num_epochs;
  total_ = total_steps;
  bar_open_ = false;
}

void ProgressReporter::Update(int64_t step, double loss) {
  if (!options_.enabled) return;
  if (options_.tty) {
    out_ << '\r'
         << FormatProgressBarLine(epoch_, num_epochs_, step, total_, loss,
                                  options_.bar_width)
         << std::flush;
    bar_open_ = true;
    return;
  }
  const int64_t every = std::max<int64_t>(options_.plain_every, 1);
  if (step % every == 0 || step == total_) {
    out_ << FormatProgressPlainLine(epoch_, num_epochs_, step, total_, loss)
         << '\n'
         << std::flush;
  }
}

void ProgressReporter::EndEpoch() {
  if (options_.enabled && options_.tty && bar_open_) out_ << '\n' << std::flush;
  bar_open_ = false;
}

}  // namespace tpudist::train
