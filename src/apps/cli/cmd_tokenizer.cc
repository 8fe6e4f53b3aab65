// `tessera tokenizer train|encode|decode`: byte-level BPE training on a text file, and encoding or
// decoding with a tokenizer.json.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "core/error.h"
#include "core/file_io.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

constexpr char kUsage[] =
    "usage: tessera tokenizer train --in corpus.txt --out tok.json [--vocab 8192] "
    "[--specials '<|endoftext|>']\n"
    "       tessera tokenizer encode --tok tok.json (--text TEXT | --in FILE) [--ordinary]\n"
    "       tessera tokenizer decode --tok tok.json --ids 1,2,3";

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const size_t comma = s.find(',', from);
    out.push_back(s.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

int train(Args& args) {
  const std::string in = args.required("--in");
  const std::string out = args.required("--out");
  const auto vocab = static_cast<int32_t>(args.i64("--vocab", 8192, 256, 1 << 24));
  const std::string specials_flag = args.str("--specials", "<|endoftext|>");
  args.finish();
  std::vector<std::string> specials;
  if (!specials_flag.empty()) specials = split_commas(specials_flag);
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

int encode(Args& args) {
  const std::string path = args.required("--tok");
  const bool has_text = args.has("--text"), has_in = args.has("--in");
  const std::string text_flag = args.str("--text", "");
  const std::string in = args.str("--in", "");
  const bool ordinary = args.has("--ordinary");
  args.finish();
  TS_CHECK(has_text != has_in, "tokenizer encode: give exactly one of --text and --in");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(path);
  const std::string text = has_in ? read_text_file(in) : text_flag;
  const std::vector<int32_t> ids = ordinary ? tok.encode_ordinary(text) : tok.encode(text);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += cat(i ? "," : "", ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

int decode(Args& args) {
  const std::string path = args.required("--tok");
  const std::string ids_flag = args.str("--ids", "");
  args.finish();
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(path);
  std::vector<int32_t> ids;
  if (!ids_flag.empty()) {
    for (const std::string& s : split_commas(ids_flag)) {
      int32_t v = 0;
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      TS_CHECK(ec == std::errc() && p == s.data() + s.size(),
               "flag --ids expects integers "
               "separated by commas, got '",
               s, "'");
      ids.push_back(v);
    }
  }
  const std::string text = tok.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int run(const std::vector<std::string>& argv) {
  Args args(argv, {"--ordinary"});
  const auto& pos = args.positional();
  if (pos.empty() || pos[0] == "help") {
    std::fprintf(stderr, "%s\n", kUsage);
    return pos.empty() ? 2 : 0;
  }
  TS_CHECK(pos.size() == 1, "tokenizer: unexpected argument '", pos[1], "'");
  if (pos[0] == "train") return train(args);
  if (pos[0] == "encode") return encode(args);
  if (pos[0] == "decode") return decode(args);
  fail("tokenizer: unknown subcommand '", pos[0], "' (expected train, encode or decode)");
}

static Registrar reg({"tokenizer", "train, encode or decode a byte-level BPE tokenizer", &run});

}  // namespace
}  // namespace tessera::cli
