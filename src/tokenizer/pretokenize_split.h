// The pre-tokenizers written as a Sequence of Split steps (pretokenize_split.cc); the dispatch of
// pretokenize(PreTokenizer, ...) calls them.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace tessera::tokenizer {

// kind: falcon, deepseek_coder or deepseek_llm.
void pretokenize_sequence(PreTokenizer kind, std::string_view text,
                          std::vector<std::string_view>* out);

}  // namespace tessera::tokenizer
