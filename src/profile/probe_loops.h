// The measurement loops behind probe_machine (probe.cc): compute peaks from loops that keep
// every SIMD port busy on registers (f32 FMA, bf16 and int8 dot products), and memory
// bandwidths from loops that stream a buffer (STREAM triad, read-only sums). Each runs on one
// thread or on all threads at once; nothing here knows about caches files or JSON.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::profile::loops {

// One thread's compute loop: runs `iters` iterations and returns the operations it did
// (FLOPs, or int8 ops counting a multiply-add as 2).
using Loop = double (*)(int64_t iters);

struct ComputeLoop {
  std::string kind;     // the instruction measured, e.g. "avx512-vnni vpdpbusd"
  Loop loop = nullptr;  // null: this CPU has no such instruction
  int64_t iters = 0;    // per run: long enough (~20-80 ms) that thread start-up is noise
};

ComputeLoop f32_loop();   // AVX-512 FMA, else AVX2 FMA, else scalar multiply-add
ComputeLoop bf16_loop();  // vdpbf16ps; loop null without AVX512-BF16
// The best int8 dot product by cpuid: AVX512-VNNI vpdpbusd, else AVX-VNNI vpdpbusd (256-bit),
// else AVX2 vpmaddubsw + vpmaddwd + vpaddd; loop null (kind "none") without AVX2.
ComputeLoop int8_loop();
// Every int8 loop this CPU can run, best first (tests measure each).
std::vector<ComputeLoop> int8_loops();

// Best of 3 runs of c on `threads` threads at once; G(FL)OP/s summed over the threads.
double measure_ops(const ComputeLoop& c, int threads);

// STREAM triad a = b + s * c over `floats` floats per array, best of 5, counting 3 arrays of
// traffic; GB/s. `scratch` holds at least 3 * floats floats (its contents are overwritten).
double measure_triad(float* scratch, int64_t floats, int threads);

// A float buffer for the read loops: allocated on huge pages where the kernel offers them,
// first touched by each of `threads` threads on its own slice (so on a multi-socket machine each
// slice lives next to the thread that reads it), filled with zeros.
class ReadBuffer {
 public:
  ReadBuffer(int64_t floats, int threads);
  float* data() { return data_.get(); }
  int64_t floats() const { return floats_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> data_;
  int64_t floats_ = 0;
};

// The read loops sum floats in blocks of this many (8 accumulators x one 64-byte vector).
inline constexpr int64_t kReadBlockFloats = 128;

// Read-only bandwidth: thread i sums [i * per_thread, (i + 1) * per_thread) of buf, `passes`
// times per run; best of `reps` runs; GB/s over all threads. `warm`: one untimed pass first, so
// that a slice meant to sit in a cache is there when the clock starts. per_thread is a multiple
// of kReadBlockFloats.
double measure_read(const float* buf, int64_t per_thread, int threads, int64_t passes, int reps,
                    bool warm);

}  // namespace tessera::profile::loops
