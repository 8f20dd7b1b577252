// Fuzz target: models/gemma/bpe_tokenizer.h, the tokenizer.json loader, and
// the tokenizer it builds.
//
// Input: tokenizer.json, then optionally '\0' + tokenizer_config.json, then
// optionally '\0' + a text to encode (a fixed sentence when absent). Both
// documents are parsed as BpeTokenizer::FromFiles parses its files, then
// BpeTokenizer::FromJson. On success: every id Encode returns is below
// vocab_size(), EncodeHead(text, n) is exactly Encode(text)'s first n ids
// (its documented contract), and Decode accepts any ids.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "models/gemma/bpe_tokenizer.h"

namespace {

// Encoding cost grows with the text; a few hundred bytes reach every branch.
constexpr size_t kMaxTextBytes = 512;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace gemma = tpudist::models::gemma;
  tpudist::fuzz::FuzzInput in(data, size);
  const std::string tokenizer_text = in.Until('\0');
  const std::string config_text = in.Until('\0');
  std::string text(in.Rest().substr(0, kMaxTextBytes));
  if (text.empty()) text = "Instruction: What is two plus two?\n\nResponse: four \xe2\x96\x81 caf\xc3\xa9";

  const nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_text, nullptr, /*allow_exceptions=*/false);
  if (tokenizer.is_discarded()) return 0;
  nlohmann::json config;  // null: no tokenizer_config.json
  if (!config_text.empty()) {
    config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return 0;
  }
  absl::StatusOr<std::unique_ptr<gemma::BpeTokenizer>> t =
      gemma::BpeTokenizer::FromJson(tokenizer, config, "fuzz/tokenizer.json");
  if (!t.ok()) {
    FUZZ_CHECK(t.status().message().find("fuzz/tokenizer.json") != absl::string_view::npos,
               "error does not name the file: %s",
               t.status().ToString().c_str());
    return 0;
  }
  const gemma::BpeTokenizer& tok = **t;
  const int64_t vocab = tok.vocab_size();
  const std::vector<int64_t> ids = tok.Encode(text);
  for (int64_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < vocab, "Encode returned id %lld, vocab_size %lld", (long long)id, (long long)vocab);
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, static_cast<int64_t>(ids.size())}) {
    const std::vector<int64_t> head = tok.EncodeHead(text, n);
    const size_t want = std::min(ids.size(), static_cast<size_t>(n));
    FUZZ_CHECK(head.size() == want && std::equal(head.begin(), head.end(), ids.begin()),
               "EncodeHead(text, %lld) returned %zu ids, not Encode's first %zu", (long long)n, head.size(), want);
  }
  (void)tok.Decode(ids);
  (void)tok.Decode(ids, /*skip_special=*/true);
  const std::vector<int64_t> odd = {-1, vocab, vocab + 1, 0, std::numeric_limits<int64_t>::max()};
  (void)tok.Decode(odd);
  for (int64_t id : {int64_t{0}, vocab - 1, vocab}) {
    const std::string& token = tok.IdToToken(id);
    if (!token.empty()) FUZZ_CHECK(tok.TokenToId(token).has_value(), "token of id %lld has no id", (long long)id);
  }
  return 0;
}
