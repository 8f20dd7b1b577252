#include "nn/module_hooks.h"

#include <string>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace tpudist::nn {
namespace {

class TwoLayer : public HookableModule {
 public:
  TwoLayer() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 4));
    fc2 = register_module("fc2", torch::nn::Linear(4, 2));
  }
  // x: [B, 3] -> [B, 2]
  at::Tensor forward(const at::Tensor& x) {
    return RunForward(x, [&](const at::Tensor& in) { return fc2(at::relu(fc1(in))); });
  }
  // x: [B, 3], y: [B, 2] -> [B, 2]
  at::Tensor forward2(const at::Tensor& x, const at::Tensor& y) {
    return RunForward(x, y, [&](const at::Tensor& a, const at::Tensor& b) { return fc2(fc1(a)) + b; });
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

TEST(ModuleHooksTest, HooksRunInOrderAroundTheBody) {
  TwoLayer m;
  std::vector<std::string> log;
  m.RegisterPreForwardHook([&](HookableModule&, std::vector<at::Tensor>& in) {
    log.push_back("pre1:" + std::to_string(in.size()));
  });
  m.RegisterPreForwardHook([&](HookableModule&, std::vector<at::Tensor>&) { log.push_back("pre2"); });
  m.RegisterPostForwardHook(
      [&](HookableModule& mod, const std::vector<at::Tensor>&, std::vector<at::Tensor>& out) {
        EXPECT_EQ(&mod, &m);
        log.push_back("post:" + std::to_string(out[0].size(1)));
      });
  at::Tensor y = m.forward(torch::ones({5, 3}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(log, (std::vector<std::string>{"pre1:1", "pre2", "post:2"}));
}

TEST(ModuleHooksTest, HooksMayRewriteInputsAndOutputs) {
  TwoLayer m;
  torch::NoGradGuard ng;
  const at::Tensor x = torch::randn({2, 3});
  const at::Tensor plain = m.forward(x);
  // Pre: double the input; post: add 1. Oracle: the body on 2x, plus 1.
  m.RegisterPreForwardHook([](HookableModule&, std::vector<at::Tensor>& in) { in[0] = in[0] * 2; });
  m.RegisterPostForwardHook([](HookableModule&, const std::vector<at::Tensor>& in,
                               std::vector<at::Tensor>& out) { out[0] = out[0] + 1; });
  const at::Tensor hooked = m.forward(x);
  const at::Tensor oracle = m.fc2(at::relu(m.fc1(x * 2))) + 1;
  EXPECT_TRUE(at::allclose(hooked, oracle));
  EXPECT_FALSE(at::allclose(hooked, plain));
}

TEST(ModuleHooksTest, TwoInputFormAndUndefinedInputs) {
  TwoLayer m;
  int seen_undefined = 0;
  m.RegisterPreForwardHook([&](HookableModule&, std::vector<at::Tensor>& in) {
    ASSERT_EQ(in.size(), 2u);
    for (const auto& t : in) seen_undefined += t.defined() ? 0 : 1;
    if (!in[1].defined()) in[1] = torch::zeros({1, 2});
  });
  at::Tensor y = m.forward2(torch::ones({1, 3}), at::Tensor());
  EXPECT_EQ(seen_undefined, 1);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 2}));
}

TEST(ModuleHooksTest, RemoveHookAndAttachments) {
  TwoLayer m;
  int calls = 0;
  auto id = m.RegisterPreForwardHook([&](HookableModule&, std::vector<at::Tensor>&) { ++calls; });
  m.forward(torch::ones({1, 3}));
  EXPECT_TRUE(m.RemoveHook(id));
  EXPECT_FALSE(m.RemoveHook(id));
  m.forward(torch::ones({1, 3}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(m.num_hooks(), 0);

  EXPECT_EQ(m.GetAttachment("k"), nullptr);
  auto v = std::make_shared<int>(7);
  m.SetAttachment("k", v);
  EXPECT_EQ(*std::static_pointer_cast<int>(m.GetAttachment("k")), 7);
  m.SetAttachment("k", nullptr);
  EXPECT_EQ(m.GetAttachment("k"), nullptr);
  EXPECT_EQ(AsHookable(m), &m);
  torch::nn::LinearImpl plain(2, 2);
  EXPECT_EQ(AsHookable(plain), nullptr);
}

TEST(ModuleHooksTest, ExceptionInBodySkipsPostHooks) {
  TwoLayer m;
  int post = 0;
  m.RegisterPostForwardHook(
      [&](HookableModule&, const std::vector<at::Tensor>&, std::vector<at::Tensor>&) { ++post; });
  EXPECT_THROW(m.forward(torch::ones({1, 7})), c10::Error);  // wrong width
  EXPECT_EQ(post, 0);
}

}  // namespace
}  // namespace tpudist::nn
