#include "tpu_runtime/topology.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tpudist::tpu_runtime {
namespace {

absl::Status Invalid(absl::string_view name, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(name, "=\"", value, "\": ", expected));
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Splits `value` on `sep` into min_dims..max_dims positive ints whose product
// is at most kMaxTopologyElements.
absl::StatusOr<std::vector<int>> ParseDims(absl::string_view name, absl::string_view value,
                                           char sep, size_t min_dims, size_t max_dims,
                                           absl::string_view expected) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, sep);
  if (value.empty() || parts.size() < min_dims || parts.size() > max_dims) {
    return Invalid(name, value, expected);
  }
  std::vector<int> dims;
  int64_t product = 1;
  for (absl::string_view part : parts) {
    int dim = 0;
    if (!AllDigits(part)) return Invalid(name, value, expected);
    if (!absl::SimpleAtoi(part, &dim) || dim > kMaxTopologyElements) {
      return Invalid(name, value,
                     absl::StrCat("dimension ", part, " overflows; expected at most ",
                                  kMaxTopologyElements, " elements in all"));
    }
    if (dim <= 0) return Invalid(name, value, expected);
    product *= dim;
    if (product > kMaxTopologyElements) {
      return Invalid(name, value,
                     absl::StrCat("the product of the dimensions overflows; expected at most ",
                                  kMaxTopologyElements, " elements in all"));
    }
    dims.push_back(dim);
  }
  return dims;
}

}  // namespace

absl::StatusOr<AcceleratorType> ParseAcceleratorType(absl::string_view name,
                                                     absl::string_view value) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  absl::string_view rest = s;
  AcceleratorType out;
  // Trailing "-<count>" (v6e-16, v4-8, tpu7x-16).
  size_t dash = rest.rfind('-');
  if (dash != absl::string_view::npos && AllDigits(rest.substr(dash + 1))) {
    if (!absl::SimpleAtoi(rest.substr(dash + 1), &out.suffix_count) || out.suffix_count <= 0) {
      return Invalid(name, value, "expected a positive count after the last '-'");
    }
    rest = rest.substr(0, dash);
  }
  for (absl::string_view suffix : {"-podslice", "-slice", "-device"}) {
    if (absl::ConsumeSuffix(&rest, suffix)) break;
  }
  absl::ConsumePrefix(&rest, "tpu-");
  if (rest == "v4") {
    out.generation = "v4";
  } else if (rest == "v5e" || rest == "v5lite" || rest == "v5litepod" || rest == "v5-lite") {
    out.generation = "v5e";
  } else if (rest == "v5p") {
    out.generation = "v5p";
  } else if (rest == "v6e") {
    out.generation = "v6e";
  } else if (rest == "tpu7x" || rest == "v7x" || rest == "7x") {
    out.generation = "tpu7x";
  } else {
    return Invalid(name, value,
                   "expected a TPU generation v4, v5e (v5litepod), v5p, v6e or tpu7x, "
                   "optionally prefixed \"tpu-\" and suffixed \"-<count>\" or \"-slice\", "
                   "like \"v6e-16\" or \"tpu7x\"");
  }
  return out;
}

bool HasThreeDimTopology(absl::string_view generation) {
  return generation == "v4" || generation == "v5p" || generation == "tpu7x";
}

absl::StatusOr<std::vector<int>> ParseChipTopology(absl::string_view name,
                                                   absl::string_view value) {
  return ParseDims(name, value, 'x', 2, 3,
                   "expected positive integers separated by 'x', like \"4x4\" or \"2x2x2\"");
}

absl::StatusOr<std::vector<int>> ParseProcessTopology(absl::string_view name,
                                                      absl::string_view value) {
  return ParseDims(name, value, ',', 3, 4,
                   "expected 3 or 4 positive integers separated by ',', like \"4,4,1\" or "
                   "\"2,2,2,2\"");
}

