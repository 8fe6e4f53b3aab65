// GPT-2 training on the GPU against the CPU model in bf16 precision on a tiny model: the model's
// own step (model::TrainModel) on the CUDA ops backend. The loss, every tensor's gradient, and
// the loss curve over AdamW steps (with clipping and weight-decay runs) agree within bf16
// tolerances; the trainer learns on it; the recompute policies give the same gradients in less
// device memory; and bad shapes and tokens are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/ops_backend.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "model/train_model.h"
#include "ops/memory.h"
#include "test_util/expect_error.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace tessera {
namespace {

constexpr int64_t kB = 2, kT = 64;

model::TrainConfig tiny_config() {
  model::TrainConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 128;  // head dim 64, as the flash attention kernels need
  c.vocab_size = 300;
  c.padded_vocab_size = model::TrainConfig::pad_vocab(300);
  c.max_seq = 128;
  return c;
}

void batch(uint64_t seed, std::vector<int32_t>& inp, std::vector<int32_t>& tgt) {
  Rng rng(seed);
  inp.resize(kB * kT);
  tgt.resize(kB * kT);
  for (size_t i = 0; i < inp.size(); ++i) {
    inp[i] = static_cast<int32_t>(rng.below(300));
    tgt[i] = i % 17 == 5 ? -1 : static_cast<int32_t>(rng.below(300));  // some ignored targets
  }
}

// The GPU side of a comparison: the model's own step on a CUDA context (its ops on the CUDA
// ops backend) with its AdamW there.
class GpuGpt2 {
 public:
  // Starts from cpu's parameters, planned for (kB, kT) in bf16 with recompute rc.
  GpuGpt2(const model::TrainModel& cpu, model::Recompute rc, const train::AdamWConfig& ac) {
    cuda::register_ops_backend();
    ctx_.device = ops::Device::cuda;
    model_ = std::make_unique<model::TrainModel>(cpu.config(), ctx_);
    model_->plan(kB, kT, model::Precision::bf16, rc);
    const int64_t n = cpu.num_params();
    ops::copy(ctx_, model_->params(), cpu.params(), static_cast<size_t>(n) * sizeof(float),
              ops::CopyKind::host_to_device);
    model_->params_updated();
    opt_ = std::make_unique<train::AdamW>(model_->tensors(), ac, ctx_);
  }
  model::TrainModel& model() { return *model_; }
  void zero_grads() { model_->zero_grads(); }
  float forward_backward(const std::vector<int32_t>& inp, const std::vector<int32_t>& tgt) {
    return model_->forward_backward(inp.data(), tgt.data(), kB, kT, 1.0f);
  }
  float forward(const std::vector<int32_t>& inp, const std::vector<int32_t>& tgt) {
    return model_->forward(inp.data(), tgt.data(), kB, kT);
  }
  std::vector<float> grads() const {
    std::vector<float> g(static_cast<size_t>(model_->num_params()));
    ops::copy(ctx_, g.data(), model_->grads(), g.size() * sizeof(float),
              ops::CopyKind::device_to_host);
    return g;
  }
  double adamw_step(float lr, int64_t t) {
    const double norm = opt_->step(model_->params(), model_->grads(), lr, t);
    model_->params_updated();
    return norm;
  }

