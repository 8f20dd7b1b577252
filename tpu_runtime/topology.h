// Topology parsing: accelerator names, GKE chip topologies ("4x4"), TorchTPU
// process topologies ("4,4,1"), and the host layout rules that turn them into
// a SliceSpec. Pure functions of their arguments; thread-safe.
//
// Every parser takes `name`, the variable or flag the value came from, and
// every error is an absl::InvalidArgumentError that names it, quotes the value
// and says what was expected, e.g.
//   TPU_TOPOLOGY="4x": expected positive integers separated by 'x', like "4x4"
//   or "2x2x2"
//
// Units. A *chip* is a physical TPU chip (GKE counts these in TPU_TOPOLOGY).
// A *device* is what one process drives: a chip, or on TPU7x one of its two
// chiplets (TensorCores exposed as separate PJRT devices). TorchTPU's
// TORCH_TPU_TOPOLOGY counts devices ("process units").
#ifndef TPU_DIST_TPU_RUNTIME_TOPOLOGY_H_
#define TPU_DIST_TPU_RUNTIME_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::tpu_runtime {

// Largest number of chips (or devices) a topology may describe; anything
// bigger is reported as an overflow rather than wrapped.
inline constexpr int kMaxTopologyElements = 1 << 20;

// An accelerator type string, normalized.
struct AcceleratorType {
  // "v4", "v5e", "v5p", "v6e" or "tpu7x".
  std::string generation;
  // The trailing "-<n>" of names like "v6e-16" / "v4-8", or 0 when absent.
  // Its unit differs per generation (chips on v5e/v6e, TensorCores on
  // v4/v5p), so it is reported but never used to size a slice.
  int suffix_count = 0;
};

// Normalizes the many spellings of a TPU generation: case-insensitive, an
// optional "tpu-" prefix, an optional "-slice" / "-podslice" / "-device" /
// "-<count>" suffix. Accepted, for example:
//   "TPU-V6E", "v6e", "v6e-16", "tpu-v6e-slice"                   -> v6e
//   "v5e", "v5litepod-16", "tpu-v5-lite-podslice", "v5-lite-device" -> v5e
//   "v5p-8", "tpu-v5p-slice"                                       -> v5p
//   "v4-8", "tpu-v4-podslice"                                      -> v4
//   "TPU7X", "tpu7x", "tpu7x-16", "v7x"                            -> tpu7x
absl::StatusOr<AcceleratorType> ParseAcceleratorType(absl::string_view name,
                                                     absl::string_view value);

// True for generations whose GKE topologies are 3-D (v4, v5p, tpu7x);
// v5e/v6e topologies are 2-D.
bool HasThreeDimTopology(absl::string_view generation);

// Parses a GKE chip topology "AxB" or "AxBxC" (2 or 3 positive integers
// separated by 'x') into chip dims. The product must not exceed
// kMaxTopologyElements.
absl::StatusOr<std::vector<int>> ParseChipTopology(absl::string_view name,
                                                   absl::string_view value);

// Parses a TorchTPU process topology "A,B,C" or "A,B,C,D" (3 or 4 positive
// integers separated by ','); a 4th dim is the chiplets per chip.
absl::StatusOr<std::vector<int>> ParseProcessTopology(absl::string_view name,
                                                      absl::string_view value);

// Ray's normalize rule: chip dims padded with 1s to 3 dims, then
// chiplets_per_chip appended when it is > 1. {4,4},1 -> {4,4,1};
// {2,2,2},2 -> {2,2,2,2}.
// REQUIRES: chip_dims has 1..3 positive entries, chiplets_per_chip >= 1.
std::vector<int> ProcessTopologyFromChips(const std::vector<int>& chip_dims,
                                          int chiplets_per_chip);

// The inverse for a known generation: splits off the chiplet dim (the 4th,
// else 1) and, on 2-D generations, drops the 3rd dim, which must then be 1.
// ("v6e", {4,4,1}) -> {4,4}, chiplets 1; ("tpu7x", {2,2,2,2}) -> {2,2,2}, 2.
// Errors (naming `name`) when a 2-D generation has a 3rd dim != 1.
struct ChipLayout {
  std::vector<int> chip_dims;
  int chiplets_per_chip = 1;
};
absl::StatusOr<ChipLayout> ChipLayoutFromProcessTopology(absl::string_view name,
                                                         const std::vector<int>& process_dims,
                                                         absl::string_view generation);

// Devices per chip: RAY_TPU_RESOURCE_PER_CHIP when given (`resource_per_chip`
// non-empty; must be 1 or 2, and 2 only on tpu7x), else 2 on tpu7x, else 1.
absl::StatusOr<int> ChipletsPerChip(absl::string_view generation,
                                    absl::string_view resource_per_chip);

// Chips on one host, as GKE and Ray lay slices out: v5e/v6e topologies 1x1,
// 2x2 and 2x4 are a single host with all their chips; every other topology
// has 4 chips per host (fewer only when the whole slice has fewer than 4).
int ChipsPerHost(absl::string_view generation, const std::vector<int>& chip_dims);

// Product of dims (1 for none). REQUIRES: the product fits in an int.
int Product(const std::vector<int>& dims);

// Builds the full SliceSpec for a generation and chip topology. Errors when
// the chip count is not a multiple of ChipsPerHost. `name` is used in errors.
absl::StatusOr<SliceSpec> MakeSliceSpec(absl::string_view name, absl::string_view generation,
                                        const std::vector<int>& chip_dims, int chiplets_per_chip,
                                        absl::string_view slice_name);

// "4x4" / "2x2x2": chip dims joined with 'x' (GKE's TPU_TOPOLOGY).
std::string FormatChipTopology(const std::vector<int>& chip_dims);
// "4,4,1" / "2,2,2,2": process dims joined with ',' (TORCH_TPU_TOPOLOGY).
std::string FormatProcessTopology(const std::vector<int>& process_dims);

}  // namespace tpudist::tpu_runtime

#endif  // TPU_DIST_TPU_RUNTIME_TOPOLOGY_H_
