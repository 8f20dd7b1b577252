// Reading a Dolly-format instruction set: JSONL, one object per line with
// the string fields "instruction", "context", "response" and "category"
// (databricks-dolly-15k's schema; data/instructions/train.jsonl follows it).
//
// Error contract: every error names the file; errors about a record name
// its 1-based line number and, where relevant, the field. Examples:
//   data.jsonl:17: bad JSON: [json.exception.parse_error.101] ...
//   data.jsonl:3: missing field "response"
//   data.jsonl:9: field "context" must be a string, got number
//   data.jsonl: empty file (no records)
//   data.jsonl: split 'train[5000:]' selects no rows: ...
//
// Lines that are empty or only whitespace are skipped (a trailing newline
// or blank separator line is not a record); every other line must be one
// JSON object. Extra fields are ignored. A trailing '\r' is stripped.
//
// Row size: a line longer than max_row_bytes is refused before it is
// parsed, read into memory or tokenized (a 50 MB row took 20 s and 741 MB
// before any check), e.g.
//   data.jsonl:7: row is 52428800 bytes, over the limit of 1048576 bytes per
//   row (...): shorten or remove the row
// ReadDollyJsonl streams the file, so its memory is the rows it keeps plus
// one line of at most max_row_bytes. The fine-tune's limit follows its
// sequence length (MaxRowBytesForSeqLen).
//
// All functions are free of hidden state and safe to call from any thread.
#ifndef TPU_DIST_TRAIN_DOLLY_DATASET_H_
#define TPU_DIST_TRAIN_DOLLY_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::train {

struct DollyExample {
  std::string instruction;
  std::string context;  // often empty
  std::string response;
  std::string category;  // open_qa, closed_qa, classification, ...
  int64_t line = 0;      // 1-based line in the source file, for messages
};

// The per-row byte limit for rows tokenized to max_seq_len tokens:
// max(kMinMaxRowBytes, kMaxRowBytesPerToken x max_seq_len). No tokenizer
// spends a kilobyte of text on one token, so a longer row is almost all
// text that truncation would throw away. Pure.
inline constexpr int64_t kMinMaxRowBytes = int64_t{1} << 20;  // 1 MiB
inline constexpr int64_t kMaxRowBytesPerToken = 1024;
int64_t MaxRowBytesForSeqLen(int64_t max_seq_len);

// Parses one JSONL line. `file` and `line` are only used in messages.
absl::StatusOr<DollyExample> ParseDollyLine(absl::string_view text,
                                            absl::string_view file,
                                            int64_t line);

// Parses a whole JSONL document held in memory (`file` names it in errors).
// An input without any record is an error.
// A line longer than max_row_bytes is an error (see the top).
absl::StatusOr<std::vector<DollyExample>> ParseDollyJsonl(
    absl::string_view contents, absl::string_view file,
    int64_t max_row_bytes = kMinMaxRowBytes);

// Reads `path` line by line and parses it. NotFound / PermissionDenied etc.
// name the path; a line longer than max_row_bytes is an error naming its
// line and size, found without holding more than max_row_bytes of it.
absl::StatusOr<std::vector<DollyExample>> ReadDollyJsonl(
    const std::string& path, int64_t max_row_bytes = kMinMaxRowBytes);

// Reads `path` and returns the rows selected by `split` (split_spec.h
// syntax). A single JSONL file holds exactly one split, named "train" as in
// HF datasets' json loader; any other name is an error naming the value.
// Every row of the file, selected or not, must be valid and at most
// max_row_bytes long.
absl::StatusOr<std::vector<DollyExample>> LoadDollySplit(
    const std::string& path, absl::string_view split,
    int64_t max_row_bytes = kMinMaxRowBytes);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_DOLLY_DATASET_H_