 private:
  ops::Context ctx_;
  std::unique_ptr<model::TrainModel> model_;
  std::unique_ptr<train::AdamW> opt_;
};

TEST(CudaGpt2Step, GradientsAndLossCurveMatchCpu) {
  TS_REQUIRE_CUDA_DEVICE();
  const ops::Context ctx;
  model::TrainModel cpu(tiny_config(), ctx);
  cpu.init_weights(3);
  cpu.plan(kB, kT, model::Precision::bf16, model::Recompute::none);
  cpu.params_updated();
  train::AdamWConfig ac;
  GpuGpt2 gpu(cpu, model::Recompute::none, ac);

  std::vector<int32_t> inp, tgt;
  batch(1, inp, tgt);
  cpu.zero_grads();
  gpu.zero_grads();
  const float want = cpu.forward_backward(inp.data(), tgt.data(), kB, kT, 1.0f);
  const float got = gpu.forward_backward(inp, tgt);
  EXPECT_NEAR(got, want, 0.01 * want);

  // Each tensor's gradient: relative L2 error within bf16 activation rounding.
  const std::vector<float> g = gpu.grads();
  for (const TensorInfo& t : cpu.tensors().tensors()) {
    double err = 0, ref = 0;
    for (int64_t i = t.offset; i < t.offset + t.shape.numel(); ++i) {
      const double d = g[static_cast<size_t>(i)] - cpu.grads()[i];
      err += d * d;
      ref += static_cast<double>(cpu.grads()[i]) * cpu.grads()[i];
    }
    if (ref == 0) {
      EXPECT_EQ(err, 0) << t.name;
      continue;
    }
    EXPECT_LT(std::sqrt(err / ref), 0.08) << t.name;
  }

  // Six AdamW steps on both (clip 1.0: the random model's first gradients exceed it).
  train::AdamW opt(cpu.tensors(), ac, ctx);
  for (int64_t step = 1; step <= 6; ++step) {
    batch(10 + static_cast<uint64_t>(step), inp, tgt);
    cpu.zero_grads();
    gpu.zero_grads();
    const float lc = cpu.forward_backward(inp.data(), tgt.data(), kB, kT, 1.0f);
    const float lg = gpu.forward_backward(inp, tgt);
    EXPECT_NEAR(lg, lc, 0.02 * lc) << "step " << step;
    const double nc = opt.step(cpu.params(), cpu.grads(), 1e-3, step);
    cpu.params_updated();
    const double ng = gpu.adamw_step(1e-3f, step);
    EXPECT_NEAR(ng, nc, 0.05 * nc) << "step " << step;
  }
  // The evaluation forward (no backward) agrees too, after the updates.
  batch(99, inp, tgt);
  const float want_eval = cpu.forward(inp.data(), tgt.data(), kB, kT);
  EXPECT_NEAR(gpu.forward(inp, tgt), want_eval, 0.02 * want_eval);
}

// `tessera train --device cuda` end to end: a tiny GPT-2 learns a repeating 16-token cycle on
// the GPU (a loss below 0.5 needs the previous token: see tests/train/trainer_test.cc), and the
// checkpoint and final model it writes hold the device's weights.
TEST(CudaGpt2Step, TrainerLearnsOnTheGpu) {
  TS_REQUIRE_CUDA_DEVICE();
  namespace fs = std::filesystem;
  const std::string root = ::testing::TempDir() + "tessera_cuda_trainer";
  fs::remove_all(root);
  fs::create_directories(root + "/data");
  auto cycle = [](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      t[static_cast<size_t>(i)] = static_cast<int32_t>((5 * (i % 16) + 3) % 64);
    return t;
  };
  train::write_shard(root + "/data/train_000.bin", cycle(4000), 64);
  train::write_shard(root + "/data/val_000.bin", cycle(600), 64);
  train::TrainOptions o;
  o.model = "gpt2-tiny";
  o.n_layer = 2, o.n_head = 1, o.n_embd = 64, o.max_seq = 64;  // head dim 64
  o.data_dir = root + "/data";
  o.out_dir = root + "/run";
  o.batch = 4, o.seq = 32;
  o.precision = "bf16";
  o.device = "cuda";
  cuda::register_ops_backend();
  o.lr = 3e-3, o.warmup = 10, o.steps = 100;
  o.eval_every = 50, o.eval_batches = 2;
  o.quiet = true;
  train::Trainer t(o, false);
  EXPECT_GT(t.evaluate(), 3.0);
  const train::TrainResult r = t.run();
  EXPECT_EQ(r.steps_done, 100);
  EXPECT_LT(r.last_loss, 0.5);
  EXPECT_LT(r.last_val, 0.5);
  // The host model now holds the trained weights: its own (CPU) evaluation agrees.
  const double cpu_val = [&] {
    train::TrainOptions c = o;
    c.device = "cpu";
    c.out_dir = root + "/cpu";
    c.init_from = o.out_dir + "/model";
    return train::Trainer(c, false).evaluate();
  }();
  EXPECT_NEAR(cpu_val, r.last_val, 0.05 + 0.05 * r.last_val);
}

// The recompute policies change what the device keeps, not what it computes: the loss and the
// evaluation forward are the same bits, every gradient agrees with the policy `none` within the
// run-to-run spread of the attention backward's f32 atomics, and the arena is smaller
// (block < gelu < none).
TEST(CudaGpt2, RecomputePoliciesGiveTheSameGradientsInLessMemory) {
  TS_REQUIRE_CUDA_DEVICE();
  const ops::Context ctx;
  std::vector<int32_t> inp, tgt;
  batch(5, inp, tgt);
  struct Run {
    float loss = 0, eval = 0;
    int64_t bytes = 0;
    std::vector<float> grads;
  };
  model::TrainModel cpu(tiny_config(), ctx);
  cpu.init_weights(4);
  auto run = [&](model::Recompute rc) {
    GpuGpt2 gpu(cpu, rc, train::AdamWConfig{});
    gpu.zero_grads();
    Run r;
    r.loss = gpu.forward_backward(inp, tgt);
    r.grads = gpu.grads();
    r.eval = gpu.forward(inp, tgt);
    r.bytes = gpu.model().activation_bytes();
    return r;
  };
  const Run none = run(model::Recompute::none);
  const Run gelu = run(model::Recompute::gelu);
  const Run block = run(model::Recompute::block);
  EXPECT_LT(gelu.bytes, none.bytes);
  EXPECT_LT(block.bytes, gelu.bytes);
  for (const Run* r : {&gelu, &block}) {
    EXPECT_EQ(r->loss, none.loss);
    EXPECT_EQ(r->eval, none.eval);
    for (const TensorInfo& t : cpu.tensors().tensors()) {
      double err = 0, ref = 0;
      for (int64_t i = t.offset; i < t.offset + t.shape.numel(); ++i) {
        const double d = r->grads[static_cast<size_t>(i)] - none.grads[static_cast<size_t>(i)];
        err += d * d;
        ref += static_cast<double>(none.grads[static_cast<size_t>(i)]) *
               none.grads[static_cast<size_t>(i)];
      }
      if (ref == 0) {
        EXPECT_EQ(err, 0) << t.name;
        continue;
      }
      EXPECT_LT(std::sqrt(err / ref), 0.01) << t.name << (r == &gelu ? " (gelu)" : " (block)");
    }
  }
}

// A head dim the flash kernels do not take (32), a sequence past the plan and a token outside
// the vocabulary: each one line naming it.
TEST(CudaGpt2, RefusesBadShapesAndTokens) {
  TS_REQUIRE_CUDA_DEVICE();
  const ops::Context ctx;
  model::TrainConfig c = tiny_config();
  c.n_head = 4;  // head dim 32
  model::TrainModel odd(c, ctx);
  odd.init_weights(1);
  GpuGpt2 odd_gpu(odd, model::Recompute::none, train::AdamWConfig{});
  std::vector<int32_t> inp(kB * kT, 1), tgt(kB * kT, 2);
  test::expect_error([&] { odd_gpu.forward(inp, tgt); }, "D=32");
  model::TrainModel m(tiny_config(), ctx);
  m.init_weights(1);
  GpuGpt2 gpu(m, model::Recompute::none, train::AdamWConfig{});
  std::vector<int32_t> longer(kB * (kT + 1), 1);
  test::expect_error([&] { gpu.model().forward(longer.data(), longer.data(), kB, kT + 1); },
                     "exceeds the plan");
  inp[7] = 300;
  test::expect_error([&] { gpu.forward(inp, tgt); }, "tokens[7] = 300");
}

}  // namespace
}  // namespace tessera
