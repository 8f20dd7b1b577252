#include "models/gemma/tiny_model.h"

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "models/gemma/bpe_trainer.h"
#include "models/gemma/gemma_model.h"
#include "models/gemma/hf_checkpoint.h"

namespace tpudist::models::gemma {
namespace {

absl::Status WriteJson(const std::filesystem::path& path, const nlohmann::json& j) {
  errno = 0;
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return absl::ErrnoToStatus(errno != 0 ? errno : EIO, absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTinyGemmaDir(const std::string& dir, absl::string_view corpus, const TinyModelOptions& options) {
  const GemmaConfig& config = options.config;
  if (auto st = config.Validate("tiny config"); !st.ok()) return st;
  BpeTrainerOptions topt;
  topt.vocab_size = config.vocab_size;
  auto bpe = TrainBpe(corpus, topt);
  if (!bpe.ok()) return bpe.status();
  if (static_cast<int64_t>(bpe->vocab.size()) != config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer corpus gives only ", bpe->vocab.size(),
                                                   " tokens, the config needs ", config.vocab_size));
  }
  GemmaForCausalLM model(config);
  InitGemmaWeights(*model, {options.seed, options.init_std, options.layer_scalar});
  if (auto st = SaveGemmaAsHf(*model, dir); !st.ok()) return st;
  const std::filesystem::path root(dir);
  if (auto st = WriteJson(root / "tokenizer.json", BpeTokenizerJson(*bpe)); !st.ok()) return st;
  nlohmann::json tc = {
      {"tokenizer_class", "GemmaTokenizer"},
      {"add_bos_token", options.add_bos_token},
      {"add_eos_token", false},
      {"pad_token", "<pad>"},
      {"eos_token", "<eos>"},
      {"bos_token", "<bos>"},
      {"unk_token", "<unk>"},
      {"padding_side", "left"},
      {"model_max_length", config.max_position_embeddings},
  };
  if (auto st = WriteJson(root / "tokenizer_config.json", tc); !st.ok()) return st;
  nlohmann::json gen = {{"bos_token_id", config.bos_token_id},
                        {"eos_token_id", config.eos_token_ids},
                        {"pad_token_id", config.pad_token_id},
                        {"do_sample", false}};
  return WriteJson(root / "generation_config.json", gen);
}

}  // namespace tpudist::models::gemma
