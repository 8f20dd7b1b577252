// SentencePieceTokenizer: a Tokenizer over a SentencePiece `.model` file,
// run by libsentencepiece through a privately loaded shim
// (sentencepiece_shim.cc explains why it cannot be linked directly).
//
// Thread-safety: immutable after Load; Encode/Decode may run concurrently.
#ifndef TPU_DIST_MODELS_GEMMA_SENTENCEPIECE_TOKENIZER_H_
#define TPU_DIST_MODELS_GEMMA_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gemma/tokenizer.h"

namespace tpudist::models::gemma {

// The shim's path in this build (empty if unknown at compile time).
std::string DefaultSentencePieceShimPath();

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads `model_path`. `shim_path` empty: DefaultSentencePieceShimPath().
  // `add_bos` default: true (SentencePiece models carry no such setting).
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& model_path,
                                                                      std::optional<bool> add_bos = std::nullopt,
                                                                      const std::string& shim_path = "");
  // Trains a model with libsentencepiece (flag syntax as spm_train). For
  // tests and tools.
  static absl::Status Train(const std::string& args, const std::string& shim_path = "");

  ~SentencePieceTokenizer() override;

  std::vector<int64_t> Encode(absl::string_view text, std::optional<bool> add_bos = std::nullopt) const override;
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special = false) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t pad_id() const override { return pad_id_; }
  int64_t bos_id() const override { return bos_id_; }
  int64_t eos_id() const override { return eos_id_; }
  bool add_bos() const override { return add_bos_; }
  std::optional<int64_t> TokenToId(absl::string_view token) const override;

 private:
  struct Api;
  friend struct ApiLoader;
  SentencePieceTokenizer() = default;

  std::shared_ptr<Api> api_;
  void* handle_ = nullptr;
  int64_t vocab_size_ = 0, pad_id_ = -1, bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = true;
};

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_SENTENCEPIECE_TOKENIZER_H_
