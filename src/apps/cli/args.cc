// Flag tables: strict parsing against them, the help text printed from them, and the registry.
#include "apps/cli/args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace tessera::cli {

namespace {

// The single-letter spellings llama.cpp-style tools use; a command that has the long flag
// accepts its letter too.
std::string standard_alias(const std::string& name) {
  if (name == "--model") return "-m";
  if (name == "--prompt") return "-p";
  if (name == "--tokens") return "-n";
  if (name == "--file") return "-f";
  if (name == "--threads") return "-t";
  if (name == "--out") return "-o";
  return "";
}

Flag make(std::string name, FlagKind kind, std::string def, std::string help, std::string metavar) {
  Flag f;
  f.alias = standard_alias(name);
  f.name = std::move(name);
  f.kind = kind;
  f.def = std::move(def);
  f.help = std::move(help);
  f.metavar = std::move(metavar);
  return f;
}

// Shortest text that parses back to the same value.
template <typename T>
std::string shortest(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

int64_t parse_integer(const std::string& flag, const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TS_CHECK(ec == std::errc() && p == s.data() + s.size(), "flag ", flag,
           " expects an integer, got '", s, "'");
  TS_CHECK(v >= lo && v <= hi, "flag ", flag, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

double parse_number(const std::string& flag, const std::string& s, double lo, double hi) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TS_CHECK(ec == std::errc() && p == s.data() + s.size() && std::isfinite(v), "flag ", flag,
           " expects a number, got '", s, "'");
  TS_CHECK(v >= lo && v <= hi, "flag ", flag, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

// Checks a value (given or default) against its flag's kind and range.
void check_value(const Flag& f, const std::string& v) {
  switch (f.kind) {
    case FlagKind::integer:
      parse_integer(f.name, v, f.ilo, f.ihi);
      break;
    case FlagKind::number:
      parse_number(f.name, v, f.flo, f.fhi);
      break;
    case FlagKind::int_list:
      parse_int_list(f.name, v, f.ilo, f.ihi);
      break;
    case FlagKind::text_list:
      if (!(v.empty() && f.empty_list_ok)) split_list(f.name, v);
      break;
    case FlagKind::choice: {
      std::string listed;
      for (const std::string& c : f.choices) listed += (listed.empty() ? "" : ", ") + c;
      TS_CHECK(std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end(), "flag ", f.name,
               " must be one of ", listed, "; got '", v, "'");
      break;
    }
    case FlagKind::text:
    case FlagKind::toggle:
      break;
  }
}

bool is_help(const std::string& a) {
  return a == "--help" || a == "-h";
}

// Whether --help or -h stands in flag position (not as the value of a flag before it).
bool wants_help(const Flags& table, const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    if (is_help(argv[i])) return true;
    for (const Flag& f : table)
      if (argv[i] == f.name || argv[i] == f.alias) {
        if (f.kind != FlagKind::toggle) ++i;  // skip its value (which may be "-h")
        break;
      }
  }
  return false;
}

}  // namespace

Flag Flag::text(std::string name, std::string def, std::string help, std::string metavar) {
  return make(std::move(name), FlagKind::text, std::move(def), std::move(help), std::move(metavar));
}

Flag Flag::choice(std::string name, std::string def, std::vector<std::string> choices,
                  std::string help) {
  // The values as the value's name ("cpu|cuda"); a longer list goes at the end of the help line
  // (the name column is as wide as its widest entry).
  std::string metavar, listed;
  for (size_t i = 0; i < choices.size(); ++i) {
    metavar += (i ? "|" : "") + choices[i];
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  if (metavar.size() > 8) {
    metavar = "ONE";
    help += ": " + listed;
  }
  Flag f = make(std::move(name), FlagKind::choice, std::move(def), std::move(help), metavar);
  f.choices = std::move(choices);
  return f;
}

Flag Flag::threads(std::string help) {
  return integer("--threads", 0, 0, 4096, std::move(help));
}

Flag Flag::integer(std::string name, int64_t def, int64_t lo, int64_t hi, std::string help) {
  Flag f = make(std::move(name), FlagKind::integer, cat(def), std::move(help), "N");
  f.ilo = lo, f.ihi = hi;
  return f;
}

Flag Flag::number(std::string name, double def, double lo, double hi, std::string help) {
  Flag f = make(std::move(name), FlagKind::number, shortest(def), std::move(help), "X");
  f.flo = lo, f.fhi = hi;
  return f;
}

// A float default shows as the float reads ("0.8", not 0.800000011920929): parsed back and
// narrowed to float it is the same value.
Flag Flag::number(std::string name, float def, double lo, double hi, std::string help) {
  Flag f = number(std::move(name), static_cast<double>(def), lo, hi, std::move(help));
  f.def = shortest(def);
  return f;
}

Flag Flag::toggle(std::string name, std::string help) {
  return make(std::move(name), FlagKind::toggle, "", std::move(help), "");
}

Flag Flag::int_list(std::string name, std::string def, int64_t lo, int64_t hi, std::string help) {
  Flag f = make(std::move(name), FlagKind::int_list, std::move(def), std::move(help), "N,N,...");
  f.ilo = lo, f.ihi = hi;
  return f;
}

Flag Flag::text_list(std::string name, std::string def, std::string help) {
  return make(std::move(name), FlagKind::text_list, std::move(def), std::move(help), "A,B,...");
}

Flags join(std::initializer_list<Flags> parts) {
  Flags out;
  for (const Flags& part : parts)
    for (const Flag& f : part) {
      auto same =
          std::find_if(out.begin(), out.end(), [&](const Flag& g) { return g.name == f.name; });
      if (same != out.end())
        *same = f;
      else
        out.push_back(f);
    }
  return out;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  TS_CHECK(!text.empty(), "flag ", flag, " expects a comma-separated list, got an empty one");
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', from), text.size());
    out.push_back(text.substr(from, comma - from));
    TS_CHECK(!out.back().empty(), "flag ", flag, " has an empty item in '", text, "'");
    if (comma == text.size()) return out;
    from = comma + 1;
  }
}

int64_t parse_bytes(const std::string& flag, const std::string& text) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const std::string unit(p, text.data() + text.size());
  static const std::pair<const char*, double> units[] = {{"", 1},
                                                         {"B", 1},
                                                         {"KB", 1e3},
                                                         {"MB", 1e6},
                                                         {"GB", 1e9},
                                                         {"TB", 1e12},
                                                         {"KiB", 1024.0},
                                                         {"MiB", 1048576.0},
                                                         {"GiB", 1073741824.0},
                                                         {"TiB", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  TS_CHECK(ec == std::errc() && p != text.data() && scale > 0, "flag ", flag,
           " expects a size such as 2GiB, 512MiB or 1e9 (bytes), got '", text, "'");
  const double bytes = v * scale;
  TS_CHECK(std::isfinite(bytes) && bytes >= 1 && bytes < 4.6e18, "flag ", flag,
           " must be a positive size below 4 EiB, got '", text, "'");
  return static_cast<int64_t>(bytes);
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t lo,
                                    int64_t hi) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(flag, text)) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    TS_CHECK(ec == std::errc() && p == item.data() + item.size() && v >= lo && v <= hi, "flag ",
             flag, " expects comma-separated integers in [", lo, ", ", hi, "], got '", item,
             "' in '", text, "'");
    out.push_back(v);
  }
  return out;
}

Args::Args(const Flags& table, const std::vector<std::string>& argv,
           const std::vector<Positional>& positionals) {
  std::map<std::string, std::string> by_alias;
  for (const Flag& f : table) {
    table_[f.name] = f;
    if (!f.alias.empty()) by_alias[f.alias] = f.name;
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 2 || a[0] != '-') {
      // "-" alone is a positional too (conventionally stdin).
      TS_CHECK(positional_.size() < positionals.size(), "unexpected argument '", a, "'");
      positional_.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (a[1] == '-') {
      const size_t eq = a.find('=');
      if (eq != std::string::npos)
        name = a.substr(0, eq), value = a.substr(eq + 1), has_value = true;
    } else {
      auto it = by_alias.find(a);
      TS_CHECK(it != by_alias.end(), "unknown flag ", a);
      name = it->second;
    }
    auto it = table_.find(name);
    TS_CHECK(it != table_.end(), "unknown flag ", name);
    const Flag& f = it->second;
    if (f.kind == FlagKind::toggle) {
      TS_CHECK(!has_value, "flag ", name, " takes no value");
      values_[name] = "1";
      continue;
    }
    if (!has_value) {
      TS_CHECK(i + 1 < argv.size(), "flag ", name, " needs a value");
      value = argv[++i];
    }
    check_value(f, value);
    values_[name] = value;
  }
  if (positional_.size() < positionals.size())
    fail("missing argument ", positionals[positional_.size()].name, " (see --help)");
  for (const Flag& f : table)
    if (f.is_required) required(f.name);
}

const Flag& Args::find(const std::string& flag, FlagKind kind) const {
  auto it = table_.find(flag);
  TS_CHECK(it != table_.end() && it->second.kind == kind, "internal: flag ", flag,
           " is not declared with this kind in the command's table");
  return it->second;
}

const std::string& Args::raw(const Flag& f) const {
  auto it = values_.find(f.name);
  return it == values_.end() ? f.def : it->second;
}

std::string Args::str(const std::string& flag) const {
  auto it = table_.find(flag);
  const bool choice = it != table_.end() && it->second.kind == FlagKind::choice;
  return raw(find(flag, choice ? FlagKind::choice : FlagKind::text));
}

int64_t Args::i64(const std::string& flag) const {
  const Flag& f = find(flag, FlagKind::integer);
  return parse_integer(f.name, raw(f), f.ilo, f.ihi);
}

double Args::f64(const std::string& flag) const {
  const Flag& f = find(flag, FlagKind::number);
  return parse_number(f.name, raw(f), f.flo, f.fhi);
}

bool Args::on(const std::string& flag) const {
  return values_.count(find(flag, FlagKind::toggle).name) > 0;
}

std::vector<int64_t> Args::ints(const std::string& flag) const {
  const Flag& f = find(flag, FlagKind::int_list);
  return parse_int_list(f.name, raw(f), f.ilo, f.ihi);
}

std::vector<std::string> Args::strs(const std::string& flag) const {
  const Flag& f = find(flag, FlagKind::text_list);
  const std::string& v = raw(f);
  if (v.empty() && f.empty_list_ok) return {};
  return split_list(f.name, v);
}

bool Args::given(const std::string& flag) const {
  TS_CHECK(table_.count(flag), "internal: flag ", flag, " is not in the command's table");
  return values_.count(flag) > 0;
}

std::string Args::required(const std::string& flag) const {
  TS_CHECK(table_.count(flag), "internal: flag ", flag, " is not in the command's table");
  auto it = values_.find(flag);
  TS_CHECK(it != values_.end() && !it->second.empty(), "missing required flag ", flag);
  return it->second;
}

std::string help_text(const Command& c, const std::string& path) {
  std::string out = "usage: " + path;
  if (!c.subcommands.empty()) {
    out += " <subcommand> [flags]\n" + c.help + "\n\nsubcommands:\n";
    size_t w = 0;
    for (const Command& s : c.subcommands) w = std::max(w, s.name.size());
    for (const Command& s : c.subcommands)
      out += "  " + s.name + std::string(w + 2 - s.name.size(), ' ') + s.help + "\n";
    return out + "\n'" + path + " <subcommand> --help' lists a subcommand's flags.\n";
  }
  for (const Positional& p : c.positionals) out += " " + p.name;
  out += c.wraps ? " [flags] -- COMMAND [ARGS...]\n" : " [flags]\n";
  out += c.help + "\n";
  if (!c.positionals.empty()) {
    out += "\narguments:\n";
    size_t w = 0;
    for (const Positional& p : c.positionals) w = std::max(w, p.name.size());
    for (const Positional& p : c.positionals)
      out += "  " + p.name + std::string(w + 2 - p.name.size(), ' ') + p.help + "\n";
  }
  // Left column: "-m, --model PATH"; letters line up whether or not a flag has one.
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Flag& f : c.flags) {
    std::string left = (f.alias.empty() ? "    " : f.alias + ", ") + f.name;
    if (f.kind != FlagKind::toggle) left += " " + f.metavar;
    std::string right = f.help;
    if (f.is_required)
      right += " (required)";
    else if (f.kind != FlagKind::toggle && !f.def.empty())
      right += " (default: " + f.def + ")";
    rows.emplace_back(left, right);
  }
  rows.emplace_back("-h, --help", "show this help");
  size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.first.size());
  out += "\nflags:\n";
  for (const auto& [left, right] : rows) {
    out += "  " + left + std::string(w + 2 - left.size(), ' ');
    // Past 100 columns the default moves to a line of its own, under the help text.
    const size_t paren = right.rfind(" (default: ");
    if (w + 4 + right.size() > 100 && paren != std::string::npos)
      out += right.substr(0, paren) + "\n" + std::string(w + 4, ' ') + right.substr(paren + 1);
    else
      out += right;
    out += "\n";
  }
  return out;
}

