#include "models/gemma/hf_checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/gemma/model_dir.h"
#include "io/safetensors.h"

namespace tpudist::models::gemma {
namespace {

namespace fs = std::filesystem;
constexpr absl::string_view kHfPrefix = "model.language_model.";
constexpr absl::string_view kTextPrefix = "model.";

// Our tensors by name: parameters and persistent buffers.
std::map<std::string, at::Tensor> OurTensors(GemmaForCausalLMImpl& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters(true)) out.emplace(p.key(), p.value());
  for (const auto& b : model.named_buffers(true)) out.emplace(b.key(), b.value());
  return out;
}

std::string ShapeString(at::IntArrayRef s) { return c10::str(s); }

// The dtype of the floating-point tensors being saved: that of the
// parameters, which outnumber the [1] layer_scalar buffers (kFloat if none).
at::ScalarType StoredDtype(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::map<at::ScalarType, int64_t> count;
  for (const auto& [name, t] : tensors) {
    if (at::isFloatingType(t.scalar_type())) count[t.scalar_type()] += t.numel();
  }
  at::ScalarType best = at::kFloat;
  int64_t most = -1;
  for (const auto& [type, n] : count) {
    if (n > most) {
      best = type;
      most = n;
    }
  }
  return best;
}

// OK when a tensor stored as `stored` may be copied into a model tensor of
// dtype `want`: the same dtype, or a float-to-float cast (counted in
// `summary`). Never int <-> float: same-size I32 bytes value-cast into F32
// weights would train silently on garbage.
absl::Status CheckDtype(const std::string& path, const std::string& hf_name, const std::string& stored,
                        at::ScalarType want, HfLoadSummary* summary) {
  absl::StatusOr<at::ScalarType> from = io::SafetensorsDtype(stored);  // validated by Open
  absl::StatusOr<std::string> want_name = io::SafetensorsDtypeName(want);
  const std::string expected = want_name.ok() ? *want_name : std::string(c10::toString(want));
  if (from.ok() && *from == want) return absl::OkStatus();
  if (from.ok() && at::isFloatingType(*from) && at::isFloatingType(want)) {
    ++summary->casts[{stored, expected}];
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", hf_name, "' is stored as ", stored,
                                                 ", the model expects ", expected,
                                                 " (only float-to-float casts among F64/F32/BF16/F16 are done "
                                                 "on load; the header's dtype is wrong or the file is not this "
                                                 "model's)"));
}

}  // namespace

std::string HfNameFor(const std::string& our_name) {
  if (absl::StartsWith(our_name, kTextPrefix)) {
    return absl::StrCat(kHfPrefix, our_name.substr(kTextPrefix.size()));
  }
  return our_name;
}

HfTensorClass ClassifyHfTensor(const std::string& hf_name, const GemmaConfig& config) {
  HfTensorClass out;
  for (absl::string_view skip : {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                                 "model.embed_audio.", "vision_tower.", "audio_tower."}) {
    if (absl::StartsWith(hf_name, skip)) {
      out.kind = HfTensorKind::kSkipped;
      return out;
    }
  }
  if (hf_name == "lm_head.weight") {
    out.kind = HfTensorKind::kSkipped;
    return out;
  }
  std::string rest;
  if (absl::StartsWith(hf_name, kHfPrefix)) {
    rest = hf_name.substr(kHfPrefix.size());
  } else if (absl::StartsWith(hf_name, kTextPrefix)) {
    rest = hf_name.substr(kTextPrefix.size());
  } else {
    return out;
  }
  // layers.{i}.self_attn.{k_proj,v_proj,k_norm,v_norm}.* on shared layers.
  std::vector<std::string> parts = absl::StrSplit(rest, '.');
  int64_t layer = -1;
  if (parts.size() >= 4 && parts[0] == "layers" && absl::SimpleAtoi(parts[1], &layer) && parts[2] == "self_attn" &&
      layer >= 0 && layer < config.num_hidden_layers && config.IsKvShared(layer) &&
      (parts[3] == "k_proj" || parts[3] == "v_proj" || parts[3] == "k_norm" || parts[3] == "v_norm")) {
    out.kind = HfTensorKind::kSkipped;
    return out;
  }
  out.kind = HfTensorKind::kMapped;
  out.our_name = absl::StrCat(kTextPrefix, rest);
  return out;
}

std::string HfLoadSummary::CastLine() const {
  std::string line;
  for (const auto& [types, n] : casts) {
    absl::StrAppend(&line, line.empty() ? "cast " : ", ", n, n == 1 ? " tensor " : " tensors ", types.first,
                    " -> ", types.second);
  }
  return line;
}

