// Text embeddings from a decoder: the last hidden state (the final norm's output, what the head
// reads) of every token, averaged and scaled to unit length.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "infer/engine.h"

namespace tessera::infer {

// The embedding (C) of `tokens`, run as a sequence of its own (which needs the cache blocks for
// them) and freed after. Throws like Engine::forward.
std::vector<float> embed_tokens(Engine& engine, std::span<const int32_t> tokens);

}  // namespace tessera::infer
