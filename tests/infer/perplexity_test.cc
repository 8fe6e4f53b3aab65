// Perplexity: sliding windows score every token once; and on SmolLM2 the q8_0 version of the
// model stays within 1% of its f16 version on a fixed English text.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "compress/quantize.h"
#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "infer/perplexity.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace tessera::infer {
namespace {

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// -log softmax(row)[target] over a float64 row of logits (V).
double reference_nll(const double* row, int V, int32_t target) {
  double mx = row[0], sum = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, row[v]);
  for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
  return std::log(sum) + mx - row[target];
}

TEST(Perplexity, WindowsScoreEachTokenOnceAndMatchDirectComputation) {
  const model::DecoderModel m = test::make_tiny_model({});
  std::vector<int32_t> toks;
  for (int i = 0; i < 50; ++i) toks.push_back((i * 7 + 3) % 64);
  EngineOptions o;
  o.max_ctx = 64;
  Engine e(m, o);
  // One window covering everything == the plain forward pass's log-likelihood.
  PerplexityOptions whole;
  whole.ctx = 64;
  const PerplexityResult r = perplexity(e, toks, whole);
  EXPECT_EQ(r.tokens, 49);
  const std::vector<double> logits = test::reference_logits(m, toks);
  double nll = 0;
  for (size_t t = 1; t < toks.size(); ++t)
    nll += reference_nll(logits.data() + (t - 1) * 64, 64, toks[t]);
  EXPECT_NEAR(r.nll_sum, nll, 1e-3 * nll);
  // Windows of 16 with stride 8: every token after the first is still scored exactly once.
  PerplexityOptions windows;
  windows.ctx = 16;
  windows.stride = 8;
  const PerplexityResult w = perplexity(e, toks, windows);
  EXPECT_EQ(w.tokens, 49);
  EXPECT_GT(w.windows, 4);
  EXPECT_GT(w.ppl(), r.ppl() * 0.5);  // less context, similar scale
}

// llama.cpp's chunks: floor(n / ctx) windows, each starting with the bos token, scoring its
// second half; against the float64 forward of each window.
TEST(Perplexity, ChunksScoreTheSecondHalfOfEachWindowAfterBos) {
  const model::DecoderModel m = test::make_tiny_model({});
  std::vector<int32_t> toks;
  for (int i = 0; i < 50; ++i) toks.push_back((i * 7 + 3) % 64);
  EngineOptions o;
  o.max_ctx = 64;
  Engine e(m, o);
  PerplexityOptions c;
  c.ctx = 16;
  c.scoring = Scoring::chunks;
  c.bos = 1;
  const PerplexityResult r = perplexity(e, toks, c);
  EXPECT_EQ(r.windows, 3);            // 50 / 16; the last 2 tokens are not scored
  EXPECT_EQ(r.tokens, 3 * (15 - 8));  // rows 8 .. 14 of each window
  double nll = 0;
  for (int w = 0; w < 3; ++w) {
    std::vector<int32_t> win(toks.begin() + w * 16, toks.begin() + (w + 1) * 16);
    win[0] = 1;
    const std::vector<double> logits = test::reference_logits(m, win);
    for (int row = 8; row < 15; ++row)
      nll +=
          reference_nll(logits.data() + row * 64, 64, toks[static_cast<size_t>(w * 16 + row + 1)]);
  }
  EXPECT_NEAR(r.nll_sum, nll, 1e-4 * nll);
  c.stride = 4;
  try {
    perplexity(e, toks, c);
    ADD_FAILURE() << "a stride was accepted with chunks scoring";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("stride applies to sliding scoring only"),
              std::string::npos)
        << err.what();
  }
}

TEST(Perplexity, SmolLM2Q8WithinOnePercentOfF16) {
  ASSERT_TRUE(file_exists(kModel)) << "missing " << kModel << ": run scripts/install-deps.sh";
  const model::DecoderModel src = model::load_decoder_gguf(kModel);
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(*src.gguf);
  const std::vector<int32_t> toks = tok.encode_ordinary(
      read_text_file(std::string(TESSERA_SOURCE_DIR) + "/tests/data/llama/ppl_text.txt"));
  // About 1200 tokens: on a few hundred the q8/f16 ratio moved by half a percent between builds
  // (the 8-bit activations make single tokens' losses jumpy); this many averages that out.
  ASSERT_GT(toks.size(), 1000u);
  auto ppl = [&](DType type) {
    compress::QuantizeOptions qo;
    qo.type = type;
    std::vector<compress::TensorQuantStats> stats;
    const model::DecoderModel m = compress::quantize_decoder(src, qo, &stats);
    EngineOptions o;
    o.max_ctx = 256;
    Engine e(m, o);
    PerplexityOptions po;
    po.ctx = 256;
    po.stride = 128;
    return perplexity(e, toks, po).ppl();
  };
  const double f16 = ppl(DType::f16), q8 = ppl(DType::q8_0);
  std::printf("SmolLM2 perplexity on %zu tokens: f16 %.4f, q8_0 %.4f (%+.3f%%)\n", toks.size(), f16,
              q8, 100 * (q8 / f16 - 1));
  EXPECT_GT(f16, 1.5);  // a real model on English prose: well above 1,
  EXPECT_LT(f16, 100);  // and far below the vocabulary size
  EXPECT_LT(std::fabs(q8 / f16 - 1), 0.01);
}

}  // namespace
}  // namespace tessera::infer
