// What tpurun does with the ranks' flight-recorder dumps
// (collectives/flight_recorder_dump.h) when a job fails: where the dumps go,
// which ranks have written one, and torch's analyzer verdict on them.
//
// The analyzer is torch's own (`python -m
// torch.distributed.flight_recorder.fr_trace`), run as a subprocess: the
// launcher itself never loads torch. Its output is cut to the lines that
// carry the verdict, and VerdictHeadline() condenses those into one line
// ("sequence id 3, tpu_dist:all_reduce: ranks {1} never joined").
//
// Everything here is bounded: RunFlightRecorderAnalyzer kills the analyzer
// at its timeout, and a missing Python or torch is one line of text, never an
// error that stops the launcher. Thread-compatible; call from one thread
// (RunFlightRecorderAnalyzer starts a child process).
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_FLIGHT_RECORDER_VERDICT_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_FLIGHT_RECORDER_VERDICT_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tpudist::tpu_runtime::launcher {

inline constexpr char kFlightRecorderDirEnv[] = "TPU_DIST_FLIGHT_RECORDER_DIR";
inline constexpr char kFlightRecorderSizeEnv[] = "TPU_DIST_FLIGHT_RECORDER_SIZE";
inline constexpr char kTorchDumpPrefixEnv[] = "TORCH_FR_DUMP_TEMP_FILE";
inline constexpr char kFlightRecorderAnalyzerEnv[] = "TPU_DIST_FR_ANALYZER";

// Where the ranks' dumps of one attempt are: <dir>/<file_prefix><rank>.
struct DumpLocation {
  std::string dir;
  std::string file_prefix = "tpu_dist_fr_rank_";
  // The launcher chose `dir` (it sets TPU_DIST_FLIGHT_RECORDER_DIR for its
  // ranks); false when the user's own variable says where dumps go.
  bool set_by_launcher = false;
};

// The dump location of attempt `restart`, from the launcher's environment
// (`lookup` returns a variable's value or nullptr). std::nullopt when the
// ranks record nothing (TPU_DIST_FLIGHT_RECORDER_SIZE=0). The user's
// TPU_DIST_FLIGHT_RECORDER_DIR, else TORCH_FR_DUMP_TEMP_FILE (<prefix><rank>),
// is used as given (every attempt writes there); else the launcher's own
// per-job directory, ${TMPDIR:-/tmp}/tpurun_fr/<job_id>/attempt_<restart>.
std::optional<DumpLocation> ResolveDumpLocation(
    const std::function<const char*(const char*)>& lookup, absl::string_view job_id,
    int restart);

// The ranks among `ranks` whose dump file exists, in the given order.
std::vector<int> RanksWithDumps(const DumpLocation& where, const std::vector<int>& ranks);

// The Python that runs the analyzer: `flag` (--fr-analyzer), else
// TPU_DIST_FR_ANALYZER, else the job's own interpreter when the rank command
// is one (its argv[0]'s file name starts with "python"), else the active
// virtualenv's (`virtual_env`: VIRTUAL_ENV, <it>/bin/python), else "python3"
// (searched in PATH). "none" (from the flag or the variable): "", no
// analysis.
std::string ChooseAnalyzerPython(absl::string_view flag, const char* env_value,
                                 const std::vector<std::string>& command,
                                 const char* virtual_env);

// The analyzer's command line on `where` (with --allow-incomplete-ranks when
// some ranks left no dump).
std::vector<std::string> AnalyzerArgv(const std::string& python, const DumpLocation& where,
                                      bool incomplete);

// The verdict lines of the analyzer's output, in order: without its
// per-entry "unrecognized comm library" warnings, blank lines and empty
// "stack trace" lines; at most `max_lines` (then one "... N more lines").
std::vector<std::string> VerdictLines(absl::string_view output, size_t max_lines);

// One line naming the first problem in `lines` (from VerdictLines), e.g.
// "sequence id 3, tpu_dist:all_reduce: ranks {1} never joined" or
// "sequence id 3, tpu_dist:all_gather: Culprit rank 0; Error type: ...";
// "" when the analyzer found none.
std::string VerdictHeadline(const std::vector<std::string>& lines);

// Runs the analyzer on the dumps of `ranks` in `where` and returns what the
// launcher prints (without its own prefix): a headline, the verdict lines,
// and which ranks left no dump; or one line saying why there is no verdict
// (no Python, no torch in it, timed out after `timeout`). Nothing (and no
// analyzer run) when no rank left a dump.
std::vector<std::string> FlightRecorderVerdict(const DumpLocation& where,
                                               const std::vector<int>& ranks,
                                               const std::string& python, absl::Duration timeout);

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_FLIGHT_RECORDER_VERDICT_H_
