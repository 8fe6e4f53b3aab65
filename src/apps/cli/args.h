// Command-line flags: each command declares a table of flags that both parses its argv (up front,
// strictly) and prints its --help, so the two cannot drift; and the command registry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::cli {

enum class FlagKind { text, choice, integer, number, toggle, int_list, text_list };

// One flag of a command's table. Build with the static makers, then chain alias/required/...
struct Flag {
  std::string name;   // "--top-k"
  std::string alias;  // "-m", or empty
  FlagKind kind = FlagKind::text;
  std::string def;           // the default, as text parsed like a given value ("" for none)
  std::string help;          // one line
  std::string metavar;       // what the value is, in help: PATH, N, X, LIST
  int64_t ilo = 0, ihi = 0;  // integer and int_list ranges
  double flo = 0, fhi = 0;   // number range
  bool is_required = false;
  bool empty_list_ok = false;        // text_list: "" means none (else empty lists are refused)
  std::vector<std::string> choices;  // choice: the values allowed

  static Flag text(std::string name, std::string def, std::string help,
                   std::string metavar = "TEXT");
  // One of `choices` (listed in --help as the value's name, "cpu|cuda"); read with Args::str.
  static Flag choice(std::string name, std::string def, std::vector<std::string> choices,
                     std::string help);
  // Worker threads (-t): 0 takes every core.
  static Flag threads(std::string help = "worker threads; 0: all cores");
  static Flag integer(std::string name, int64_t def, int64_t lo, int64_t hi, std::string help);
  static Flag number(std::string name, double def, double lo, double hi, std::string help);
  static Flag number(std::string name, float def, double lo, double hi, std::string help);
  static Flag toggle(std::string name, std::string help);  // a switch: takes no value
  // Comma-separated integers, each in [lo, hi].
  static Flag int_list(std::string name, std::string def, int64_t lo, int64_t hi, std::string help);
  // Comma-separated non-empty strings.
  static Flag text_list(std::string name, std::string def, std::string help);

  Flag& short_name(std::string a) { return alias = std::move(a), *this; }
  Flag& required() { return is_required = true, *this; }
  Flag& allow_empty_list() { return empty_list_ok = true, *this; }
  Flag& value_name(std::string m) { return metavar = std::move(m), *this; }
};

using Flags = std::vector<Flag>;

// Concatenates table fragments (a command's own flags and shared groups such as engine_flags()).
// A later flag with the same name replaces the earlier one (a command narrowing a shared flag).
Flags join(std::initializer_list<Flags> parts);

// Splits "a,b,c" for list flag `flag`; refuses an empty list and empty items, naming the flag.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);
// Comma-separated integers each in [lo, hi] (bench --batch, --sizes, tokenizer --ids).
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t lo,
                                    int64_t hi);

// A size in bytes: a number with an optional unit (B; KB, MB, GB, TB in powers of 1000; KiB,
// MiB, GiB, TiB in powers of 1024), e.g. "2GiB", "1.5GB", "4096"; refused naming the flag
// unless it is positive and below 2^62.
int64_t parse_bytes(const std::string& flag, const std::string& text);

// A positional argument (in order).
struct Positional {
  std::string name;  // IN
  std::string help;
};

// argv parsed against a table: "--name value", "--name=value", "-m value", switches. Every value
// is checked as it is parsed; unknown flags, stray positionals and bad values throw one line.
class Args {
 public:
  Args(const Flags& table, const std::vector<std::string>& argv,
       const std::vector<Positional>& positionals = {});

  // Values (given, or the table's default). Asking for an undeclared flag, or with the wrong
  // kind, is a bug in the command and throws saying so. str reads text and choice flags.
  std::string str(const std::string& flag) const;
  int64_t i64(const std::string& flag) const;
  double f64(const std::string& flag) const;
  bool on(const std::string& flag) const;  // a switch
  std::vector<int64_t> ints(const std::string& flag) const;
  std::vector<std::string> strs(const std::string& flag) const;
  // Whether the user gave the flag at all.
  bool given(const std::string& flag) const;
  // The value, refused when missing or empty (for flags required only in some cases).
  std::string required(const std::string& flag) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // A command that wraps another (Command::wraps): the words after "--", unparsed.
  const std::vector<std::string>& wrapped() const { return wrapped_; }
  void set_wrapped(std::vector<std::string> w) { wrapped_ = std::move(w); }

 private:
  const Flag& find(const std::string& flag, FlagKind kind) const;
  const std::string& raw(const Flag& f) const;

  std::map<std::string, Flag> table_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::vector<std::string> wrapped_;
};

// A command (or a subcommand of `bench` and `tokenizer`): its name, one line of help, its flags
// and positionals, and its entry point; or, with subcommands, no entry point of its own.
struct Command {
  std::string name;
  std::string help;
  Flags flags;
  std::vector<Positional> positionals;
  int (*run)(const Args& args) = nullptr;
  std::vector<Command> subcommands;
  // Takes another command after "--" (`tessera profile -- generate ...`): the words after it
  // reach run() unparsed, as Args::wrapped(); help and flags are those before it.
  bool wraps = false;
};

// The help text of `c` reached as `path` ("tessera bench gemm").
std::string help_text(const Command& c, const std::string& path);
// Parses argv for `c` and runs it (or its subcommand); --help / -h prints help_text and returns
// 0. Errors throw tessera::Error.
int dispatch(const Command& c, const std::vector<std::string>& argv, const std::string& path);

// Each cmd_*.cc registers itself with a static Registrar so main.cc lists no commands by hand.
void register_command(const Command& c);
const std::vector<Command>& commands();
struct Registrar {
  explicit Registrar(const Command& c) { register_command(c); }
};

}  // namespace tessera::cli
