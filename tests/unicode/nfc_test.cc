// Unicode NFC against Python's unicodedata (goldens from scripts/gen_nfc_tokenizer_golden.py):
// tricky strings, invalid UTF-8, every code point alone, the quick-check fast path, hostile input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/file_io.h"
#include "core/rng.h"
#include "unicode/nfc.h"

namespace tessera::unicode {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

const nlohmann::json& golden() {
  static const nlohmann::json g = nlohmann::json::parse(read_text_file(kDir + "nfc_golden.json"));
  return g;
}

std::string from_hex(const std::string& hex) {
  std::string s;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    s.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return s;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  } else if (cp < 0x10000) {
    s += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
          static_cast<char>(0x80 | (cp & 0x3F))};
  } else {
    s += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
          static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return s;
}

std::string nfc(std::string_view s) {
  std::string buf;
  return std::string(nfc_normalize(s, &buf));
}

TEST(Nfc, MatchesPythonOnTrickyStrings) {
  ASSERT_GE(golden()["cases"].size(), 35u);
  for (const auto& c : golden()["cases"]) {
    const std::string in = from_hex(c["in"]), want = from_hex(c["nfc"]);
    const std::string label = c["label"];
    EXPECT_EQ(nfc(in), want) << label << ": " << testing::PrintToString(in);
    EXPECT_EQ(nfc(want), want) << label << " (idempotent)";
    if (is_nfc_quick(in)) {
      EXPECT_EQ(in, want) << label << " (quick check said yes)";
    }
  }
}

// Each code point alone: the ones Python changes map to Python's output, all others to
// themselves (this checks every decomposition, exclusion and recomposition in the tables).
TEST(Nfc, EveryCodePointAloneMatchesPython) {
  std::unordered_map<uint32_t, std::string> changed;
  for (const auto& s : golden()["singles"])
    changed[s[0].get<uint32_t>()] = from_hex(s[1].get<std::string>());
  ASSERT_GT(changed.size(), 1000u);
  size_t mismatches = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string in = utf8(cp);
    const auto it = changed.find(cp);
    const std::string& want = it == changed.end() ? in : it->second;
    const std::string got = nfc(in);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "U+" << std::hex << cp << ": got " << testing::PrintToString(got)
                    << ", want " << testing::PrintToString(want);
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Nfc, QuickCheckReturnsTheInputWithoutCopying) {
  for (const std::string& text :
       {std::string("plain ASCII, the common case\n"), std::string(),
        std::string("caf\xC3\xA9 \xE7\x81\xAF\xE5\x8F\xB0 \xF0\x9F\x98\x80"),  // café 灯台 😀
        std::string("bad \xFF bytes \xC3")}) {
    std::string buf = "untouched";
    const std::string_view out = nfc_normalize(text, &buf);
    EXPECT_EQ(out.data(), text.data()) << testing::PrintToString(text);
    EXPECT_EQ(buf, "untouched");
    EXPECT_TRUE(is_nfc_quick(text));
  }
  EXPECT_FALSE(is_nfc_quick("cafe\xCC\x81"));
  EXPECT_FALSE(is_nfc_quick("\xE2\x84\xAB"));  // U+212B ANGSTROM SIGN
}

// A long run of combining marks (hostile input) sorts in n log n and keeps every mark.
TEST(Nfc, LongCombiningRun) {
  std::string in = "a";
  for (int i = 0; i < 100000; ++i) in += i % 2 ? "\xCC\x81" : "\xCC\xA3";  // U+0301, U+0323
  const std::string out = nfc(in);
  // a + U+0323 -> U+1EA1; the first U+0301 composes with nothing (U+1EA1 + U+0301 has no
  // composite), and the rest follow: 50000 below-dots, then 50000 acutes.
  std::string want = "\xE1\xBA\xA1";
  for (int i = 1; i < 50000; ++i) want += "\xCC\xA3";
  for (int i = 0; i < 50000; ++i) want += "\xCC\x81";
  EXPECT_EQ(out, want);
}

// Random byte soup (lead bytes, continuation bytes, marks, jamo, ASCII): no crash, the output is
// a fixed point, and byte strings that are already NFC come back unchanged.
TEST(Nfc, RandomBytesAreSafeAndIdempotent) {
  const std::vector<std::string> atoms = {"a",
                                          "e",
                                          " ",
                                          "\xCC\x81",
                                          "\xCC\xA3",
                                          "\xE1\x84\x80",
                                          "\xE1\x85\xA1",
                                          "\xE1\x86\xA8",
                                          "\xEA\xB0\x80",
                                          "\xC3",
                                          "\x80",
                                          "\xFF",
                                          "\xE2\x84\xAB",
                                          "\xED\xA0\x80",
                                          "\xF0\x9F",
                                          "\xE0\xA5\x98",
                                          "\xCD\x85"};
  Rng rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string in;
    const int n = static_cast<int>(rng.next_u64() % 24);
    for (int i = 0; i < n; ++i) in += atoms[rng.next_u64() % atoms.size()];
    const std::string once = nfc(in);
    EXPECT_EQ(nfc(once), once) << testing::PrintToString(in);
  }
}

}  // namespace
}  // namespace tessera::unicode
