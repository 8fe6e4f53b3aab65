// GPU benchmark of the decode matvec (cuda::matmul_wt, M = 1 and 8) for Llama 1B/8B shapes and
// every weight type, as GB/s of weight bytes against the device's measured read bandwidth, plus
// whole-model decode-step estimates (tokens/s) for 1B- and 8B-shaped Llamas.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/quant_matvec.h"
#include "backend/device.h"
#include "core/dtype.h"

namespace {

using tessera::DType;

constexpr int kReps = 10;  // timed repetitions (median reported)

template <class F>
double median_ms(F&& body, int inner) {
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) body();  // warmup (also grows the matvec scratch)
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < kReps; ++r) {
    TS_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < inner; ++i) body();
    TS_CUDA_CHECK(cudaEventRecord(b));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / inner);
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double measure_read_bandwidth_gbs(const std::string& gpu) {
  const size_t bytes = size_t{1} << 30;
  const double gbs = tessera::backend::cuda_read_bandwidth(bytes) / 1e9;
  std::printf("{\"name\":\"read_bandwidth\",\"gpu\":\"%s\",\"bytes\":%zu,\"GBps\":%.1f}\n",
              gpu.c_str(), bytes, gbs);
  return gbs;
}

// Fills weights with a fixed byte: f16 scales 0x1111 are small normal numbers, so the kernels
// do ordinary arithmetic (the values do not matter for timing).
void* alloc_weights(size_t bytes) {
  void* p = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&p, bytes));
  TS_CUDA_CHECK(cudaMemset(p, 0x11, bytes));
  return p;
}

struct Shape {
  const char* model;
  const char* what;
  int64_t K, N;
};

void bench_shape(const std::string& gpu, double bw, const Shape& s, DType t, int64_t M, float* x,
                 float* y) {
  const size_t bytes = static_cast<size_t>(tessera::dtype_bytes(t, s.K * s.N));
  // Cycle through enough copies (>= 256 MB, several times the L2) that every call reads HBM.
  const size_t copies = std::min<size_t>(64, std::max<size_t>(1, (size_t{256} << 20) / bytes));
  std::vector<void*> w;
  for (size_t c = 0; c < copies; ++c) w.push_back(alloc_weights(bytes));
  size_t next = 0;
  const double ms = median_ms(
      [&] {
        tessera::cuda::matmul_wt(y, s.N, x, M, s.K, w[next], t, s.N, nullptr, nullptr);
        next = (next + 1) % copies;
      },
      20);
  for (void* p : w) TS_CUDA_CHECK(cudaFree(p));
  const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  std::printf(
      "{\"name\":\"quant_matvec\",\"gpu\":\"%s\",\"model\":\"%s\",\"matrix\":\"%s\","
      "\"type\":\"%s\",\"M\":%lld,\"K\":%lld,\"N\":%lld,\"weight_bytes\":%zu,"
      "\"median_ms\":%.5f,\"GBps\":%.1f,\"fraction_of_measured_bw\":%.3f}\n",
      gpu.c_str(), s.model, s.what, std::string(tessera::dtype_name(t)).c_str(),
      static_cast<long long>(M), static_cast<long long>(s.K), static_cast<long long>(s.N), bytes,
      ms, gbs, gbs / bw);
  std::fflush(stdout);
}

struct ModelShape {
  const char* name;
  int64_t C, kv, F, L, V;  // width, k/v projection rows, MLP width, layers, vocab
};

