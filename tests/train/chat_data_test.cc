// Chat data: conversations rendered with SmolLM2's own template (from its GGUF) give exactly the
// template's text, the loss mask covers exactly the assistant turns (their end-of-turn tokens
// included), the loaders turn masked targets into ignored ones, and the loss of a masked batch
// is the mean of the per-token losses on the assistant's tokens alone; bad lines are refused
// naming the file and line.
#include "train/chat_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "infer/loaded_model.h"
#include "jinja/template.h"
#include "model/train_model.h"

namespace tessera::train {
namespace {

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct Smol {
  infer::LoadedModel m;
  ChatTemplate t;
  Smol() {
    model::DecoderLoadOptions lo;
    lo.mmap = true;
    m = infer::load_model_and_tokenizer(kModel, lo, false);
    t.source = m.chat_template;
    t.name = "SmolLM2 chat template";
    t.eos = m.tok.decode({m.tok.special_tokens().eos});
  }
};

nlohmann::ordered_json conversation() {
  return nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What color is Ada's lamp?"},
    {"role": "assistant", "content": "Ada's lamp is teal."},
    {"role": "user", "content": "And Bo's kettle?"},
    {"role": "assistant", "content": "Bo's kettle is amber."}])");
}

TEST(ChatData, MaskCoversTheAssistantTurnsExactly) {
  ASSERT_TRUE(std::filesystem::exists(kModel)) << "run scripts/install-deps.sh";
  const Smol s;
  const ChatTokens c = tokenize_chat(s.m.tok, s.t, conversation(), "test");
  ASSERT_EQ(c.tokens.size(), c.mask.size());
  // All of it is the template's own rendering of the conversation.
  const std::string full =
      jinja::render_chat_template(s.t.source, conversation(), s.t.bos, s.t.eos, false);
  EXPECT_EQ(s.m.tok.decode(c.tokens), full);
  // The masked tokens are the two answers with their end of turn, nothing else.
  std::vector<int32_t> counted, first, second;
  for (size_t i = 0; i < c.tokens.size(); ++i)
    if (c.mask[i]) counted.push_back(c.tokens[i]);
  EXPECT_EQ(s.m.tok.decode(counted),
            "Ada's lamp is teal.<|im_end|>\nBo's kettle is amber.<|im_end|>\n");
  // The user's and system's words never are.
  std::vector<int32_t> rest;
  for (size_t i = 0; i < c.tokens.size(); ++i)
    if (!c.mask[i]) rest.push_back(c.tokens[i]);
  const std::string other = s.m.tok.decode(rest);
  EXPECT_NE(other.find("What color is Ada's lamp?"), std::string::npos);
  EXPECT_EQ(other.find("teal"), std::string::npos);
}

// The loss of a batch whose targets the loader masked is the mean, over the assistant's
// positions only, of the per-token losses an unmasked forward gives: what the user turns hold
// as targets cannot move it.
TEST(ChatData, MaskedLossIsTheAssistantTokensMean) {
  TokenData d;
  d.dir = "memory";
  d.split = "train";
  d.vocab = 37;
  constexpr int64_t T = 16;
  Rng rng(2);
  for (int64_t i = 0; i < 4 * T + 1; ++i) {
    d.tokens.push_back(static_cast<int32_t>(rng.below(37)));
    d.loss_mask.push_back(static_cast<uint8_t>(i % 5 < 2));  // "assistant" at 2 of 5 positions
  }
  ValLoader val(d, T);
  std::vector<int32_t> in(2 * T), tgt(2 * T);
  val.batch(0, 2, in.data(), tgt.data());
  for (int64_t i = 0; i < 2 * T; ++i)
    EXPECT_EQ(tgt[static_cast<size_t>(i)],
              d.loss_mask[static_cast<size_t>(i + 1)] ? d.tokens[static_cast<size_t>(i + 1)] : -1);
  ops::Context ctx;
  ctx.reference = true;
  model::TrainConfig c = model::TrainConfig::preset("llama:tiny", 37);
  c.n_layer = 2, c.n_embd = 32, c.d_ff = 48, c.max_seq = T;
  model::TrainModel m(c, ctx);
  m.init_weights(3);
  m.plan(2, T, model::Precision::f32, model::Recompute::none);
  const double masked = m.forward(in.data(), tgt.data(), 2, T);
  m.forward(in.data(), nullptr, 2, T);
  double sum = 0;
  int n = 0;
  for (int64_t r = 0; r < 2 * T; ++r) {
    const int32_t y = tgt[static_cast<size_t>(r)];
    if (y < 0) continue;
    const float* z = m.logits() + r * c.padded_vocab_size;
    double mx = z[0], se = 0;
    for (int64_t v = 0; v < 37; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < 37; ++v) se += std::exp(z[v] - mx);
    sum += mx + std::log(se) - z[y];
    ++n;
  }
  ASSERT_GT(n, 0);
  EXPECT_NEAR(masked, sum / n, 1e-5);
}

