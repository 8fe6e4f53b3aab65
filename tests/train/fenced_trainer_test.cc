// The GPT-2 trainer on a stand-in device whose memory the host cannot touch (test_util/
// fenced_device.h): parameters, gradients, AdamW moments and activations live there, and a
// step touches them only through ops/. Three AdamW steps give the CPU model's losses and
// parameters bit for bit in both precisions and every recompute policy, and a checkpoint
// written from the device loads on the CPU as the same model.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "core/rng.h"
#include "model/gpt2.h"
#include "ops/memory.h"
#include "test_util/fenced_device.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace tessera::train {
namespace {

using model::Gpt2;
using model::Gpt2Config;
using model::Precision;
using model::Recompute;

Gpt2Config tiny() {
  Gpt2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 101;
  c.padded_vocab_size = Gpt2Config::pad_vocab(101);
  c.max_seq = 16;
  return c;
}

struct Steps {
  std::vector<float> losses, params;
};

// Three steps of B=2, T=12 (one target ignored), then an evaluation loss.
Steps train(Gpt2& m, AdamW& opt, Precision p, Recompute rc) {
  constexpr int64_t B = 2, T = 12;
  m.init_weights(5);
  m.plan(B, T, p, rc);
  Rng rng(9);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  Steps r;
  for (int64_t step = 1; step <= 3; ++step) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(101));
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(101));
    targets[3] = -1;
    m.zero_grads();
    r.losses.push_back(m.forward_backward(tokens.data(), targets.data(), B, T, 1.0f));
    opt.step(m.params(), m.grads(), 1e-3, step);
    m.params_updated();
  }
  r.losses.push_back(m.forward(tokens.data(), targets.data(), B, T));
  ops::HostMirror<const float> host(m.context(), m.params(), m.num_params(),
                                    ops::HostMirror<const float>::read);
  r.params.assign(host.data(), host.data() + m.num_params());
  return r;
}

class FencedTrainer : public ::testing::Test {
 protected:
  void TearDown() override { ops::register_backend(ops::Device::cuda, nullptr); }
};

TEST_F(FencedTrainer, StepsMatchTheCpuBitForBit) {
  for (Precision p : {Precision::f32, Precision::bf16})
    for (Recompute rc : {Recompute::none, Recompute::gelu, Recompute::block}) {
      const ops::Context cpu_ctx;
      Gpt2 cpu(tiny(), cpu_ctx);
      AdamW cpu_opt(cpu.tensors(), AdamWConfig{}, cpu_ctx);
      const Steps want = train(cpu, cpu_opt, p, rc);

      test::FencedDevice device(true);
      ops::register_backend(ops::Device::cuda, &device);
      ops::Context ctx;
      ctx.device = ops::Device::cuda;
      Steps got;
      {  // the device's buffers go before the device does
        Gpt2 dev(tiny(), ctx);
        AdamW dev_opt(dev.tensors(), AdamWConfig{}, ctx);
        got = train(dev, dev_opt, p, rc);
      }
      EXPECT_GT(device.ops_run(), 100);
      EXPECT_EQ(got.losses, want.losses) << static_cast<int>(p) << " " << static_cast<int>(rc);
      EXPECT_EQ(got.params, want.params) << static_cast<int>(p) << " " << static_cast<int>(rc);
      ops::register_backend(ops::Device::cuda, nullptr);
    }
}

TEST_F(FencedTrainer, CheckpointFromTheDeviceLoadsOnTheCpu) {
  static test::FencedDevice device(true);  // outlives every buffer of the test
  ops::register_backend(ops::Device::cuda, &device);
  ops::Context ctx;
  ctx.device = ops::Device::cuda;
  Gpt2 dev(tiny(), ctx);
  AdamW opt(dev.tensors(), AdamWConfig{}, ctx);
  const Steps trained = train(dev, opt, Precision::f32, Recompute::none);
  const std::string dir =
      (std::filesystem::temp_directory_path() / "tessera_fenced_checkpoint").string();
  TrainState st;
  st.step = 3;
  save_checkpoint(dir, dev, opt, st, "{}");

  const ops::Context cpu_ctx;
  const std::unique_ptr<Gpt2> cpu = load_model_from_checkpoint(dir, cpu_ctx);
  EXPECT_EQ(std::vector<float>(cpu->params(), cpu->params() + cpu->num_params()), trained.params);
  // And back onto the device, moments included.
  Gpt2 again(tiny(), ctx);
  AdamW again_opt(again.tensors(), AdamWConfig{}, ctx);
  EXPECT_EQ(load_checkpoint(dir, again, again_opt).step, 3);
  ops::HostMirror<const float> p(ctx, again.params(), again.num_params(),
                                 ops::HostMirror<const float>::read);
  EXPECT_EQ(std::vector<float>(p.data(), p.data() + again.num_params()), trained.params);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