// One decode step's matvecs at M = 1 (q, k, v, o, gate, up, down per layer, then the LM head)
// over distinct per-layer weights, captured once into a CUDA graph so the CPU launch cost is
// out of the figure (as the engine's decode graphs will run it).
void bench_model(const std::string& gpu, double bw, const ModelShape& m, DType t, float* x,
                 float* y) {
  struct Mat {
    int64_t K, N;
    void* w;
  };
  std::vector<Mat> mats;
  size_t total = 0;
  auto add = [&](int64_t K, int64_t N) {
    const size_t b = static_cast<size_t>(tessera::dtype_bytes(t, K * N));
    mats.push_back({K, N, alloc_weights(b)});
    total += b;
  };
  for (int64_t l = 0; l < m.L; ++l) {
    add(m.C, m.C);   // q
    add(m.C, m.kv);  // k
    add(m.C, m.kv);  // v
    add(m.C, m.C);   // o
    add(m.C, m.F);   // gate
    add(m.C, m.F);   // up
    add(m.F, m.C);   // down
  }
  add(m.C, m.V);  // LM head
  cudaStream_t stream;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto step = [&] {
    for (const Mat& a : mats)
      tessera::cuda::matmul_wt(y, a.N, x, 1, a.K, a.w, t, a.N, nullptr, stream);
  };
  step();  // grows the scratch before capture
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  TS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> times;
  for (int r = 0; r < kReps; ++r) {
    TS_CUDA_CHECK(cudaEventRecord(a, stream));
    TS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TS_CUDA_CHECK(cudaEventRecord(b, stream));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  TS_CUDA_CHECK(cudaStreamDestroy(stream));
  for (const Mat& mat : mats) TS_CUDA_CHECK(cudaFree(mat.w));
  const double gbs = static_cast<double>(total) / (ms * 1e-3) / 1e9;
  std::printf(
      "{\"name\":\"decode_step_estimate\",\"gpu\":\"%s\",\"model\":\"%s\",\"type\":\"%s\","
      "\"M\":1,\"matvecs\":%zu,\"weight_bytes_per_token\":%zu,\"median_ms\":%.4f,"
      "\"tokens_per_s\":%.1f,\"GBps\":%.1f,\"fraction_of_measured_bw\":%.3f}\n",
      gpu.c_str(), m.name, std::string(tessera::dtype_name(t)).c_str(), mats.size(), total, ms,
      1e3 / ms, gbs, gbs / bw);
  std::fflush(stdout);
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("quant_matvec_bench: no CUDA device present, nothing to measure\n");
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::string gpu = prop.name;
    const double bw = measure_read_bandwidth_gbs(gpu);

    const int64_t kMaxK = 14336, kMaxN = 128256;
    float *x = nullptr, *y = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&x, 8 * kMaxK * sizeof(float)));
    TS_CUDA_CHECK(cudaMalloc(&y, 8 * kMaxN * sizeof(float)));
    TS_CUDA_CHECK(cudaMemset(x, 0, 8 * kMaxK * sizeof(float)));

    const Shape shapes[] = {
        {"llama3-8b", "attn (4096x4096)", 4096, 4096},
        {"llama3-8b", "mlp up (14336x4096)", 4096, 14336},
        {"llama3-8b", "mlp down (4096x14336)", 14336, 4096},
        {"llama3-8b", "lm head (128256x4096)", 4096, 128256},
        {"llama-1.1b", "attn (2048x2048)", 2048, 2048},
        {"llama-1.1b", "mlp up (5632x2048)", 2048, 5632},
        {"llama-1.1b", "mlp down (2048x5632)", 5632, 2048},
        {"llama-1.1b", "lm head (32000x2048)", 2048, 32000},
    };
    const DType types[] = {DType::q4_0, DType::q8_0, DType::q4_1, DType::q4_k,
                           DType::q6_k, DType::f16,  DType::bf16};
    for (const Shape& s : shapes)
      for (DType t : types)
        for (int64_t M : {1, 8}) bench_shape(gpu, bw, s, t, M, x, y);

    const ModelShape models[] = {
        {"llama-1.1b", 2048, 256, 5632, 22, 32000},
        {"llama3-8b", 4096, 1024, 14336, 32, 128256},
    };
    for (const ModelShape& m : models)
      for (DType t : types) bench_model(gpu, bw, m, t, x, y);

    TS_CUDA_CHECK(cudaFree(x));
    TS_CUDA_CHECK(cudaFree(y));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quant_matvec_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
