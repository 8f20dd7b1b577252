// gemma_generate: greedy text generation from an HF-format model directory.
//
//   gemma_generate --model_dir=data/tiny_gemma --prompt="Hello" --max_new_tokens=8
// Prints the prompt ids, the new ids and the decoded continuation.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "models/gemma/generation.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/tokenizer.h"

ABSL_FLAG(std::string, model_dir, "", "HF model directory (config.json, model.safetensors, tokenizer)");
ABSL_FLAG(std::string, prompt, "Hello", "prompt text");
ABSL_FLAG(int64_t, max_new_tokens, 8, "tokens to generate");
ABSL_FLAG(bool, bf16, false, "run in bfloat16");

int main(int argc, char** argv) {
  namespace g = tpudist::models::gemma;
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    std::cerr << "usage: gemma_generate --model_dir=DIR [--prompt=TEXT] [--max_new_tokens=N]\n";
    return 2;
  }
  g::LoadOptions load;
  load.dtype = absl::GetFlag(FLAGS_bf16) ? at::kBFloat16 : at::kFloat;
  auto model = g::LoadGemmaFromHf(dir, load);
  if (!model.ok()) {
    std::cerr << "gemma_generate: " << model.status() << "\n";
    return 1;
  }
  auto tokenizer = g::LoadTokenizer(dir);
  if (!tokenizer.ok()) {
    std::cerr << "gemma_generate: " << tokenizer.status() << "\n";
    return 1;
  }
  (*model)->eval();
  std::vector<int64_t> prompt = (*tokenizer)->Encode(absl::GetFlag(FLAGS_prompt));
  if (prompt.empty()) prompt.push_back((*tokenizer)->bos_id());
  std::vector<int64_t> stop = (*model)->config().eos_token_ids;
  std::vector<int64_t> out = g::GreedyGenerate(**model, prompt, absl::GetFlag(FLAGS_max_new_tokens), stop);
  std::cout << "prompt_ids: " << absl::StrJoin(prompt, " ") << "\n";
  std::cout << "new_ids: " << absl::StrJoin(out, " ") << "\n";
  std::cout << "text: " << (*tokenizer)->Decode(out, /*skip_special=*/true) << "\n";
  return 0;
}
