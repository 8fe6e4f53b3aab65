// Test helper: asserts that a call throws tessera::Error whose one-line message names something.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace tessera::test {

// Expects fn() to throw an Error whose message contains `part` (a file, field or flag name).
template <typename Fn>
void expect_error(Fn&& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(part), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "error spans several lines: " << what;
  }
}

}  // namespace tessera::test
