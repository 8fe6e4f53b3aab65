// The GPT-2 trainer on a stand-in device whose memory the host cannot touch (test_util/
// fenced_device.h): parameters, gradients, AdamW moments and activations live there, and a
// step touches them only through ops/. Three AdamW steps give the CPU model's losses and
// parameters bit for bit in both precisions and every recompute policy, a checkpoint written
// from the device loads on the CPU as the same model, and the whole trainer (--device cuda)
// writes the CPU run's losses, checkpoint and model. A mixture of experts's steps match too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/rng.h"
#include "model/train_model.h"
#include "ops/memory.h"
#include "test_util/fenced_device.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace tessera::train {
namespace {

using model::Precision;
using model::Recompute;
using model::TrainConfig;
using model::TrainModel;

TrainConfig tiny() {
  TrainConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 101;
  c.padded_vocab_size = TrainConfig::pad_vocab(101);
  c.max_seq = 16;
  return c;
}

struct Steps {
  std::vector<float> losses, params;
};

// Three steps of B=2, T=12 (one target ignored), then an evaluation loss.
Steps train(TrainModel& m, AdamW& opt, Precision p, Recompute rc) {
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
      TrainModel cpu(tiny(), cpu_ctx);
      AdamW cpu_opt(cpu.tensors(), AdamWConfig{}, cpu_ctx);
      const Steps want = train(cpu, cpu_opt, p, rc);

      test::FencedDevice device(true);
      ops::register_backend(ops::Device::cuda, &device);
      ops::Context ctx;
      ctx.device = ops::Device::cuda;
      Steps got;
      {  // the device's buffers go before the device does
        TrainModel dev(tiny(), ctx);
        AdamW dev_opt(dev.tensors(), AdamWConfig{}, ctx);
        got = train(dev, dev_opt, p, rc);
      }
      EXPECT_GT(device.ops_run(), 100);
      EXPECT_EQ(got.losses, want.losses) << static_cast<int>(p) << " " << static_cast<int>(rc);
      EXPECT_EQ(got.params, want.params) << static_cast<int>(p) << " " << static_cast<int>(rc);
      ops::register_backend(ops::Device::cuda, nullptr);
    }
}

// A mixture of experts (Llama shape, 4 experts, 2 a token): the router's choices go to the host
// and the grouping back to the device every layer, forward and backward; the steps still match
// the CPU's bit for bit, with the activations kept and with the layers replayed.
TEST_F(FencedTrainer, MixtureOfExpertsStepsMatchTheCpuBitForBit) {
  TrainConfig c = TrainConfig::preset("llama:tiny", 101);
  c.n_layer = 2, c.n_embd = 32, c.n_head = 4, c.n_kv_head = 2, c.d_ff = 24, c.max_seq = 16;
  c.options.n_experts = 4, c.options.n_experts_used = 2;
  for (Recompute rc : {Recompute::none, Recompute::block}) {
    const ops::Context cpu_ctx;
    TrainModel cpu(c, cpu_ctx);
    AdamW cpu_opt(cpu.tensors(), AdamWConfig{}, cpu_ctx);
    const Steps want = train(cpu, cpu_opt, Precision::f32, rc);
    test::FencedDevice device(true);
    ops::register_backend(ops::Device::cuda, &device);
    ops::Context ctx;
    ctx.device = ops::Device::cuda;
    Steps got;
    {
      TrainModel dev(c, ctx);
      AdamW dev_opt(dev.tensors(), AdamWConfig{}, ctx);
      got = train(dev, dev_opt, Precision::f32, rc);
    }
    EXPECT_EQ(got.losses, want.losses) << static_cast<int>(rc);
    EXPECT_EQ(got.params, want.params) << static_cast<int>(rc);
    ops::register_backend(ops::Device::cuda, nullptr);
  }
}

TEST_F(FencedTrainer, CheckpointFromTheDeviceLoadsOnTheCpu) {
  static test::FencedDevice device(true);  // outlives every buffer of the test
  ops::register_backend(ops::Device::cuda, &device);
  ops::Context ctx;
  ctx.device = ops::Device::cuda;
  TrainModel dev(tiny(), ctx);
  AdamW opt(dev.tensors(), AdamWConfig{}, ctx);
  const Steps trained = train(dev, opt, Precision::f32, Recompute::none);
  const std::string dir =
      (std::filesystem::temp_directory_path() / "tessera_fenced_checkpoint").string();
  TrainState st;
  st.step = 3;
  save_checkpoint(dir, dev, opt, st, "{}");

  const ops::Context cpu_ctx;
  const std::unique_ptr<TrainModel> cpu = load_model_from_checkpoint(dir, cpu_ctx);
  EXPECT_EQ(std::vector<float>(cpu->params(), cpu->params() + cpu->num_params()), trained.params);
  // And back onto the device, moments included.
  TrainModel again(tiny(), ctx);
  AdamW again_opt(again.tensors(), AdamWConfig{}, ctx);
  EXPECT_EQ(load_checkpoint(dir, again, again_opt).step, 3);
  ops::HostMirror<const float> p(ctx, again.params(), again.num_params(),
                                 ops::HostMirror<const float>::read);
  EXPECT_EQ(std::vector<float>(p.data(), p.data() + again.num_params()), trained.params);
  std::filesystem::remove_all(dir);
}

