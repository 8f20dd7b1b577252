#include "models/gemma/sentencepiece_tokenizer.h"

#include <dlfcn.h>

#include <map>

#include "absl/synchronization/mutex.h"

#include "absl/strings/str_cat.h"

namespace tpudist::models::gemma {

struct SentencePieceTokenizer::Api {
  void* lib = nullptr;
  void* (*load)(const char*, char*, int) = nullptr;
  void (*free)(void*) = nullptr;
  int (*encode)(void*, const char*, size_t, int*, int) = nullptr;
  int (*decode)(void*, const int*, int, char*, int) = nullptr;
  int (*piece_size)(void*) = nullptr;
  int (*bos)(void*) = nullptr;
  int (*eos)(void*) = nullptr;
  int (*pad)(void*) = nullptr;
  int (*is_control)(void*, int) = nullptr;
  int (*piece_to_id)(void*, const char*) = nullptr;
  int (*train)(const char*, char*, int) = nullptr;
  // The library stays loaded for the process lifetime: protobuf's static
  // state does not survive dlclose reliably.
};

namespace {

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

std::string DefaultSentencePieceShimPath() {
#ifdef TPU_DIST_GEMMA_SPM_SHIM_PATH
  return TPU_DIST_GEMMA_SPM_SHIM_PATH;
#else
  return "libtpu_dist_gemma_spm_shim.so";
#endif
}

// Opens the shim and resolves its entry points.
//
// The shim goes into a fresh dynamic-linker namespace (dlmopen LM_ID_NEWLM):
// Debian's libsentencepiece carries a builtin protobuf 3.14 whose symbols
// collide with the system libprotobuf 3.21 that libtorch loads, and
// RTLD_DEEPBIND alone breaks libstdc++'s iostreams. glibc allows only ~16
// namespaces per process, so each shim path is opened once per process and
// shared; this cache mirrors the dynamic linker's own process-wide state and
// is the only process-wide state in this library.
struct ApiLoader {
  static absl::StatusOr<std::shared_ptr<SentencePieceTokenizer::Api>> Open(const std::string& path) {
    static absl::Mutex* const mu = new absl::Mutex();
    static auto* const cache = new std::map<std::string, std::shared_ptr<SentencePieceTokenizer::Api>>();
    absl::MutexLock lock(mu);
    if (auto it = cache->find(path); it != cache->end()) return it->second;
    auto api = OpenUncached(path);
    if (api.ok()) (*cache)[path] = *api;
    return api;
  }

  static absl::StatusOr<std::shared_ptr<SentencePieceTokenizer::Api>> OpenUncached(std::string path) {
    const bool use_default = path.empty();
    if (use_default) path = DefaultSentencePieceShimPath();
    void* lib = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr && use_default) {  // installed: found on the library path
      lib = dlmopen(LM_ID_NEWLM, "libtpu_dist_gemma_spm_shim.so", RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == nullptr) {
      const char* e = dlerror();
      return absl::FailedPreconditionError(absl::StrCat("SentencePiece shim ", path, ": dlopen failed: ", e ? e : "?"));
    }
    auto api = std::make_shared<SentencePieceTokenizer::Api>();
    api->lib = lib;
    bool ok = Sym(lib, "tpu_spm_load", &api->load) && Sym(lib, "tpu_spm_free", &api->free) &&
              Sym(lib, "tpu_spm_encode", &api->encode) && Sym(lib, "tpu_spm_decode", &api->decode) &&
              Sym(lib, "tpu_spm_piece_size", &api->piece_size) && Sym(lib, "tpu_spm_bos_id", &api->bos) &&
              Sym(lib, "tpu_spm_eos_id", &api->eos) && Sym(lib, "tpu_spm_pad_id", &api->pad) &&
              Sym(lib, "tpu_spm_is_control", &api->is_control) && Sym(lib, "tpu_spm_piece_to_id", &api->piece_to_id) &&
              Sym(lib, "tpu_spm_train", &api->train);
    if (!ok) return absl::FailedPreconditionError(absl::StrCat("SentencePiece shim ", path, ": missing symbols"));
    return api;
  }
};

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const std::string& model_path,
                                                                                      std::optional<bool> add_bos,
                                                                                      const std::string& shim_path) {
  auto api = ApiLoader::Open(shim_path);
  if (!api.ok()) return api.status();
  char err[512] = {0};
  void* handle = (*api)->load(model_path.c_str(), err, sizeof(err));
  if (handle == nullptr) return absl::InvalidArgumentError(absl::StrCat(model_path, ": cannot load SentencePiece model: ", err));
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->api_ = *api;
  t->handle_ = handle;
  t->vocab_size_ = t->api_->piece_size(handle);
  t->bos_id_ = t->api_->bos(handle);
  t->eos_id_ = t->api_->eos(handle);
  t->pad_id_ = t->api_->pad(handle);
  t->add_bos_ = add_bos.value_or(true);
  return t;
}

absl::Status SentencePieceTokenizer::Train(const std::string& args, const std::string& shim_path) {
  auto api = ApiLoader::Open(shim_path);
  if (!api.ok()) return api.status();
  char err[512] = {0};
  if ((*api)->train(args.c_str(), err, sizeof(err)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece training failed: ", err));
  }
  return absl::OkStatus();
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (handle_ != nullptr) api_->free(handle_);
}

std::vector<int64_t> SentencePieceTokenizer::Encode(absl::string_view text, std::optional<bool> add_bos) const {
  std::vector<int> ids(text.size() + 16);
  int n = api_->encode(handle_, text.data(), text.size(), ids.data(), static_cast<int>(ids.size()));
  if (n > static_cast<int>(ids.size())) {
    ids.resize(n);
    n = api_->encode(handle_, text.data(), text.size(), ids.data(), n);
  }
  std::vector<int64_t> out;
  if (add_bos.value_or(add_bos_) && bos_id_ >= 0) out.push_back(bos_id_);
  for (int i = 0; i < std::max(n, 0); ++i) out.push_back(ids[i]);
  return out;
}

std::string SentencePieceTokenizer::Decode(absl::Span<const int64_t> ids, bool skip_special) const {
  std::vector<int> in;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    if (skip_special && api_->is_control(handle_, static_cast<int>(id))) continue;
    in.push_back(static_cast<int>(id));
  }
  std::string out(in.size() * 8 + 16, '\0');
  int n = api_->decode(handle_, in.data(), static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()));
  if (n > static_cast<int>(out.size())) {
    out.resize(n);
    n = api_->decode(handle_, in.data(), static_cast<int>(in.size()), out.data(), n);
  }
  out.resize(std::max(n, 0));
  return out;
}

std::optional<int64_t> SentencePieceTokenizer::TokenToId(absl::string_view token) const {
  const int id = api_->piece_to_id(handle_, std::string(token).c_str());
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace tpudist::models::gemma
