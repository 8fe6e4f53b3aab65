// The shared forward pass on a device: a stand-in device whose memory the host cannot touch
// (its pages are PROT_NONE except while one of its ops runs) executes the ops with the CPU's
// kernels. The engine on it must give the CPU engine's logits; any host read or write of device
// memory outside ops/ (a forgotten memcpy, a host loop over an activation) faults and fails the
// test. So the part of the CUDA route no machine here can run shrinks to the backend's kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compress/quantize.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "model/decoder_forward.h"
#include "ops/backend.h"
#include "ops/op_tally.h"
#include "test_util/fenced_device.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

using test::FencedDevice;

// Registers a fenced device as CUDA for one test and removes it after.
class FencedEngine : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override { ops::register_backend(ops::Device::cuda, nullptr); }
};

// 0: Llama with grouped KV heads; 1: GPT-2; 2: q/k/v biases and a tied head; 3: a sliding
// window of 5 positions; 4: a mixture of 4 experts (2 per token) with OLMoE's q/k norms and a
// layer without RoPE (SmolLM3's).
model::DecoderModel model_for(int v) {
  test::TinyOptions o;
  o.layers = 2;
  if (v == 1) o.arch = model::DecoderArch::gpt2;
  if (v == 2) o.qkv_bias = o.tied = true;
  if (v == 4) {
    o.experts = 4;
    o.qk_norm_whole = true;
    o.nope_every = 2;
  }
  o.seed = 40 + static_cast<uint64_t>(v);
  model::DecoderModel m = test::make_tiny_model(o);
  if (v == 3) m.config.sliding_window = 5;
  return m;
}

