// The `tessera` command: finds the subcommand, runs it, and turns any error into one line on
// stderr and a non-zero exit.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "apps/cli/args.h"
#include "core/error.h"

namespace {

void usage() {
  std::fprintf(stderr, "usage: tessera <command> [flags]\n\ncommands:\n");
  auto cmds = tessera::cli::commands();
  std::sort(cmds.begin(), cmds.end(),
            [](const auto& a, const auto& b) { return std::string(a.name) < b.name; });
  for (const auto& c : cmds) std::fprintf(stderr, "  %-12s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cpu::register_backend();  // the CPU backend of ops/ (CUDA runs in the device engine)
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (const auto& c : tessera::cli::commands()) {
    if (name != c.name) continue;
    try {
      return c.run(rest);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tessera: unknown command '%s' (try 'tessera help')\n", name.c_str());
  return 2;
}
