// `tessera finetune --lora`: adapters on SmolLM2's GGUF, frozen as stored (Q4_1 layers, Q8_0
// head), in one command; the run killed with SIGKILL mid-way and resumed ends with the adapter
// the uninterrupted run writes, byte for byte; the adapter applied at load by generate and
// perplexity and merged by convert; bad input refused in one line naming the flag or file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util/run_tessera.h"

namespace {

using tessera::test::count_lines;
using tessera::test::run_tessera;
using tessera::test::scratch_path;
using tessera::test::slurp;
using Result = tessera::test::CliResult;
namespace fs = std::filesystem;

const std::string kModel =
    std::string(TESSERA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string write_chat(const std::string& name, int n) {
  const std::string path = scratch_path(name);
  std::ofstream f(path);
  for (int i = 0; i < n; ++i)
    f << R"({"messages": [{"role": "user", "content": "What comes after )" << i
      << R"(?"}, {"role": "assistant", "content": ")" << i + 1 << R"( comes next."}]})"
      << "\n";
  return path;
}

int csv_rows(const std::string& dir) {
  return count_lines(slurp(dir + "/train.csv")) - 1;  // less the header
}

const std::string kRun =
    " --lora 8 --lora-alpha 16 --lora-targets q,k,v,o,down --batch 2 --seq 48 --threads 2 "
    "--steps 8 --checkpoint-every 2 --eval-every 4 --eval-batches 1 --lr 1e-3 --warmup 2 --quiet";

TEST(FinetuneLoraCli, KilledAndResumedEqualsTheStraightRun) {
  ASSERT_TRUE(fs::exists(kModel)) << "run scripts/install-deps.sh";
  const std::string data = write_chat("chat.jsonl", 40);
  const std::string straight = scratch_path("straight"), killed = scratch_path("killed");
  fs::remove_all(straight);
  fs::remove_all(killed);
  Result r = run_tessera("finetune -m " + kModel + " --data " + data + " -o " + straight + kRun);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json",
                        "checkpoint.safetensors", "train.csv", "loss.svg", "tokenizer.json"})
    EXPECT_TRUE(fs::exists(straight + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(straight + "/model")) << "a LoRA run writes the adapter, not a model";
  {  // step,loss,val_loss,...: the held-out conversations' loss at steps 4 and 8 falls
    std::ifstream csv(straight + "/train.csv");
    std::string line;
    std::vector<double> val;
    std::getline(csv, line);
    while (std::getline(csv, line)) {
      const size_t c1 = line.find(','), c2 = line.find(',', c1 + 1), c3 = line.find(',', c2 + 1);
      if (c3 > c2 + 1) val.push_back(std::stod(line.substr(c2 + 1, c3 - c2 - 1)));
    }
    ASSERT_EQ(val.size(), 2u);
    EXPECT_LT(val[1], val[0]);
  }

  // The same run, killed once it is past its second checkpoint (step 4) and before its end.
  const std::string cmd = std::string(TESSERA_BINARY_DIR) + "/tessera finetune -m " + kModel +
                          " --data " + data + " -o " + killed + kRun + " >/dev/null 2>&1";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  bool killed_mid_run = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) break;  // finished before it could be killed
    if (fs::exists(killed + "/train.csv") && csv_rows(killed) >= 5) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      killed_mid_run = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(killed_mid_run) << "the run ended before step 5 could be seen";
  EXPECT_FALSE(fs::exists(killed + "/adapter_model.safetensors"));
  r = run_tessera("finetune --resume " + killed + " --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(csv_rows(killed), 8);
  const std::string a = slurp(straight + "/adapter_model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == slurp(killed + "/adapter_model.safetensors")) << "adapters differ";
  EXPECT_EQ(slurp(straight + "/train.csv").substr(0, 40),
            slurp(killed + "/train.csv").substr(0, 40));

  // Applied at load; merged by convert into a GGUF that generate runs as it is.
  r = run_tessera("generate -m " + kModel + " --lora " + straight +
                  " -p \"What comes after 7?\" -n 6 --temperature 0");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("[lora] " + straight + ": rank 8, alpha 16, on q,k,v,o,down"),
            std::string::npos)
      << r.err;
  r = run_tessera("perplexity -m " + kModel + " --lora " + straight + " -f " + data +
                  " --ctx 64 --threads 2");
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string merged = scratch_path("merged.gguf");
  r = run_tessera("convert " + kModel + " --lora " + straight + " " + merged);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("into 150 matrices"), std::string::npos) << r.out;  // 30 layers x 5
  r = run_tessera("generate -m " + merged + " -p \"What comes after 7?\" -n 6 --temperature 0");
  EXPECT_EQ(r.status, 0) << r.err;
  for (const std::string& p : {straight, killed, merged}) fs::remove_all(p);
}

TEST(FinetuneLoraCli, BadInputIsOneLine) {
  const std::string data = write_chat("chat.jsonl", 8), out = scratch_path("bad");
  const std::string base = "finetune -m " + kModel + " --data " + data + " -o " + out + " --seq 32";
  const struct {
    std::string args, names;
  } cases[] = {
      {base + " --lora 1000", "rank 1000 for q (576 x 576)"},
      {base + " --lora 8 --lora-targets q,attn", "--lora-targets: 'attn' is not a matrix"},
      {base + " --lora-alpha 8", "--lora-alpha needs --lora RANK"},
      {base + " --lora 8 --precision bf16", "--lora trains in f32"},
      {"finetune --resume " + out + " --lora 4", "--lora cannot be given with --resume"},
      {"generate -m " + kModel + " --lora " + data + " -p hi", "no adapter_config.json"},
      {"convert " + kModel + " --lora /nonexistent " + scratch_path("x.gguf"),
       "no adapter_config.json"},
  };
  for (const auto& c : cases) {
    const Result r = run_tessera(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(count_lines(r.err), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << c.args << "\n" << r.err;
  }
  fs::remove_all(out);
}

}  // namespace
