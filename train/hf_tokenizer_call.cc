#include "train/hf_tokenizer_call.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::train {
namespace {

using json = nlohmann::json;

absl::StatusOr<Side> ParseSide(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) {
    return Side::kRight;
  }
  const json& v = config[key];
  if (v.is_string() && v.get<std::string>() == "left") return Side::kLeft;
  if (v.is_string() && v.get<std::string>() == "right") return Side::kRight;
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer_config.json: \"", key, "\" must be \"left\" or \"right\", got ", v.dump()));
}

// The ids of TemplateProcessing special token `name` (its "special_tokens"
// entry).
absl::StatusOr<int> SpecialId(const json& proc, const std::string& name) {
  const json* entry = nullptr;
  if (proc.contains("special_tokens") && proc["special_tokens"].is_object() &&
      proc["special_tokens"].contains(name)) {
    entry = &proc["special_tokens"][name];
  }
  if (entry == nullptr || !entry->contains("ids") || !(*entry)["ids"].is_array() ||
      (*entry)["ids"].size() != 1 || !(*entry)["ids"][0].is_number_integer()) {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer.json: post_processor special token \"", name, "\" needs exactly one id"));
  }
  return (*entry)["ids"][0].get<int>();
}

// Fills call->bos_id / eos_id from one processor.
absl::Status ApplyProcessor(const json& proc, HfTokenizerCall* call) {
  if (proc.is_null()) return absl::OkStatus();
  const std::string type = proc.value("type", "");
  if (type == "Sequence") {
    for (const json& p : proc.value("processors", json::array())) {
      if (absl::Status s = ApplyProcessor(p, call); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: post_processor type \"", type, "\" is not supported"));
  }
  const json single = proc.value("single", json::array());
  std::vector<int> before, after;
  bool seen_text = false;
  for (const json& piece : single) {
    if (piece.contains("Sequence")) {
      seen_text = true;
    } else if (piece.contains("SpecialToken")) {
      absl::StatusOr<int> id = SpecialId(proc, piece["SpecialToken"].value("id", ""));
      if (!id.ok()) return id.status();
      (seen_text ? after : before).push_back(*id);
    }
  }
  if (before.size() > 1 || after.size() > 1) {
    return absl::UnimplementedError(
        "tokenizer.json: post_processor adds more than one special token on a side");
  }
  if (!before.empty()) call->bos_id = before[0];
  if (!after.empty()) call->eos_id = after[0];
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadOptional(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::string();
  std::ostringstream s;
  s << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return s.str();
}

}  // namespace

absl::StatusOr<HfTokenizerCall> ParseHfTokenizerCall(absl::string_view tokenizer_config_json,
                                                     absl::string_view tokenizer_json) {
  HfTokenizerCall call;
  if (!tokenizer_config_json.empty()) {
    const json config = json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return absl::InvalidArgumentError("tokenizer_config.json: invalid JSON");
    absl::StatusOr<Side> pad = ParseSide(config, "padding_side");
    if (!pad.ok()) return pad.status();
    absl::StatusOr<Side> trunc = ParseSide(config, "truncation_side");
    if (!trunc.ok()) return trunc.status();
    call.padding_side = *pad;
    call.truncation_side = *trunc;
  }
  if (!tokenizer_json.empty()) {
    const json tok = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
    if (tok.is_discarded()) return absl::InvalidArgumentError("tokenizer.json: invalid JSON");
    call.has_tokenizer_json = true;
    if (tok.is_object() && tok.contains("post_processor")) {
      if (absl::Status s = ApplyProcessor(tok["post_processor"], &call); !s.ok()) return s;
    }
  }
  return call;
}

absl::StatusOr<HfTokenizerCall> ReadHfTokenizerCall(const std::string& model_dir) {
  absl::StatusOr<std::string> config = ReadOptional(model_dir + "/tokenizer_config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::string> tok = ReadOptional(model_dir + "/tokenizer.json");
  if (!tok.ok()) return tok.status();
  absl::StatusOr<HfTokenizerCall> call = ParseHfTokenizerCall(*config, *tok);
  if (!call.ok()) {
    return absl::Status(call.status().code(), absl::StrCat(model_dir, "/", call.status().message()));
  }
  return call;
}

TokenizeOptions ToTokenizeOptions(const HfTokenizerCall& call, int64_t max_length, int pad_id) {
  TokenizeOptions o;
  o.max_length = max_length;
  o.pad_id = pad_id;
  o.bos_id = call.bos_id;
  o.eos_id = call.eos_id;
  o.padding_side = call.padding_side;
  o.truncation_side = call.truncation_side;
  return o;
}

absl::StatusOr<TokenizeOptions> SeedTokenizeOptions(const std::string& model_dir, int64_t max_length,
                                                    int pad_id, int fallback_bos_id) {
  absl::StatusOr<HfTokenizerCall> call = ReadHfTokenizerCall(model_dir);
  if (!call.ok()) return call.status();
  if (!call->has_tokenizer_json) call->bos_id = fallback_bos_id;
  return ToTokenizeOptions(*call, max_length, pad_id);
}

}  // namespace tpudist::train
