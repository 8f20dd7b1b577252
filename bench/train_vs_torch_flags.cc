#include "bench/train_vs_torch_flags.h"

#include <string>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tpudist::bench {
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("train_vs_torch: --", flag, "=", value, ": ", why));
}

template <typename T>
absl::Status Number(absl::string_view flag, absl::string_view value, T* out) {
  bool ok = false;
  if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(value, out);
  } else {
    ok = absl::SimpleAtoi(value, out);
  }
  return ok ? absl::OkStatus() : Bad(flag, value, "not a number");
}

absl::Status Check(const TrainVsTorchFlags& f) {
  if (f.world < 1) return Bad("world", absl::StrCat(f.world), "must be >= 1");
  if (f.global_batch < 1 || f.global_batch % f.world != 0) {
    return Bad("global_batch", absl::StrCat(f.global_batch),
               absl::StrCat("must be a positive multiple of --world=", f.world));
  }
  if (f.seq < 2) return Bad("seq", absl::StrCat(f.seq), "must be >= 2 (shifted loss)");
  if (f.warmup < 1) return Bad("warmup", absl::StrCat(f.warmup), "must be >= 1 (step 0)");
  if (f.steps < 1) return Bad("steps", absl::StrCat(f.steps), "must be >= 1");
  if (f.plan != "layers" && f.plan != "mlp") return Bad("plan", f.plan, "must be layers or mlp");
  if (f.backend != "tpu_dist" && f.backend != "gloo") {
    return Bad("backend", f.backend, "must be tpu_dist or gloo");
  }
  if (f.timeout_s < 1) return Bad("timeout_s", absl::StrCat(f.timeout_s), "must be >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainVsTorchFlags> ParseTrainVsTorchFlags(int argc, const char* const* argv) {
  TrainVsTorchFlags f;
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--quick") {
      f.quick = true;
      f.world = 2;
      f.global_batch = 4;
      f.seq = 32;
      f.warmup = 1;
      f.steps = 2;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--quick") continue;
    const size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("train_vs_torch: expected --name=value, got '", a, "'"));
    }
    const absl::string_view name = a.substr(2, eq - 2), v = a.substr(eq + 1);
    absl::Status s;
    int flag = 0;
    if (name == "model_dir") f.model_dir = std::string(v);
    else if (name == "world") s = Number(name, v, &f.world);
    else if (name == "global_batch") s = Number(name, v, &f.global_batch);
    else if (name == "seq") s = Number(name, v, &f.seq);
    else if (name == "warmup") s = Number(name, v, &f.warmup);
    else if (name == "steps") s = Number(name, v, &f.steps);
    else if (name == "lr") s = Number(name, v, &f.lr);
    else if (name == "beta1") s = Number(name, v, &f.beta1);
    else if (name == "beta2") s = Number(name, v, &f.beta2);
    else if (name == "eps") s = Number(name, v, &f.eps);
    else if (name == "weight_decay") s = Number(name, v, &f.weight_decay);
    else if (name == "seed") s = Number(name, v, &f.seed);
    else if (name == "plan") f.plan = std::string(v);
    else if (name == "backend") f.backend = std::string(v);
    else if (name == "timeout_s") s = Number(name, v, &f.timeout_s);
    else if (name == "json_out") f.json_out = std::string(v);
    else if (name == "freeze_ple") {
      s = Number(name, v, &flag);
      if (s.ok() && flag != 0 && flag != 1) s = Bad(name, v, "must be 0 or 1");
      f.freeze_ple = flag == 1;
    } else {
      return Bad(name, v, "unknown flag");
    }
    if (!s.ok()) return s;
  }
  if (absl::Status s = Check(f); !s.ok()) return s;
  return f;
}

}  // namespace tpudist::bench
