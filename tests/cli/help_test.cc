// `tessera <command> --help` for every command the binary registers (found from `tessera help`,
// so a new command is covered without editing this file): exits 0, prints its usage, and every
// flag it lists is one the parser knows (asked for without a value, the parser says it needs
// one, never "unknown flag").
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util/run_tessera.h"

namespace {

using tessera::test::run_tessera;
using Result = tessera::test::CliResult;

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// The first word of each indented line of `section` ("commands:", "subcommands:").
std::vector<std::string> names_in_section(const std::string& text, const std::string& section) {
  std::vector<std::string> names;
  bool in = false;
  for (const std::string& l : lines(text)) {
    if (l == section) {
      in = true;
    } else if (in && l.rfind("  ", 0) == 0) {
      std::istringstream w(l);
      std::string name;
      w >> name;
      names.push_back(name);
    } else if (in) {
      break;
    }
  }
  return names;
}

// One flag as help lists it: "  -m, --model PATH  help (default: x)" or "      --json  help".
struct Listed {
  std::string name, alias;
  bool takes_value = false;
};

std::vector<Listed> listed_flags(const std::string& help) {
  std::vector<Listed> flags;
  bool in = false;
  for (const std::string& l : lines(help)) {
    if (l == "flags:") {
      in = true;
      continue;
    }
    if (!in) continue;
    std::istringstream w(l);
    std::string first;
    w >> first;
    if (first.rfind("-", 0) != 0) continue;  // a continuation line (a default moved down)
    Listed f;
    if (first.back() == ',') {
      f.alias = first.substr(0, first.size() - 1);
      w >> f.name;
    } else {
      f.name = first;
    }
    std::string next;
    w >> next;
    // A value's name is upper case (PATH, N, X, N,N,...) or a choice's values (cpu|cuda); a
    // switch's help starts lower case.
    f.takes_value = !next.empty() &&
                    ((next[0] >= 'A' && next[0] <= 'Z') || next.find('|') != std::string::npos);
    flags.push_back(f);
  }
  return flags;
}

// Checks `tessera <path> --help` and -h, then recurses into subcommands; counts the flags seen.
void check_command(const std::string& path, int* flags_seen) {
  SCOPED_TRACE(path);
  const Result r = run_tessera(path + " --help");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_EQ(r.out.rfind("usage: tessera " + path, 0), 0u) << r.out;
  const Result h = run_tessera(path + " -h");
  EXPECT_EQ(h.status, 0) << h.err;
  EXPECT_EQ(h.out, r.out);

  const std::vector<std::string> subs = names_in_section(r.out, "subcommands:");
  if (!subs.empty()) {
    for (const std::string& s : subs) check_command(path + " " + s, flags_seen);
    return;
  }
  const std::vector<Listed> flags = listed_flags(r.out);
  ASSERT_FALSE(flags.empty()) << r.out;
  EXPECT_EQ(flags.back().name, "--help");
  for (const Listed& f : flags) {
    if (f.name == "--help") continue;
    ++*flags_seen;
    // The parser knows every listed spelling: a value-taking flag given last lacks its value, a
    // switch given a value refuses it. Both fail before the command does any work.
    std::vector<std::pair<std::string, std::string>> probes;
    if (f.takes_value) {
      probes.push_back({f.name, "flag " + f.name + " needs a value"});
      if (!f.alias.empty()) probes.push_back({f.alias, "flag " + f.name + " needs a value"});
    } else {
      probes.push_back({f.name + "=1", "flag " + f.name + " takes no value"});
    }
    for (const auto& [arg, expect] : probes) {
      const Result p = run_tessera(path + " " + arg);
      EXPECT_EQ(p.status, 1) << arg << ": " << p.err;
      EXPECT_NE(p.err.find(expect), std::string::npos) << arg << ": " << p.err;
    }
  }
  // Every value-taking flag shows its default, says it is required, or has none (empty text).
  for (const std::string& l : lines(r.out))
    EXPECT_EQ(l.find("(default: )"), std::string::npos) << l;
}

TEST(CliHelp, EveryCommandPrintsItsFlags) {
  const Result r = run_tessera("help");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> cmds = names_in_section(r.out, "commands:");
  ASSERT_GE(cmds.size(), 10u) << r.out;
  int flags_seen = 0;
  for (const std::string& c : cmds) check_command(c, &flags_seen);
  EXPECT_GT(flags_seen, 100);  // about 150 today; a parse of help that finds none fails here
}

TEST(CliHelp, HelpCommandAndBareBinary) {
  const Result g = run_tessera("generate --help");
  const Result h = run_tessera("help generate");
  EXPECT_EQ(h.status, 0);
  EXPECT_EQ(h.out, g.out);
  // --help wins wherever it stands as a flag, even after other flags.
  const Result late = run_tessera("generate -m x.gguf --temperature 0 --help");
  EXPECT_EQ(late.status, 0);
  EXPECT_EQ(late.out, g.out);
  const Result bare = run_tessera("");
  EXPECT_EQ(bare.status, 2);
  EXPECT_NE(bare.err.find("--help"), std::string::npos) << bare.err;
}

}  // namespace
