#include "examples/finetune/dolly_dataset.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "examples/finetune/internal/fs_util.h"
#include "examples/finetune/split_spec.h"

namespace tpudist::finetune {
namespace {

constexpr const char* kFields[] = {"instruction", "context", "response",
                                   "category"};

absl::Status LineError(absl::string_view file, int64_t line,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", what));
}

}  // namespace

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
    absl::string_view contents, absl::string_view file) {
  std::vector<DollyExample> out;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < contents.size()) {
    size_t nl = contents.find('\n', pos);
    if (nl == absl::string_view::npos) nl = contents.size();
    absl::string_view line = contents.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto ex = ParseDollyLine(line, file, line_no);
    if (!ex.ok()) return ex.status();
    out.push_back(*std::move(ex));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": empty file (no records)"));
  }
  return out;
}

absl::StatusOr<std::vector<DollyExample>> ReadDollyJsonl(
    const std::string& path) {
  auto contents = internal::ReadFile(path);
  if (!contents.ok()) return contents.status();
  return ParseDollyJsonl(*contents, path);
}

absl::StatusOr<std::vector<DollyExample>> LoadDollySplit(
    const std::string& path, absl::string_view split) {
  auto spec = ParseSplit(split);
  if (!spec.ok()) return spec.status();
  if (spec->name != "train") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unknown split '", spec->name, "' in '", split,
        "' (a JSONL file has one split, 'train')"));
  }
  auto rows = ReadDollyJsonl(path);
  if (!rows.ok()) return rows.status();
  auto range = ResolveSplit(*spec, static_cast<int64_t>(rows->size()), split);
  if (!range.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", range.status().message()));
  }
  return std::vector<DollyExample>(rows->begin() + range->begin,
                                   rows->begin() + range->end);
}

}  // namespace tpudist::finetune
