// `tessera tokenizer train|encode|decode`: byte-level BPE training on a text file, and encoding or
// decoding with a tokenizer.json.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

int train(const Args& args) {
  const std::string in = args.str("--in");
  const std::string out = args.str("--out");
  const auto vocab = static_cast<int32_t>(args.i64("--vocab"));
  const std::vector<std::string> specials = args.strs("--specials");
  const std::string text = read_text_file(in);

  const auto t0 = std::chrono::steady_clock::now();
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::train_bpe(text, vocab, specials);
  const double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tok.save_json(out);

  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text);
  const double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const int64_t merges = tok.vocab_size() - 256 - static_cast<int64_t>(specials.size());
  std::printf("trained %s: vocab %d (%lld merges) on %s (%zu bytes)\n", out.c_str(),
              tok.vocab_size(), static_cast<long long>(merges), in.c_str(), text.size());
  std::printf("train time %.3f s, %.0f merges/s\n", train_s,
              merges / (train_s > 0 ? train_s : 1e-9));
  std::printf("encode time %.3f s (%.2f MB/s); %zu tokens, %.3f bytes/token\n", enc_s,
              text.size() / 1e6 / (enc_s > 0 ? enc_s : 1e-9), ids.size(),
              ids.empty() ? 0.0 : static_cast<double>(text.size()) / ids.size());
  if (vocab != tok.vocab_size())
    std::printf("note: the corpus ran out of pairs to merge before vocab %d\n", vocab);
  return 0;
}

// The tokenizer of --tok (a tokenizer.json) or -m (a GGUF file, vocab-only ones included, or a
// Hugging Face folder with its tokenizer_config.json); exactly one of them.
tokenizer::Tokenizer load_tokenizer(const Args& args) {
  const bool has_tok = args.given("--tok"), has_model = args.given("--model");
  TS_CHECK(has_tok != has_model, "give exactly one of --tok TOKENIZER.json and -m MODEL");
  if (has_tok) return tokenizer::Tokenizer::load_json(args.str("--tok"));
  const std::string path = args.str("--model");
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
    const formats::GgufFile f(path);  // metadata only: the tensors are never read
    return tokenizer::Tokenizer::from_gguf(f);
  }
  const std::filesystem::path dir(path);
  TS_CHECK(std::filesystem::is_directory(dir), "-m ", path,
           ": neither a .gguf file nor a Hugging Face folder");
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json((dir / "tokenizer.json").string());
  const std::string cfg = (dir / "tokenizer_config.json").string();
  if (file_exists(cfg)) tokenizer::apply_tokenizer_config(read_text_file(cfg), cfg, &tok);
  return tok;
}

// Where encode and decode take their tokenizer from (load_tokenizer).
Flags tokenizer_source_flags() {
  return {Flag::text("--tok", "", "a tokenizer.json (or give -m)", "PATH"),
          Flag::text("--model", "", "a .gguf file or HF folder whose tokenizer to use", "PATH")
              .short_name("-m")};
}

int encode(const Args& args) {
  const bool has_text = args.given("--text"), has_in = args.given("--in");
  const std::string text_flag = args.str("--text");
  const std::string in = args.str("--in");
  const bool special = args.on("--special");
  TS_CHECK(has_text != has_in, "tokenizer encode: give exactly one of --text and --in");
  const tokenizer::Tokenizer tok = load_tokenizer(args);
  const std::string text = has_in ? read_text_file(in) : text_flag;
  const std::vector<int32_t> ids = special ? tok.encode(text) : tok.encode_ordinary(text);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += cat(i ? "," : "", ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

int decode(const Args& args) {
  const std::vector<int64_t> ids64 = args.ints("--ids");
  const tokenizer::Tokenizer tok = load_tokenizer(args);
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());  // each in int32 range (the table's)
  const std::string text = tok.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

const Registrar reg({
    "tokenizer",
    "train a BPE tokenizer, or encode / decode with any model's",
    {},
    {},
    nullptr,
    {
        {"train",
         "learn BPE merges from a text file; writes a tokenizer.json",
         {
             Flag::text("--in", "", "the training text", "PATH").required(),
             Flag::text("--out", "", "the tokenizer.json to write", "PATH").required(),
             Flag::integer("--vocab", 8192, 256, 1 << 24, "vocabulary size (256 bytes + merges)"),
             Flag::text_list("--specials", "<|endoftext|>", "special tokens; '' for none")
                 .allow_empty_list(),
         },
         {},
         &train,
         {}},
        {"encode",
         "token ids of a text, comma-separated on one line",
         join({tokenizer_source_flags(),
               {
                   Flag::text("--text", "", "the text (give this or --in)"),
                   Flag::text("--in", "", "a file holding the text (give this or --text)", "PATH"),
                   Flag::toggle("--special",
                                "match special tokens' text (<|im_end|>, ...); "
                                "default: ordinary text"),
               }}),
         {},
         &encode,
         {}},
        {"decode",
         "the text of token ids",
         join({tokenizer_source_flags(),
               {Flag::int_list("--ids", "", 0, INT32_MAX, "the token ids").required()}}),
         {},
         &decode,
         {}},
    },
});

}  // namespace
}  // namespace tessera::cli
