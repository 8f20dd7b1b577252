#include "models/gemma/gemma_model.h"

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/nn/functional/loss.h>

#include "absl/strings/match.h"
#include "models/gemma/attention_mask.h"
#include "models/gemma/position_tables.h"

namespace tpudist::models::gemma {
namespace {

at::Tensor ScaledEmbedding(torch::nn::Embedding table, const at::Tensor& ids, double scale) {
  const at::Tensor& w = table->weight;
  at::Tensor s = at::scalar_tensor(scale, at::kFloat).to(w.scalar_type());
  return table->forward(ids) * s;
}

// Final-logit soft-capping y = cap * tanh(x / cap) as one autograd node:
// the forward is HF's three ops in HF's order (bit-identical), the backward
// one fused op, dx = dy * (1 - t^2) with t = tanh(x / cap), instead of three
// passes over the [B, S, V] logits (mul, tanh backward, div).
class SoftcapFunction : public torch::autograd::Function<SoftcapFunction> {
 public:
  // x: [..., V]. Returns [..., V] in x's dtype.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double cap) {
    at::Tensor t = at::tanh(x / cap);
    ctx->save_for_backward({t});
    return t * cap;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {at::tanh_backward(grads[0], ctx->get_saved_variables()[0]), at::Tensor()};
  }
};

}  // namespace

GemmaTextModelImpl::GemmaTextModelImpl(const GemmaConfig& config) : config_(config), tables_(config) {
  const int64_t h = config.hidden_size;
  const int64_t lp = config.num_hidden_layers * config.hidden_size_per_layer_input;
  embed_tokens = register_module(
      "embed_tokens",
      torch::nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size, h).padding_idx(config.pad_token_id)));
  if (config.hidden_size_per_layer_input > 0) {
    embed_tokens_per_layer = register_module(
        "embed_tokens_per_layer",
        torch::nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size_per_layer_input, lp)
                                 .padding_idx(config.pad_token_id)));
    per_layer_model_projection = register_module(
        "per_layer_model_projection", torch::nn::Linear(torch::nn::LinearOptions(h, lp).bias(false)));
    per_layer_projection_norm = register_module(
        "per_layer_projection_norm", RMSNorm(config.hidden_size_per_layer_input, config.rms_norm_eps));
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(GemmaDecoderLayer(config, i));
  norm = register_module("norm", RMSNorm(h, config.rms_norm_eps));
}

at::Tensor GemmaTextModelImpl::PerLayerInputs(const at::Tensor& input_ids, const at::Tensor& inputs_embeds) {
  const int64_t b = input_ids.size(0), s = input_ids.size(1);
  const int64_t l = config_.num_hidden_layers, p = config_.hidden_size_per_layer_input;
  at::Tensor tok = ScaledEmbedding(embed_tokens_per_layer, input_ids, std::sqrt(static_cast<double>(p)))
                       .reshape({b, s, l, p});
  at::Tensor ctx = per_layer_model_projection->forward(inputs_embeds) *
                   std::pow(static_cast<double>(config_.hidden_size), -0.5);
  ctx = per_layer_projection_norm->forward(ctx.reshape({b, s, l, p}));
  return (ctx + tok) * std::pow(2.0, -0.5);
}

at::Tensor GemmaTextModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  return RunForward(input_ids, attention_mask,
                    [this](const at::Tensor& ids, const at::Tensor& mask) { return Body(ids, mask); });
}

