// A C ABI over libsentencepiece, built as its own shared object and loaded
// into a private linker namespace (dlmopen) by sentencepiece_tokenizer.cc.
//
// Why: Debian's libsentencepiece embeds its own protobuf 3.14 runtime, and
// libtorch pulls the system libprotobuf 3.21 into the process. Linked
// directly, the two protobufs' symbols interpose each other and the process
// crashes during static initialisation. Only plain C types cross this ABI
// (caller-owned buffers), since the namespace has its own libc/libstdc++.
//
// Every function is noexcept; errors are reported through return values.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

void CopyError(const std::string& msg, char* err, int errlen) {
  if (err == nullptr || errlen <= 0) return;
  std::strncpy(err, msg.c_str(), errlen - 1);
  err[errlen - 1] = '\0';
}

}  // namespace

extern "C" {

void* tpu_spm_load(const char* path, char* err, int errlen) noexcept {
  auto* sp = new (std::nothrow) sentencepiece::SentencePieceProcessor();
  if (sp == nullptr) return nullptr;
  const auto status = sp->Load(path);
  if (!status.ok()) {
    CopyError(status.ToString(), err, errlen);
    delete sp;
    return nullptr;
  }
  return sp;
}

void tpu_spm_free(void* handle) noexcept { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

// Writes up to `cap` ids; returns the number of ids (may exceed cap: call
// again with a larger buffer), or -1 on error.
int tpu_spm_encode(void* handle, const char* text, size_t len, int* out, int cap) noexcept {
  std::vector<int> ids;
  if (!static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string(text, len), &ids).ok()) return -1;
  for (int i = 0; i < static_cast<int>(ids.size()) && i < cap; ++i) out[i] = ids[i];
  return static_cast<int>(ids.size());
}

// Writes up to `cap` bytes; returns the decoded length, or -1 on error.
int tpu_spm_decode(void* handle, const int* ids, int n, char* out, int cap) noexcept {
  std::string text;
  if (!static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Decode(std::vector<int>(ids, ids + n), &text).ok()) {
    return -1;
  }
  std::memcpy(out, text.data(), std::min<size_t>(text.size(), cap > 0 ? cap : 0));
  return static_cast<int>(text.size());
}

int tpu_spm_piece_size(void* h) noexcept { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize(); }
int tpu_spm_bos_id(void* h) noexcept { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->bos_id(); }
int tpu_spm_eos_id(void* h) noexcept { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->eos_id(); }
int tpu_spm_pad_id(void* h) noexcept { return static_cast<sentencepiece::SentencePieceProcessor*>(h)->pad_id(); }
int tpu_spm_is_control(void* h, int id) noexcept {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  return sp->IsControl(id) || sp->IsUnknown(id) ? 1 : 0;
}
// -1 when `piece` is not in the vocabulary (sentencepiece returns unk).
int tpu_spm_piece_to_id(void* h, const char* piece) noexcept {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  const int id = sp->PieceToId(piece);
  return sp->IdToPiece(id) == piece ? id : -1;
}

// Trains a model (sentencepiece flag syntax, e.g. "--input=a.txt
// --model_prefix=m --vocab_size=100"). Returns 0 on success.
int tpu_spm_train(const char* args, char* err, int errlen) noexcept {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    CopyError(status.ToString(), err, errlen);
    return 1;
  }
  return 0;
}

}  // extern "C"