std::vector<int> ProcessTopologyFromChips(const std::vector<int>& chip_dims,
                                          int chiplets_per_chip) {
  std::vector<int> dims = chip_dims;
  while (dims.size() < 3) dims.push_back(1);
  if (chiplets_per_chip > 1) dims.push_back(chiplets_per_chip);
  return dims;
}

absl::StatusOr<ChipLayout> ChipLayoutFromProcessTopology(absl::string_view name,
                                                         const std::vector<int>& process_dims,
                                                         absl::string_view generation) {
  ChipLayout layout;
  layout.chip_dims.assign(process_dims.begin(),
                          process_dims.begin() + std::min<size_t>(process_dims.size(), 3));
  if (process_dims.size() == 4) layout.chiplets_per_chip = process_dims[3];
  if (!HasThreeDimTopology(generation) && layout.chip_dims.size() == 3) {
    if (layout.chip_dims[2] != 1) {
      return Invalid(name, FormatProcessTopology(process_dims),
                     absl::StrCat(generation, " slices are 2-D, so the 3rd dimension must be 1"));
    }
    layout.chip_dims.pop_back();
  }
  return layout;
}

absl::StatusOr<int> ChipletsPerChip(absl::string_view generation,
                                    absl::string_view resource_per_chip) {
  if (resource_per_chip.empty()) return generation == "tpu7x" ? 2 : 1;
  int n = 0;
  if (!AllDigits(resource_per_chip) || !absl::SimpleAtoi(resource_per_chip, &n) || n < 1 ||
      n > 2) {
    return Invalid("RAY_TPU_RESOURCE_PER_CHIP", resource_per_chip, "expected 1 or 2");
  }
  if (n == 2 && generation != "tpu7x") {
    return Invalid("RAY_TPU_RESOURCE_PER_CHIP", resource_per_chip,
                   absl::StrCat("expected 1: only tpu7x chips have 2 chiplets, this is ",
                                generation));
  }
  return n;
}

int ChipsPerHost(absl::string_view generation, const std::vector<int>& chip_dims) {
  if (generation == "v5e" || generation == "v6e") {
    const std::string topo = FormatChipTopology(chip_dims);
    if (topo == "1x1" || topo == "2x2" || topo == "2x4") return Product(chip_dims);
  }
  return std::min(4, Product(chip_dims));
}

int Product(const std::vector<int>& dims) {
  int p = 1;
  for (int d : dims) p *= d;
  return p;
}

absl::StatusOr<SliceSpec> MakeSliceSpec(absl::string_view name, absl::string_view generation,
                                        const std::vector<int>& chip_dims, int chiplets_per_chip,
                                        absl::string_view slice_name) {
  const std::string topo = FormatChipTopology(chip_dims);
  if (HasThreeDimTopology(generation) != (chip_dims.size() == 3)) {
    return Invalid(name, topo,
                   absl::StrCat("expected a ", HasThreeDimTopology(generation) ? "3" : "2",
                                "-D topology for ", generation));
  }
  const int chips = Product(chip_dims);
  const int per_host = ChipsPerHost(generation, chip_dims);
  if (chips % per_host != 0) {
    return Invalid(name, topo,
                   absl::StrCat(chips, " chips do not fill whole hosts of ", per_host,
                                " chips; expected a multiple of ", per_host));
  }
  SliceSpec spec;
  spec.accelerator_type = std::string(generation);
  spec.chip_topology = chip_dims;
  spec.chiplets_per_chip = chiplets_per_chip;
  spec.process_topology = ProcessTopologyFromChips(chip_dims, chiplets_per_chip);
  spec.num_hosts = chips / per_host;
  spec.devices_per_host = per_host * chiplets_per_chip;
  spec.slice_name = std::string(slice_name);
  return spec;
}

std::string FormatChipTopology(const std::vector<int>& chip_dims) {
  return absl::StrJoin(chip_dims, "x");
}

std::string FormatProcessTopology(const std::vector<int>& process_dims) {
  return absl::StrJoin(process_dims, ",");
}

}  // namespace tpudist::tpu_runtime