int dispatch(const Command& c, const std::vector<std::string>& argv, const std::string& path) {
  if (!c.subcommands.empty()) {
    std::string known;
    for (const Command& s : c.subcommands) known += (known.empty() ? "" : ", ") + s.name;
    TS_CHECK(!argv.empty(), "missing subcommand (", known, "); see '", path, " --help'");
    if (is_help(argv[0]) || argv[0] == "help") {
      std::fputs(help_text(c, path).c_str(), stdout);
      return 0;
    }
    const std::vector<std::string> rest(argv.begin() + 1, argv.end());
    for (const Command& s : c.subcommands)
      if (s.name == argv[0]) return dispatch(s, rest, path + " " + s.name);
    fail("unknown subcommand '", argv[0], "' (known: ", known, ")");
  }
  std::vector<std::string> own = argv, wrapped;
  if (c.wraps) {
    const auto dash = std::find(own.begin(), own.end(), "--");
    if (dash != own.end()) {
      wrapped.assign(dash + 1, own.end());
      own.erase(dash, own.end());
    }
  }
  if (wants_help(c.flags, own)) {
    std::fputs(help_text(c, path).c_str(), stdout);
    return 0;
  }
  Args args(c.flags, own, c.positionals);
  args.set_wrapped(std::move(wrapped));
  return c.run(args);
}

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace

void register_command(const Command& c) {
  registry().push_back(c);
}
const std::vector<Command>& commands() {
  return registry();
}

}  // namespace tessera::cli
