// The CPU backend of ops/: the SIMD kernels on the context's thread pool, or the plain-loop
// reference kernels when the context asks for them (ctx.reference, the test oracle).
#pragma once

namespace tessera::cpu {

// Registers the CPU backend for ops::Device::cpu. A program calls it once before its first op
// (apps/cli's main and the tests' main do); calling it again changes nothing.
void register_backend();

}  // namespace tessera::cpu
