// Flags of bench/train_bench.cc, parsed out of argv by a pure function
// (Google Benchmark's own flags are left in argv for it), so the parser has
// unit tests (bench_test). The binary's header comment lists what each flag
// does.
//
// Thread-safety: pure function.
#ifndef TPU_DIST_BENCH_TRAIN_BENCH_FLAGS_H_
#define TPU_DIST_BENCH_TRAIN_BENCH_FLAGS_H_

#include <cstdint>
#include <string>

namespace tpudist::bench {

struct TrainBenchFlags {
  int world = 2;
  int64_t batch = 4, seq = 128;  // per rank
  int warmup = 2, steps = 8;
  int rounds = 1;  // interleaved (ddp, fsdp) pairs
  // Unreported (ddp, fsdp) pairs run before the reported rounds: the first pair
  // of a process pays one-off costs (allocator growth, page faults, lazy
  // collective set-up) on whichever case happens to come first.
  int warmup_rounds = 1;
  bool fsdp_timers = false;  // print FullyShard's phase times (FsdpStats::timing)
  int64_t gemm_n = 1024;
  std::string backend = "tpu_dist";
  std::string fsdp_dtype = "fp32";  // FSDP param_dtype: fp32 | bf16
  std::string adamw = "fused";      // fused (nn::FusedAdamW) | loop (torch::optim::AdamW)
  bool quick = false;
  std::string json_out;
};

// Parses our flags out of argv (argv[1..*argc)), moving the rest to the
// front and updating *argc. --quick (or --smoke) sets a seconds-long run
// (no warm-up rounds, batch 2, seq 32, 1 + 2 steps, 256-wide GEMM) whatever
// else is given; --rounds is at least 1, --warmup_rounds at least 0. A
// malformed number throws std::invalid_argument (std::stoi's).
// REQUIRES: argv holds *argc entries.
TrainBenchFlags ParseTrainBenchFlags(int* argc, char** argv);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_TRAIN_BENCH_FLAGS_H_
