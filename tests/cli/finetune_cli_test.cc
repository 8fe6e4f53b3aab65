// `tessera finetune`: SmolLM2's GGUF fine-tuned on a few chat conversations in one command (the
// data prepared with its own template, the model saved with it), continued with --resume, the
// held-out conversations' loss falling, and bad input refused in one line naming the file and
// line or the flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util/run_tessera.h"

namespace {

using tessera::test::count_lines;
using tessera::test::run_tessera;
using tessera::test::scratch_path;
using Result = tessera::test::CliResult;

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string write_chat(const std::string& name, int n, const std::string& last_line = "") {
  const std::string path = scratch_path(name);
  std::ofstream f(path);
  for (int i = 0; i < n; ++i)
    f << R"({"messages": [{"role": "user", "content": "What is )" << i << R"( plus one?"}, )"
      << R"({"role": "assistant", "content": "It is )" << i + 1 << R"(."}]})"
      << "\n";
  if (!last_line.empty()) f << last_line << "\n";
  return path;
}

TEST(FinetuneCli, ChatDataOneCommandThenResume) {
  ASSERT_TRUE(std::filesystem::exists(kModel)) << "run scripts/install-deps.sh";
  const std::string data = write_chat("chat.jsonl", 24), out = scratch_path("tuned");
  std::filesystem::remove_all(out);
  const std::string common =
      " --batch 1 --seq 48 --threads 2 --eval-every 1 --eval-batches 1 "
      "--lr 5e-5 --warmup 0 --schedule constant --quiet";
  Result r = run_tessera("finetune -m " + kModel + " --data " + data + " -o " + out +
                         " --steps 2 --val-fraction 0.2" + common);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* f : {"data/train_000.bin", "data/train_000.mask", "data/chat_template.jinja",
                        "checkpoint.safetensors", "train.csv", "model/config.json",
                        "model/chat_template.jinja", "model/tokenizer.json"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  r = run_tessera("finetune --resume " + out + " --steps 3 --gguf --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  // The GGUF and the folder name the model they were tuned from.
  EXPECT_NE(tessera::test::slurp(out + "/model/config.json").find("(fine-tuned)"),
            std::string::npos);
  r = run_tessera("generate -m " + out +
                  "/model.gguf -p \"What is 3 plus one?\" -n 4 "
                  "--temperature 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("(fine-tuned)"), std::string::npos) << r.err;
  // step,loss,val_loss,...: three steps, each evaluated on the held-out conversations, whose
  // loss falls.
  std::ifstream csv(out + "/train.csv");
  std::string line;
  std::vector<double> val;
  std::getline(csv, line);  // the header
  while (std::getline(csv, line)) {
    const size_t a = line.find(','), b = line.find(',', a + 1);
    val.push_back(std::stod(line.substr(b + 1)));
  }
  ASSERT_EQ(val.size(), 3u);
  EXPECT_LT(val[2], val[0]);
  // The saved model chats with the template it was tuned with.
  r = run_tessera("generate -m " + out + "/model -p \"What is 3 plus one?\" -n 4 --temperature 0");
  EXPECT_EQ(r.status, 0) << r.err;
  std::filesystem::remove_all(out);
}

TEST(FinetuneCli, BadInputIsOneLine) {
  const std::string out = scratch_path("bad_tuned");
  const std::string bad = write_chat("bad.jsonl", 4, R"({"text": "not a chat"})");
  Result r = run_tessera("finetune -m " + kModel + " --data " + bad + " -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(bad + ":5"), std::string::npos) << r.err;
  r = run_tessera("finetune --resume " + out + " --data " + bad);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--data"), std::string::npos) << r.err;
  r = run_tessera("finetune -m /nonexistent/m.gguf --data " + bad + " -o " + out);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/m.gguf"), std::string::npos) << r.err;
}

}  // namespace
