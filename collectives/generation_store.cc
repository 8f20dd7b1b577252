#include "collectives/generation_store.h"

#include "absl/strings/str_cat.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {

c10::intrusive_ptr<c10d::Store> GenerationStore(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& backend,
                                                const std::string& group, int rank) {
  auto named = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat(backend, "/", group), store);
  const int64_t generation = named->add(absl::StrCat("generation/", rank), 1);
  return c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("g", generation), named);
}

}  // namespace tpudist::collectives