// train.csv without its timing columns (tokens/s, GFLOP/s, elapsed): step, loss, val, lr, norm.
std::string csv_without_times(const std::string& path) {
  std::istringstream in(read_text_file(path));
  std::string line, out;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
    EXPECT_EQ(cells.size(), 8u) << line;
    if (cells.size() == 8)
      out += cells[0] + "," + cells[1] + "," + cells[2] + "," + cells[3] + "," + cells[6] + "\n";
  }
  return out;
}

// What a run directory's checkpoint holds, read on the CPU: step, parameters, AdamW moments.
struct Saved {
  int64_t step = 0;
  std::vector<float> params, m, v;
  bool operator==(const Saved&) const = default;
};
Saved saved(const std::string& dir) {
  const ops::Context cpu;
  const std::unique_ptr<TrainModel> model = load_model_from_checkpoint(dir, cpu);
  AdamW opt(model->tensors(), AdamWConfig{}, cpu);
  Saved s;
  s.step = load_checkpoint(dir, *model, opt).step;
  const int64_t n = model->num_params();
  s.params.assign(model->params(), model->params() + n);
  s.m.assign(opt.m(), opt.m() + n);
  s.v.assign(opt.v(), opt.v() + n);
  return s;
}

TEST_F(FencedTrainer, WholeRunsMatchTheCpuRuns) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "tessera_fenced_trainer_runs";
  fs::remove_all(root);
  fs::create_directories(root / "data");
  Rng rng(4);
  std::vector<int32_t> stream(3000);
  for (auto& t : stream) t = static_cast<int32_t>(rng.below(50));
  write_shard((root / "data/train_000.bin").string(), stream, 50);
  write_shard((root / "data/val_000.bin").string(), {stream.begin(), stream.begin() + 400}, 50);

  TrainOptions o;
  o.model = "gpt2-tiny";
  o.n_layer = 2, o.n_head = 2, o.n_embd = 32, o.max_seq = 16;
  o.data_dir = (root / "data").string();
  o.batch = 2, o.seq = 16, o.grad_accum = 2;
  o.precision = "bf16";
  o.steps = 6, o.warmup = 2, o.eval_every = 2, o.eval_batches = 2;
  o.threads = 1;
  o.quiet = true;
  auto run = [&](TrainOptions opts, const std::string& out, bool on_device, int64_t stop_at) {
    opts.out_dir = (root / out).string();
    opts.stop_at = stop_at;
    opts.device = on_device ? "cuda" : "cpu";
    Trainer(opts, false).run();
    return opts;
  };

  static test::FencedDevice device(false);  // outlives every buffer of the test
  ops::register_backend(ops::Device::cuda, &device);
  const TrainOptions cpu = run(o, "cpu", false, 0);
  const TrainOptions dev = run(o, "device", true, 0);
  EXPECT_GT(device.ops_run(), 1000);
  EXPECT_EQ(csv_without_times(dev.out_dir + "/train.csv"),
            csv_without_times(cpu.out_dir + "/train.csv"));
  EXPECT_TRUE(saved(dev.out_dir) == saved(cpu.out_dir));
  for (const char* f : {"model/model.safetensors", "model/config.json"})
    EXPECT_EQ(read_text_file(dev.out_dir + "/" + f), read_text_file(cpu.out_dir + "/" + f)) << f;

  // Interrupted on the device, resumed on the CPU: the same run.
  const TrainOptions half = run(o, "half", true, 3);
  TrainOptions rest = resume_options(half.out_dir);
  rest.device = "cpu";
  Trainer(rest, true).run();
  EXPECT_TRUE(saved(half.out_dir) == saved(cpu.out_dir));
  EXPECT_EQ(read_text_file(half.out_dir + "/model/model.safetensors"),
            read_text_file(cpu.out_dir + "/model/model.safetensors"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera::train
