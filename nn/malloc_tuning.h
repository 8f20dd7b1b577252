// Host allocator settings for a training process (glibc malloc).
//
// libtorch's CPU allocator is glibc's malloc. A training step frees and
// reallocates the same activation-sized blocks (hundreds of KiB to MiB) every
// step; with glibc's defaults the top of the heap is trimmed back to the OS
// whenever 128 KiB are free there, and blocks above the dynamic mmap threshold
// are mmap'ed and unmapped each time, so the next step page-faults the same
// memory in again (measured on the tiny Gemma at 2 ranks: 144k minor faults
// and 5-6% of the step CPU in faults, clear_page and malloc bookkeeping).
// TuneMallocForTraining keeps freed blocks in the process instead, the CPU
// analogue of a caching device allocator:
//   M_MMAP_THRESHOLD 64 MiB   blocks below it come from the heap
//   M_TRIM_THRESHOLD 256 MiB  free heap top kept up to this size
//   M_TOP_PAD        16 MiB   heap grows in steps of this much
// Peak RSS is unchanged (the step reuses its own blocks); what stays mapped
// between steps is at most the trim threshold per arena.
//
// Opt-out: TPU_DIST_MALLOC_TUNING=0. A user who set glibc's own variables
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
// GLIBC_TUNABLES) keeps them: nothing is changed then.
//
// Thread-safety: call once, early in main (before threads and ranks are
// started; settings are inherited across fork).
#ifndef TPU_DIST_NN_MALLOC_TUNING_H_
#define TPU_DIST_NN_MALLOC_TUNING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tpudist::nn {

struct MallocTuning {
  int64_t mmap_threshold = int64_t{64} << 20;
  int64_t trim_threshold = int64_t{256} << 20;
  int64_t top_pad = int64_t{16} << 20;
};

// What TuneMallocForTraining applies given the environment `getenv` reads
// (nullptr = unset): nullopt when opted out or the user tuned glibc already.
// Pure.
std::optional<MallocTuning> ChooseMallocTuning(
    const std::function<const char*(const char*)>& getenv);

// Applies ChooseMallocTuning(std::getenv) with mallopt. Returns a one-line
// description of what it did (for the job log).
std::string TuneMallocForTraining();

}  // namespace tpudist::nn

#endif  // TPU_DIST_NN_MALLOC_TUNING_H_
