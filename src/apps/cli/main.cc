// The `tessera` command: finds the subcommand, runs it, and turns any error into one line on
// stderr and a non-zero exit.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/device.h"
#include "core/error.h"

namespace {

void usage(std::FILE* to) {
  std::fprintf(to, "usage: tessera <command> [flags]\n\ncommands:\n");
  auto cmds = tessera::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& c : cmds) std::fprintf(to, "  %-12s %s\n", c.name.c_str(), c.help.c_str());
  std::fprintf(to, "\n'tessera <command> --help' lists a command's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // The backends of ops/: the CPU's, and CUDA's where the build has it.
  tessera::cpu::register_backend();
  tessera::backend::register_cuda_ops_backend();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    usage(stderr);
    return 2;
  }
  // `tessera help` lists the commands; `tessera help CMD` is `tessera CMD --help`.
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() == 1) {
      usage(stdout);
      return 0;
    }
    args = {args[1], "--help"};
  }
  const std::string name = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  for (const auto& c : tessera::cli::commands()) {
    if (name != c.name) continue;
    try {
      return tessera::cli::dispatch(c, rest, "tessera " + name);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessera %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tessera: unknown command '%s' (try 'tessera help')\n", name.c_str());
  return 2;
}