// Two conversations that differ only in a user turn after the last answer: with the mask their
// losses are equal (no user token is a target, and causal attention keeps the answers' context
// the same); counting every token instead, they differ. A model over SmolLM2's vocabulary.
TEST(ChatData, UserTurnsDoNotChangeTheMaskedLoss) {
  const Smol s;
  auto conv = [](const std::string& last_user) {
    nlohmann::ordered_json c = conversation();
    c.push_back({{"role", "user"}, {"content", last_user}});
    return c;
  };
  const ChatTokens a = tokenize_chat(s.m.tok, s.t, conv("Thanks!"), "a");
  const ChatTokens b = tokenize_chat(s.m.tok, s.t, conv("Which one costs more, and why?"), "b");
  ASSERT_NE(a.tokens, b.tokens);
  model::TrainConfig c = model::TrainConfig::preset("llama:tiny", s.m.tok.vocab_size());
  c.n_layer = 2, c.n_embd = 32, c.d_ff = 48, c.max_seq = 128;
  ops::Context ctx;
  ctx.reference = true;
  model::TrainModel m(c, ctx);
  m.init_weights(4);
  auto loss = [&](const ChatTokens& t, bool masked) {
    const auto T = static_cast<int64_t>(t.tokens.size()) - 1;
    std::vector<int32_t> in(t.tokens.begin(), t.tokens.end() - 1), tgt(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i)
      tgt[static_cast<size_t>(i)] =
          !masked || t.mask[static_cast<size_t>(i + 1)] ? t.tokens[static_cast<size_t>(i + 1)] : -1;
    m.plan(1, T, model::Precision::f32, model::Recompute::none);
    return m.forward(in.data(), tgt.data(), 1, T);
  };
  EXPECT_EQ(loss(a, true), loss(b, true));
  EXPECT_GT(std::fabs(loss(a, false) - loss(b, false)), 1e-3);
}

// Padded: each conversation starts a window of its own; the pads count for nothing.
TEST(ChatData, PaddedConversationsStartWindowsOfTheirOwn) {
  const Smol s;
  const std::string dir = ::testing::TempDir() + "/chat_pad_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/chat.jsonl";
  std::vector<nlohmann::ordered_json> convs;
  {
    std::ofstream f(path);
    for (int i = 0; i < 6; ++i) {
      nlohmann::ordered_json c = nlohmann::ordered_json::array();
      c.push_back({{"role", "user"}, {"content", "Count to " + std::to_string(i)}});
      c.push_back({{"role", "assistant"}, {"content", std::string(static_cast<size_t>(i), 'x')}});
      convs.push_back(c);
      f << nlohmann::ordered_json{{"messages", c}}.dump() << "\n";
    }
  }
  PrepareChatOptions o;
  o.input_path = path;
  o.out_dir = dir + "/out";
  o.min_tokens = 2;
  o.val_fraction = 0.2;  // the last two conversations
  o.pad_to = 64;
  prepare_chat_data(o, s.m.tok, s.t);
  const TokenData train = load_split(o.out_dir, "train"), val = load_split(o.out_dir, "val");
  ASSERT_EQ(train.tokens.size() % 64, 0u);
  ASSERT_EQ(val.tokens.size() % 64, 0u);
  // The stream is each conversation's own tokens, then pads (mask 0) to the next window.
  const tokenizer::SpecialTokens& sp = s.m.tok.special_tokens();
  const int32_t pad = sp.pad >= 0 ? sp.pad : sp.eos;  // the tokenizer's pad, else its eos
  std::vector<int32_t> want, want_mask;
  for (const auto& c : convs) {
    const ChatTokens t = tokenize_chat(s.m.tok, s.t, c, "test");
    ASSERT_LE(t.tokens.size(), 64u) << "each conversation fits one window here";
    want.insert(want.end(), t.tokens.begin(), t.tokens.end());
    want_mask.insert(want_mask.end(), t.mask.begin(), t.mask.end());
    want.resize((want.size() + 63) / 64 * 64, pad);
    want_mask.resize(want.size(), 0);
  }
  std::vector<int32_t> got(train.tokens), got_mask(train.loss_mask.begin(), train.loss_mask.end());
  got.insert(got.end(), val.tokens.begin(), val.tokens.end());
  got_mask.insert(got_mask.end(), val.loss_mask.begin(), val.loss_mask.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_mask, want_mask);
  std::filesystem::remove_all(dir);
}

TEST(ChatData, BadLinesNameFileAndLine) {
  const Smol s;
  const std::string dir = ::testing::TempDir() + "/chat_data_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string good = R"({"messages": [{"role": "user", "content": "hi"}, )"
                           R"({"role": "assistant", "content": "hello"}]})";
  for (const auto& [line, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "not valid JSON"},
           {R"({"text": "hello"})", "not a conversation"},
           {R"({"messages": [{"role": "user", "content": "hi"}]})", "no assistant message"},
           {R"({"messages": [{"role": "tool", "content": "x"}]})", "role 'tool'"},
           {R"({"messages": [{"role": "user", "content": 3}]})", "string 'role' and 'content'"}}) {
    const std::string path = dir + "/bad.jsonl";
    std::ofstream(path) << good << "\n" << good << "\n" << line << "\n";
    PrepareChatOptions o;
    o.input_path = path;
    o.out_dir = dir + "/out";
    o.min_tokens = 2;
    try {
      prepare_chat_data(o, s.m.tok, s.t);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ":3"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::train