absl::StatusOr<GemmaForCausalLM> LoadGemmaFromHf(const std::string& dir, const LoadOptions& options) {
  if (absl::Status st = CheckModelDir(dir); !st.ok()) return st;
  auto config = LoadGemmaConfig((fs::path(dir) / "config.json").string());
  if (!config.ok()) return config.status();
  GemmaForCausalLM model(*config);
  model->to(options.dtype);
  absl::StatusOr<HfLoadSummary> summary = LoadHfWeights(*model, dir);
  if (!summary.ok()) return summary.status();
  if (const std::string line = summary->CastLine(); !line.empty()) {
    const std::string message = absl::StrCat(dir, ": ", line, " on load");
    if (options.log) {
      options.log(message);
    } else {
      fprintf(stderr, "gemma: %s\n", message.c_str());
    }
  }
  return model;
}

absl::StatusOr<HfLoadSummary> LoadHfWeights(GemmaForCausalLMImpl& model, const std::string& dir) {
  if (absl::Status st = CheckModelDir(dir); !st.ok()) return st;
  const fs::path root(dir);
  std::vector<std::string> files;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrCat(index.string(), ": invalid index (need a weight_map object)"));
    }
    std::set<std::string> unique;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return absl::DataLossError(absl::StrCat(index.string(), ": weight_map['", it.key(), "'] is not a file name"));
      unique.insert(it.value().get<std::string>());
    }
    for (const auto& f : unique) files.push_back((root / f).string());
  } else {
    files.push_back((root / "model.safetensors").string());
  }
  std::map<std::string, at::Tensor> ours = OurTensors(model);
  std::set<std::string> loaded;
  HfLoadSummary summary;
  at::NoGradGuard no_grad;
  for (const auto& path : files) {
    auto file = io::SafetensorsFile::Open(path);
    if (!file.ok()) return file.status();
    for (const auto& [hf_name, entry] : (*file)->entries()) {
      HfTensorClass c = ClassifyHfTensor(hf_name, model.config());
      if (c.kind == HfTensorKind::kSkipped) continue;
      auto target = c.kind == HfTensorKind::kMapped ? ours.find(c.our_name) : ours.end();
      if (target == ours.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected tensor '", hf_name,
                                                       "' (no matching module in the Gemma 4 text model)"));
      }
      if (!target->second.sizes().equals(entry.shape)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", hf_name, "' has shape ",
                                                       ShapeString(entry.shape), ", the model expects ",
                                                       ShapeString(target->second.sizes())));
      }
      if (auto st = CheckDtype(path, hf_name, entry.dtype, target->second.scalar_type(), &summary); !st.ok()) {
        return st;
      }
      auto src = (*file)->Get(hf_name);
      if (!src.ok()) return src.status();
      target->second.copy_(*src);
      loaded.insert(target->first);
    }
  }
  for (const auto& [name, tensor] : ours) {
    if (!loaded.count(name)) {
      return absl::NotFoundError(absl::StrCat(dir, ": checkpoint has no tensor '", HfNameFor(name), "'"));
    }
  }
  summary.tensors = static_cast<int64_t>(loaded.size());
  return summary;
}

absl::Status SaveGemmaAsHf(GemmaForCausalLMImpl& model, const std::string& dir, const SaveOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  const fs::path root(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : OurTensors(model)) {
    at::Tensor t = options.dtype ? tensor.to(*options.dtype) : tensor;
    std::string hf = options.multimodal_wrapper ? HfNameFor(name) : name;
    tensors.emplace_back(hf, t);
  }
  if (auto st = io::WriteSafetensors((root / "model.safetensors").string(), tensors, {{"format", "pt"}}); !st.ok()) {
    return st;
  }
  nlohmann::json config = GemmaConfigToHfJson(model.config(), options.multimodal_wrapper);
  // "dtype" names the stored parameters' dtype (HF from_pretrained's default
  // dtype="auto" loads in it): the requested one, else the model's own.
  const at::ScalarType stored = options.dtype ? *options.dtype : StoredDtype(tensors);
  const char* dtype_name = stored == at::kBFloat16 ? "bfloat16" : stored == at::kHalf ? "float16" : "float32";
  config["dtype"] = dtype_name;
  if (config.contains("text_config")) config["text_config"]["dtype"] = dtype_name;
  {
    errno = 0;
    std::ofstream out(root / "config.json");
    out << config.dump(2) << "\n";
    out.close();
    if (!out) {
      return absl::ErrnoToStatus(errno != 0 ? errno : EIO,
                                 absl::StrCat((root / "config.json").string(), ": write failed"));
    }
  }
  if (!options.copy_tokenizer_from.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}) {
      const fs::path src = fs::path(options.copy_tokenizer_from) / f;
      if (!fs::exists(src)) continue;
      fs::copy_file(src, root / f, fs::copy_options::overwrite_existing, ec);
      if (ec) return absl::InternalError(absl::StrCat(src.string(), ": copy failed: ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::models::gemma
