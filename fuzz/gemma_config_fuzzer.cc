// Fuzz target: models/gemma/gemma_config.h, HF config.json -> GemmaConfig.
//
// Input: the bytes of a config.json. Parsed as LoadGemmaConfig parses a file
// (nlohmann, no exceptions), then GemmaConfigFromJson. On success the config
// must pass Validate, every per-layer derivation must stay in range, and
// config -> HF JSON -> config must be a fixed point.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_check.h"
#include "models/gemma/gemma_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace gemma = tpudist::models::gemma;
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  absl::StatusOr<gemma::GemmaConfig> c = gemma::GemmaConfigFromJson(j, "fuzz/config.json");
  if (!c.ok()) {
    FUZZ_CHECK(c.status().message().find("fuzz/config.json") != absl::string_view::npos,
               "error does not name the file: %s", c.status().ToString().c_str());
    return 0;
  }
  const absl::Status valid = c->Validate("fuzz/config.json");
  FUZZ_CHECK(valid.ok(), "parsed config fails Validate: %s", valid.ToString().c_str());
  for (int64_t layer = 0; layer < c->num_hidden_layers; ++layer) {
    FUZZ_CHECK(c->HeadDim(layer) > 0 && c->HeadDim(layer) <= gemma::kMaxHeadDim, "layer %lld head dim %lld",
               (long long)layer, (long long)c->HeadDim(layer));
    FUZZ_CHECK(c->IntermediateSize(layer) > 0, "layer %lld intermediate size", (long long)layer);
    const int64_t source = c->KvSourceLayer(layer);
    FUZZ_CHECK(source >= 0 && source <= layer && !c->IsKvShared(source), "layer %lld takes K/V from %lld",
               (long long)layer, (long long)source);
    (void)c->StoresSharedKv(layer);
  }
  for (bool wrapper : {true, false}) {
    const nlohmann::json hf = gemma::GemmaConfigToHfJson(*c, wrapper);
    absl::StatusOr<gemma::GemmaConfig> again = gemma::GemmaConfigFromJson(hf, "round trip");
    FUZZ_CHECK(again.ok(), "written config does not parse back: %s", again.status().ToString().c_str());
    FUZZ_CHECK(gemma::GemmaConfigToHfJson(*again, wrapper) == hf, "round trip changed the config: %s",
               hf.dump().c_str());
  }
  return 0;
}
