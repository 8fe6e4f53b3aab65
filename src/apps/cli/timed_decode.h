// The decode loop the benchmarks time: greedy steps of sequences the engine already holds, one
// token each per step, fed back (`bench generate` and `plan --check` measure with it).
#pragma once

#include <cstdint>
#include <vector>

#include "infer/engine.h"

namespace tessera::cli {

// Decodes `steps` tokens for each sequence of `seqs` together; returns the seconds of the decode
// steps only.
double timed_decode(infer::Engine& e, const std::vector<int32_t>& seqs, int64_t steps);

}  // namespace tessera::cli
