#include "bench/train_bench_flags.h"

#include <algorithm>

#include "bench/flag_value.h"

namespace tpudist::bench {

TrainBenchFlags ParseTrainBenchFlags(int* argc, char** argv) {
  TrainBenchFlags f;
  const auto value = FlagValue;
  StripFlags(argc, argv, [&](const std::string& a) {
    const char* v = nullptr;
    if ((v = value(a, "--world="))) f.world = std::stoi(v);
    else if ((v = value(a, "--batch="))) f.batch = std::stoll(v);
    else if ((v = value(a, "--seq="))) f.seq = std::stoll(v);
    else if ((v = value(a, "--warmup="))) f.warmup = std::stoi(v);
    else if ((v = value(a, "--steps="))) f.steps = std::stoi(v);
    else if ((v = value(a, "--rounds="))) f.rounds = std::max(1, std::stoi(v));
    else if ((v = value(a, "--warmup_rounds="))) f.warmup_rounds = std::max(0, std::stoi(v));
    else if (a == "--fsdp_timers") f.fsdp_timers = true;
    else if ((v = value(a, "--gemm_n="))) f.gemm_n = std::stoll(v);
    else if ((v = value(a, "--backend="))) f.backend = v;
    else if ((v = value(a, "--fsdp_dtype="))) f.fsdp_dtype = v;
    else if ((v = value(a, "--adamw="))) f.adamw = v;
    else if ((v = value(a, "--json_out="))) f.json_out = v;
    else if (a == "--quick" || a == "--smoke") f.quick = true;
    else return false;
    return true;
  });
  if (f.quick) {
    f.warmup_rounds = 0;
    f.batch = 2;
    f.seq = 32;
    f.warmup = 1;
    f.steps = 2;
    f.gemm_n = 256;
  }
  return f;
}

}  // namespace tpudist::bench
