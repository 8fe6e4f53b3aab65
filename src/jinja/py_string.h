// Python's string operations over UTF-8, as Jinja templates reach them through str methods and
// filters: code point indexing, strip/split/replace, case changes, repr, float repr, JSON
// quoting and %-formatting. Case changes cover ASCII, Latin-1, Greek and Cyrillic (Python maps
// all of Unicode); whitespace is Unicode's, as in Python.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja {

class Value;

// Byte offset of each code point of s, plus s.size() at the end (so size() - 1 code points).
std::vector<size_t> code_point_offsets(std::string_view s);
int64_t code_point_count(std::string_view s);
// Python's str.isspace() for one code point.
bool is_space_code_point(uint32_t cp);

// str.strip / lstrip / rstrip: `chars` absent strips Unicode whitespace, else any of its code
// points.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit): sep absent splits on whitespace runs and drops empty pieces; an empty
// sep fails. maxsplit < 0: no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0: all. An empty `old` inserts between code points.
std::string py_replace(std::string_view s, std::string_view old, std::string_view with,
                       int64_t count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(std::string_view s);    // the title filter (words split at -, space, ([{<)

// repr() of a str: single quotes unless it holds ' and no ", escapes as Python writes them.
std::string py_repr_string(std::string_view s);
// repr() of a float: shortest round-trip digits, "1.0", "1e+16", "1e-05", "inf", "nan".
std::string py_float_repr(double d);
// A JSON string literal as json.dumps(ensure_ascii=False) writes it.
std::string json_quote(std::string_view s);
// HTML escape as markupsafe does it: & < > " ' -> &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(std::string_view s);
// Python's "fmt" % args (args: the tuple's items, or one value): %s %r %d %i %f %F %e %x %X %o
// %c %% with flags, width and precision; %(name)s takes from a dict argument.
std::string percent_format(std::string_view fmt, const Value& args);
// Python's str.format(*args, **kwargs) for {} {0} {name} fields (no format specs other than
// empty); others fail.
std::string brace_format(std::string_view fmt, const std::vector<Value>& args,
                         const std::vector<std::pair<std::string, Value>>& kwargs);

}  // namespace tessera::jinja