at::Tensor GemmaTextModelImpl::Body(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  TORCH_CHECK(input_ids.dim() == 2, "GemmaTextModel: input_ids must be [B, S], got ", input_ids.sizes());
  const int64_t s = input_ids.size(1);
  at::Tensor h = ScaledEmbedding(embed_tokens, input_ids, std::sqrt(static_cast<double>(config_.hidden_size)));
  const at::ScalarType dtype = h.scalar_type();
  at::Tensor ple;  // [B, S, L, P]
  if (config_.hidden_size_per_layer_input > 0) ple = PerLayerInputs(input_ids, h);

  // RoPE tables and the unpadded causal masks depend only on (S, dtype,
  // device): cached. A padding mask changes per batch: those masks are built.
  const AttentionTables& t = tables_.Get(s, dtype, h.device());
  at::Tensor mask_s = t.mask_sliding, mask_f = t.mask_full;  // [1 or B, 1, S, S]
  if (attention_mask.defined()) {
    mask_s = AdditiveMask(VisibleMask(s, config_.sliding_window, attention_mask), dtype).to(h.device());
    mask_f = AdditiveMask(VisibleMask(s, std::nullopt, attention_mask), dtype).to(h.device());
  }

  SharedKv shared;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const bool sliding = config_.layer_types[i] == LayerType::kSliding;
    at::Tensor pli = ple.defined() ? ple.select(2, i) : at::Tensor();
    h = layers->at<GemmaDecoderLayerImpl>(i).forward(h, pli, sliding ? t.cos_sliding : t.cos_full,
                                                     sliding ? t.sin_sliding : t.sin_full,
                                                     sliding ? mask_s : mask_f, &shared);
  }
  return norm->forward(h);
}

GemmaForCausalLMImpl::GemmaForCausalLMImpl(const GemmaConfig& config) {
  model = register_module("model", GemmaTextModel(config));
}

CausalLMOutput GemmaForCausalLMImpl::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                             const at::Tensor& labels) {
  std::vector<at::Tensor> out =
      RunForwardHooks({input_ids, attention_mask, labels}, [this](const std::vector<at::Tensor>& in) {
        CausalLMOutput o = Body(in[0], in[1], in[2]);
        return std::vector<at::Tensor>{o.logits, o.loss};
      });
  return CausalLMOutput{out.at(0), out.at(1)};
}

CausalLMOutput GemmaForCausalLMImpl::Body(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                          const at::Tensor& labels) {
  at::Tensor h = model->forward(input_ids, attention_mask);
  at::Tensor logits = at::linear(h, model->embed_tokens->weight);  // tied lm_head
  if (const auto& cap = model->config().final_logit_softcapping; cap.has_value()) {
    // fp32: one fused backward; lower precision: HF's three ops, whose bf16
    // roundings the FSDP2 oracle's gradient bounds are set for.
    logits = logits.scalar_type() == at::kFloat ? SoftcapFunction::apply(logits, *cap)
                                                : at::tanh(logits / *cap) * *cap;
  }
  CausalLMOutput out;
  out.logits = logits.to(at::kFloat);
  if (labels.defined()) out.loss = CausalLMLoss(out.logits, labels);
  return out;
}

at::Tensor CausalLMLoss(const at::Tensor& logits, const at::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) &&
                  logits.size(1) == labels.size(1),
              "CausalLMLoss: logits ", logits.sizes(), " vs labels ", labels.sizes());
  const int64_t v = logits.size(2);
  // Pad labels on the right with -100 and shift left by one (HF ForCausalLMLoss).
  at::Tensor shifted = at::constant_pad_nd(labels.to(at::kLong), {0, 1}, kIgnoreIndex).narrow(1, 1, labels.size(1));
  return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, v}), shifted.reshape({-1}), {},
                                at::Reduction::Mean, kIgnoreIndex);
}

void InitGemmaWeights(GemmaForCausalLMImpl& model, const InitOptions& options) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  at::NoGradGuard no_grad;
  const int64_t pad = model.config().pad_token_id;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor p = item.value();
    if (absl::StrContains(name, "norm")) {
      p.fill_(1.0);
      continue;
    }
    at::Tensor init = at::empty(p.sizes(), at::kFloat);
    init.normal_(0.0, options.std, gen);
    if (absl::StrContains(name, "embed_tokens") && pad >= 0 && pad < init.size(0)) init[pad].zero_();
    p.copy_(init);
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (absl::EndsWith(item.key(), "layer_scalar")) item.value().fill_(options.layer_scalar);
  }
}

}  // namespace tpudist::models::gemma
