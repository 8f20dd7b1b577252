#include "train/nonfinite_check.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::train {
namespace {

std::string PositionText(const TrainingPosition& p) {
  if (p.step <= 0) return absl::StrCat("the end of epoch ", p.epoch, "/", p.num_epochs);
  return absl::StrCat("epoch ", p.epoch, "/", p.num_epochs, ", step ", p.step, "/", p.num_steps);
}

// " (also on ranks 0, 2)" for the other ranks in `bad`, or "".
std::string AlsoText(const std::vector<int64_t>& bad) {
  if (bad.size() < 2) return "";
  std::vector<int64_t> rest(bad.begin() + 1, bad.end());
  return absl::StrCat(" (also on rank", rest.size() > 1 ? "s " : " ", absl::StrJoin(rest, ", "), ")");
}

std::string NameOf(absl::Span<const std::string> names, int64_t index) {
  if (index >= 0 && index < static_cast<int64_t>(names.size())) return names[index];
  return absl::StrCat("tensor #", index);
}

// The summed tensor as doubles. REQUIRES: `summed` has `n` elements.
std::vector<double> Values(const at::Tensor& summed, int64_t n) {
  at::Tensor t = summed.to(at::kDouble).contiguous();  // [n]
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + std::min<int64_t>(n, t.numel()));
}

}  // namespace

StepNumerics MeasureStep(double loss, absl::Span<const at::Tensor> params) {
  StepNumerics out;
  out.loss = loss;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined() || g.numel() == 0) continue;
    grads.push_back(g);
    index.push_back(static_cast<int64_t>(i));
  }
  if (grads.empty()) return out;
  // One fused kernel for all gradients of a dtype (torch's clip_grad_norm_).
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  at::Tensor all = at::stack(norms).to(at::kDouble);  // [n]
  const double* n = all.data_ptr<double>();
  double sq = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(n[i]) && out.first_bad_grad < 0) out.first_bad_grad = index[i];
    sq += n[i] * n[i];
  }
  out.grad_norm = std::sqrt(sq);
  // A sum of finite squares can overflow double only past ~1e154 per norm,
  // which fp32 norms never reach; NaN and inf propagate.
  return out;
}

int64_t FirstNonFinite(absl::Span<const at::Tensor> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type())) continue;
    if (!at::isfinite(t).all().item<bool>()) return static_cast<int64_t>(i);
  }
  return -1;
}

at::Tensor PackSlots(absl::Span<const double> mine, int64_t rank, int64_t world) {
  const int64_t k = static_cast<int64_t>(mine.size());
  at::Tensor t = at::zeros({world * k}, at::kDouble);  // [world * k]
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < k; ++i) p[rank * k + i] = mine[i];
  return t;
}

at::Tensor PackStepNumerics(const StepNumerics& s, int64_t rank, int64_t world) {
  const double slots[kStepSlots] = {s.loss, s.grad_norm, static_cast<double>(s.first_bad_grad + 1)};
  return PackSlots(slots, rank, world);
}

NonFiniteVerdict CheckStepNumerics(const at::Tensor& summed, int64_t world, const TrainingPosition& where,
                                   absl::Span<const std::string> grad_names) {
  const std::vector<double> v = Values(summed, world * kStepSlots);
  std::vector<int64_t> bad_loss, bad_grad;
  for (int64_t r = 0; r < world && (r + 1) * kStepSlots <= static_cast<int64_t>(v.size()); ++r) {
    if (!std::isfinite(v[r * kStepSlots])) bad_loss.push_back(r);
    if (!std::isfinite(v[r * kStepSlots + 1])) bad_grad.push_back(r);
  }
  NonFiniteVerdict out;
  if (bad_loss.empty() && bad_grad.empty()) return out;
  const std::string tail =
      "; stopped before the optimizer step: no weight was updated with it and no checkpoint of this epoch is "
      "written (an earlier one is kept). Lower --lr, or check the model's weights and the data";
  std::string what;
  if (!bad_loss.empty()) {
    out.rank = bad_loss[0];
    what = absl::StrCat("non-finite loss at ", PositionText(where), " on rank ", out.rank,
                        ": loss=", v[out.rank * kStepSlots], AlsoText(bad_loss));
  } else {
    out.rank = bad_grad[0];
    const int64_t first = static_cast<int64_t>(v[out.rank * kStepSlots + 2]) - 1;
    what = absl::StrCat("non-finite gradient norm at ", PositionText(where), " on rank ", out.rank,
                        ": grad_norm=", v[out.rank * kStepSlots + 1], AlsoText(bad_grad),
                        first >= 0 ? absl::StrCat(", first in the gradient of ", NameOf(grad_names, first)) : "",
                        " (the loss was finite on every rank)");
  }
  out.error = absl::FailedPreconditionError(absl::StrCat(what, tail));
  return out;
}

NonFiniteVerdict CheckSavedTensors(const at::Tensor& summed, int64_t world, const TrainingPosition& where,
                                   absl::Span<const std::string> names) {
  const std::vector<double> v = Values(summed, world);
  std::vector<int64_t> bad;
  for (int64_t r = 0; r < static_cast<int64_t>(v.size()); ++r) {
    if (v[r] != 0.0) bad.push_back(r);
  }
  NonFiniteVerdict out;
  if (bad.empty()) return out;
  out.rank = bad[0];
  const int64_t first = static_cast<int64_t>(v[out.rank]) - 1;
  out.error = absl::FailedPreconditionError(absl::StrCat(
      "non-finite weights at ", PositionText(where), " on rank ", out.rank, ": ", NameOf(names, first),
      " has a NaN or inf element", AlsoText(bad),
      "; the checkpoint of this epoch is not written (an earlier one is kept). Lower --lr or --weight-decay"));
  return out;
}

}  // namespace tpudist::train
