// Embeddings: the engine's last hidden states, averaged and scaled to unit length, equal the
// float64 forward's, for every family shape; the sequence they ran in is freed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "infer/embed.h"
#include "tiny_model.h"

namespace tessera::infer {
namespace {

TEST(Embed, MeanPooledNormalizedHiddenStateMatchesFloat64) {
  for (model::DecoderArch arch : {model::DecoderArch::llama, model::DecoderArch::gpt2}) {
    test::TinyOptions o;
    o.arch = arch;
    const model::DecoderModel m = test::make_tiny_model(o);
    EngineOptions eo;
    eo.max_ctx = 128;
    eo.block_tokens = 8;
    eo.max_rows = 16;  // 40 tokens run in three chunks
    Engine e(m, eo);
    const std::vector<int32_t> toks = test::random_tokens(40, m.config.vocab, 3);
    const std::vector<float> got = embed_tokens(e, toks);
    const std::vector<double> h = test::reference_logits(m, toks, true);
    const int64_t C = m.config.d_model;
    ASSERT_EQ(got.size(), static_cast<size_t>(C));
    std::vector<double> want(static_cast<size_t>(C), 0.0);
    for (size_t t = 0; t < toks.size(); ++t)
      for (int64_t c = 0; c < C; ++c) want[static_cast<size_t>(c)] += h[t * C + c] / 40;
    double norm = 0, got_norm = 0;
    for (int64_t c = 0; c < C; ++c) {
      norm += want[c] * want[c];
      got_norm += static_cast<double>(got[c]) * got[c];
    }
    EXPECT_NEAR(got_norm, 1.0, 1e-5);
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(got[c], want[c] / std::sqrt(norm), 2e-4) << "dim " << c;
    EXPECT_EQ(e.cache().free_blocks(), e.cache().shape().n_blocks);
  }
}

}  // namespace
}  // namespace tessera::infer
