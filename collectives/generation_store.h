// GenerationStore: the namespace in a shared c10d store that one construction
// of one process group uses for its rendezvous keys.
//
// Several groups are routinely made over one store (a job's store, env://'s
// TCPStore): the world, TP/DP subgroups, the Gloo oracle next to tpu_dist. A
// backend that wrote its keys ("rank 0's address", "host of rank 3") at the
// store's top level would read another group's values: a group of ranks
// {1, 5} would connect its group rank 0 to whatever rank last wrote that
// key (the world's rank 0, or group {2, 6}'s rank 0), and hang. So every
// construction gets "<backend>/<group>/g<k>/", where k counts the groups named
// `group` that `rank` has made over this store (kept in the store itself,
// "<backend>/<group>/generation/<rank>"), so a group re-made over a store
// that outlived its predecessor never reads the old keys.
//
// REQUIRES: every member makes its groups named `group` in the same order
// (as torch's new_group does), so all members agree on k.
// Thread-safety: as the store. The result shares ownership of `store`.
#ifndef TPU_DIST_COLLECTIVES_GENERATION_STORE_H_
#define TPU_DIST_COLLECTIVES_GENERATION_STORE_H_

#include <string>

#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

// The store for this construction of group `group` of backend `backend`
// ("tpu_dist", "gloo") on `rank`. Throws the store's errors (c10::Error).
c10::intrusive_ptr<c10d::Store> GenerationStore(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& backend,
                                                const std::string& group, int rank);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_GENERATION_STORE_H_
