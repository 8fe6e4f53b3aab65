// Command-line flags: "--name value" and "--name=value" pairs plus positionals. Every value is
// parsed strictly; unknown flags and bad numbers give one clear error naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace tessera::cli {

class Args {
 public:
  // `switches` lists flags that take no value (e.g. "--json").
  Args(const std::vector<std::string>& argv, const std::set<std::string>& switches = {});

  std::string str(const std::string& flag, const std::string& def);
  std::string required(const std::string& flag);
  int64_t i64(const std::string& flag, int64_t def, int64_t lo, int64_t hi);
  double f64(const std::string& flag, double def, double lo, double hi);
  bool has(const std::string& flag);  // a switch or a flag given with a value
  const std::vector<std::string>& positional() const { return positional_; }
  // Throws on any flag that no accessor asked about.
  void finish() const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> seen_;
  std::vector<std::string> positional_;
};

// A subcommand: its name, one line of help, and its entry point (argv after the name).
struct Command {
  const char* name;
  const char* help;
  int (*run)(const std::vector<std::string>& argv);
};

// Each cmd_*.cc registers itself with a static Registrar so main.cc lists no commands by hand.
void register_command(const Command& c);
const std::vector<Command>& commands();
struct Registrar {
  explicit Registrar(const Command& c) { register_command(c); }
};

}  // namespace tessera::cli
