// Step progress for rank 0's console: a redrawn bar on a terminal, plain
// periodic lines otherwise (log files, CI, `tpurun` prefixing), so logs are
// not flooded with carriage returns.
//
//   TTY:   "\rEpoch 1/3 [#########...........]  45/100 loss=3.1402"
//   plain: "Epoch 1/3 step 45/100 loss=3.1402"  every `plain_every` steps
//          and at the last step.
//
// The formatting functions are pure. ProgressReporter writes to a stream it
// does not own (REQUIRES: it outlives the reporter); thread-compatible.
#ifndef TPU_DIST_TRAIN_PROGRESS_REPORTER_H_
#define TPU_DIST_TRAIN_PROGRESS_REPORTER_H_

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>

namespace tpudist::train {

// "[#########...........]" of `width` cells between the brackets;
// step is clamped to [0, total]; total <= 0 draws an empty bar.
std::string FormatBar(int64_t step, int64_t total, int width);

// The TTY line without the leading '\r'.
std::string FormatProgressBarLine(int64_t epoch, int64_t num_epochs,
                                  int64_t step, int64_t total, double loss,
                                  int width);

// The plain line.
std::string FormatProgressPlainLine(int64_t epoch, int64_t num_epochs,
                                    int64_t step, int64_t total, double loss);

// isatty(fileno(f)).
bool IsTerminal(std::FILE* f);

struct ProgressOptions {
  bool enabled = true;    // false on ranks other than 0
  bool tty = false;       // IsTerminal(stdout) in the trainer
  int64_t plain_every = 10;  // plain mode: print every N steps (>= 1)
  int bar_width = 30;
};

class ProgressReporter {
 public:
  ProgressReporter(std::ostream& out, ProgressOptions options)
      : out_(out), options_(options) {}

  // Starts an epoch of `total_steps` steps.
  void BeginEpoch(int64_t epoch, int64_t num_epochs, int64_t total_steps);
  // Reports that `step` (1-based) finished with `loss`.
  void Update(int64_t step, double loss);
  // Ends the epoch's bar with a newline (TTY mode); no-op in plain mode.
  void EndEpoch();

 private:
  std::ostream& out_;
  ProgressOptions options_;
  int64_t epoch_ = 0;
  int64_t num_epochs_ = 0;
  int64_t total_ = 0;
  bool bar_open_ = false;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_PROGRESS_REPORTER_H_
