// The project's one exception type and helpers that build context-rich messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

// Every failure the user can cause (bad file, bad flag, bad shape) is an Error whose message
// names the file, field or parameter, e.g. "[gguf] tensor 'x': offset 123 past end (size 100)".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates any streamable values into one string (GCC 12 has no std::format).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

}  // namespace tessera

// Checks a condition that bad input can break; throws tessera::Error with the message parts.
#define TS_CHECK(cond, ...)                    \
  do {                                         \
    if (!(cond)) ::tessera::fail(__VA_ARGS__); \
  } while (0)