// Two prompts in one call (chunks of 8 rows, blocks of 4 tokens), then six decode steps of both
// sequences together; the logits of every call, in order.
std::vector<float> run(const model::DecoderModel& m, const EngineOptions& o) {
  Engine e(m, o);
  const int64_t V = m.config.vocab;
  const int32_t a = e.new_sequence(), b = e.new_sequence();
  const std::vector<int32_t> pa = test::random_tokens(11, V, 1), pb = test::random_tokens(6, V, 2);
  std::vector<float> all = e.forward({Feed{a, pa, true}, Feed{b, pb, false}});
  for (int step = 0; step < 6; ++step) {
    const int32_t ta = step + 1, tb = step + 7;
    const std::vector<float>& l = e.forward({Feed{a, {&ta, 1}, false}, Feed{b, {&tb, 1}, false}});
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

EngineOptions options(DType kv_type) {
  EngineOptions o;
  o.max_ctx = 64;
  o.kv_tokens = 256;
  o.block_tokens = 4;
  o.max_rows = 8;
  o.kv_type = kv_type;
  o.max_sequences = 2;  // variant 3's windowed layers in a pool of their own, blocks freed
  return o;
}

// With the CPU's key layout the fenced engine runs the very same kernels on the same values: the
// logits are equal bit for bit. With a GPU's (keys as rows) the attention sums in another order.
TEST_P(FencedEngine, MatchesTheCpuEngine) {
  const model::DecoderModel m = model_for(GetParam());
  for (DType kv : {DType::f32, DType::f16})
    for (bool transposed : {true, false}) {
      FencedDevice device(transposed);
      ops::register_backend(ops::Device::cuda, &device);
      const std::vector<float> want = run(m, options(kv));
      EngineOptions o = options(kv);
      o.ctx.device = ops::Device::cuda;
      const std::vector<float> got = run(m, o);
      EXPECT_GT(device.ops_run(), 100);
      // Every attention call came with the staged plan of its rows.
      EXPECT_GT(device.attention_calls(), 0);
      EXPECT_EQ(device.plans_checked(), device.attention_calls());
      ASSERT_EQ(got.size(), want.size());
      if (transposed) {
        EXPECT_EQ(got, want) << dtype_name(kv);
      } else {
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
              << dtype_name(kv) << " element " << i;
      }
      ops::register_backend(ops::Device::cuda, nullptr);
    }
}

// A device that records graphs (as CUDA captures a stream): decode steps of a shape seen before
// replay the recorded ops, which read the step's staged inputs at replay, and give the same
// logits as the CPU engine, bit for bit. The recording itself may not copy or allocate.
TEST_P(FencedEngine, RecordedStepsReplayTheSameLogits) {
  const model::DecoderModel m = model_for(GetParam());
  FencedDevice device(true, /*graphs=*/true);
  ops::register_backend(ops::Device::cuda, &device);
  const std::vector<float> want = run(m, options(DType::f16));
  EngineOptions o = options(DType::f16);
  o.ctx.device = ops::Device::cuda;
  EXPECT_EQ(run(m, o), want);
  // Six decode steps of one shape: eager, then recorded. A MoE step sorts its rows by expert on
  // the host, which no graph can hold: every step runs eagerly.
  if (m.config.moe())
    EXPECT_EQ(device.replays(), 0);
  else
    EXPECT_GE(device.replays(), 5);
  ops::register_backend(ops::Device::cuda, nullptr);
}

// On a device, q, k and v (with their biases) and gate and up are uploaded side by side, so each
// group is one product: a layer's prompt step runs 1 + 2 products (gate and up write apart at
// several rows), a one-row step 1 + 1. The logits stay the CPU's, bit for bit.
TEST_P(FencedEngine, GroupsRunAsOneProductEach) {
  const model::DecoderModel m = model_for(GetParam());
  if (m.config.moe()) GTEST_SKIP() << "a MoE layer's experts run their own products";
  const bool gpt2 = m.config.arch == model::DecoderArch::gpt2;
  auto one_sequence = [&](const EngineOptions& o) {
    Engine e(m, o);
    const int32_t s = e.new_sequence();
    const std::vector<int32_t> prompt = test::random_tokens(7, m.config.vocab, 3);
    std::vector<float> all = e.forward({Feed{s, prompt, false}});
    for (int32_t token = 1; token <= 4; ++token) {
      const std::vector<float>& l = e.forward({Feed{s, {&token, 1}, false}});
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> want = one_sequence(options(DType::f16));
  FencedDevice device(true);
  ops::register_backend(ops::Device::cuda, &device);
  EngineOptions o = options(DType::f16);
  o.ctx.device = ops::Device::cuda;
  EXPECT_EQ(one_sequence(o), want);
  // GPT-2's MLP is one matrix (no gate), run outside the groups.
  const int64_t prompt = gpt2 ? 1 : 3, step = gpt2 ? 1 : 2;
  EXPECT_EQ(device.group_products(), m.config.n_layers * (prompt + 4 * step));

  {  // freed while the device is registered
    const model::DeviceModel d = model::to_device(m, o.ctx);
    for (const model::DecoderLayer& l : d.view.weights.layers) {
      EXPECT_TRUE(l.wq.continued_by(l.wk) && l.wk.continued_by(l.wv));
      if (l.bq.present()) {
        EXPECT_TRUE(l.bq.continued_by(l.bk) && l.bk.continued_by(l.bv));
      }
      if (!gpt2) {
        EXPECT_TRUE(l.w_gate.continued_by(l.w_up));
      }
    }
  }
  ops::register_backend(ops::Device::cuda, nullptr);
}

// A device with quantized activations (the fenced one's: an f32 copy, at up to 4 rows): at one
// row the norms, the attention and the gated activation also write their output quantized, and
// the next products read those rows, each checked at the read to hold its x's present values.
// Per one-row step: q/k/v of every layer but the first (whose norm is a plain one), the MLP's
// input, the attention output's product, and down after a gated MLP. A prompt of 7 rows takes
// none. The logits stay the CPU's, bit for bit.
TEST_P(FencedEngine, QuantizedRowsReachTheirProducts) {
  const model::DecoderModel f32 = model_for(GetParam());
  if (f32.config.moe()) GTEST_SKIP() << "a MoE layer's experts read the f32 rows";
  compress::QuantizeOptions q;
  q.type = DType::q8_0;
  const model::DecoderModel m = compress::quantize_decoder(f32, q, nullptr);
  const bool gpt2 = m.config.arch == model::DecoderArch::gpt2;
  auto one_sequence = [&](const EngineOptions& o) {
    Engine e(m, o);
    const int32_t s = e.new_sequence();
    std::vector<float> all = e.forward({Feed{s, test::random_tokens(7, m.config.vocab, 5), false}});
    for (int32_t token = 1; token <= 4; ++token) {
      const std::vector<float>& l = e.forward({Feed{s, {&token, 1}, false}});
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> want = one_sequence(options(DType::f16));
  FencedDevice device(true, /*graphs=*/true);
  ops::register_backend(ops::Device::cuda, &device);
  EngineOptions o = options(DType::f16);
  o.ctx.device = ops::Device::cuda;
  EXPECT_EQ(one_sequence(o), want);
  // Matrices too narrow for q8_0's blocks stay f32 (the tiny model's down: 48 columns), and
  // their input stays unquantized.
  auto block = [](const model::WeightRef& w) { return w.type == DType::q8_0; };
  int64_t per_step = 0;
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    const model::DecoderLayer& w = m.weights.layers[static_cast<size_t>(l)];
    per_step += (l > 0 && block(w.wq)) + block(gpt2 ? w.w_up : w.w_gate) + block(w.wo) +
                (!gpt2 && block(w.w_down));
  }
  EXPECT_GE(per_step, 3 * m.config.n_layers - 1);
  EXPECT_EQ(device.quantized_reads(), 4 * per_step);
  EXPECT_GE(device.replays(), 2);  // replays read the rows written in them too
}

INSTANTIATE_TEST_SUITE_P(Models, FencedEngine, ::testing::Values(0, 1, 2, 3, 4));

// An observer in the context that is not watching (a TallySwitch pointing nowhere) leaves the
// graphs to the device; once it watches, every op runs eagerly and, with synchronize, is waited
// for on both sides, and the stages' scopes are summed. The logits stay the CPU's throughout.
class FencedEngineObserved : public ::testing::Test {
 protected:
  void TearDown() override { ops::register_backend(ops::Device::cuda, nullptr); }
};

TEST_F(FencedEngineObserved, AWatchingObserverRunsEagerlyAndWaits) {
  const model::DecoderModel m = model_for(0);
  FencedDevice device(true, /*graphs=*/true);
  ops::register_backend(ops::Device::cuda, &device);
  ops::TallySwitch watch;
  watch.synchronize = true;
  ops::OpTally tally;
  EngineOptions o = options(DType::f16), on_cpu = options(DType::f16);
  o.ctx.device = ops::Device::cuda;
  o.ctx.observer = &watch;
  Engine e(m, o), cpu(m, on_cpu);
  const int32_t s = e.new_sequence(), c = cpu.new_sequence();
  const std::vector<int32_t> prompt = test::random_tokens(5, m.config.vocab, 4);
  EXPECT_EQ(e.forward({Feed{s, prompt, false}}), cpu.forward({Feed{c, prompt, false}}));
  auto steps = [&](int32_t first) {
    for (int32_t token = first; token < first + 4; ++token)
      ASSERT_EQ(e.forward({Feed{s, {&token, 1}, false}}),
                cpu.forward({Feed{c, {&token, 1}, false}}));
  };
  steps(1);
  const int64_t replays = device.replays();
  EXPECT_GE(replays, 2);
  EXPECT_EQ(device.syncs(), 0);
  watch.into = &tally;
  const int64_t ops_before = device.ops_run();
  steps(5);
  EXPECT_EQ(device.replays(), replays);
  const int64_t ops = device.ops_run() - ops_before;
  EXPECT_GT(ops, 0);
  EXPECT_GE(device.syncs(), 2 * ops);  // before and after each op (scopes add more)
  int64_t tallied = 0;
  for (const ops::OpTotal& t : tally.totals()) tallied += t.calls;
  EXPECT_GE(tallied, ops);
  bool attention = false;
  for (const ops::ScopeTotal& sc : tally.scopes()) attention |= sc.name == "attention";
  EXPECT_TRUE(attention);
}

// The fence is real: the host touching the device's memory outside an op faults.
TEST(FencedDeviceDeathTest, HostReadOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        FencedDevice device(true);
        ops::register_backend(ops::Device::cuda, &device);
        ops::Buffer b(ops::Device::cuda, 64);
        volatile float x = b.as<float>()[0];
        (void)x;
      },
      "");
}

}  // namespace
}  // namespace tessera::infer
