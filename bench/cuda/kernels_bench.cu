// Bandwidth of the training kernels (backend/cuda/kernels.h) at GPT-2-small training shapes
// (N = 16*1024 rows, C = 768, V = 50257 padded to 50304), each against a device-to-device copy
// of the same byte count measured in the same run. One JSON object per line.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace {

using bf16 = __nv_bfloat16;
using tessera::ops::AdamWArgs;
namespace k = tessera::cuda;

constexpr int kWarmup = 2, kReps = 10;

double median_ms(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<float> ms(kReps);
  for (int i = 0; i < kReps; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(a));
    fn();
    TS_CUDA_CHECK(cudaEventRecord(b));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[kReps / 2 - 1] + ms[kReps / 2]);
}

// Device memory that lives for the whole run, filled with small finite values.
template <typename T>
T* alloc(size_t n, float value = 0.01f) {
  T* p = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  std::vector<T> h(std::min<size_t>(n, 1 << 20));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<T>(value * static_cast<float>(i % 97));
  for (size_t at = 0; at < n; at += h.size()) {
    const size_t m = std::min(h.size(), n - at);
    TS_CUDA_CHECK(cudaMemcpy(p + at, h.data(), m * sizeof(T), cudaMemcpyHostToDevice));
  }
  return p;
}

struct Copy {
  char* src = nullptr;
  char* dst = nullptr;
  size_t cap = 0;
};

std::string gpu_name;
Copy copy_buf;

// bytes: what the kernel must move at least (reads + writes); the copy moves the same total
// (bytes / 2 read, bytes / 2 written).
void report(const char* name, const char* shape, const char* dtype, double bytes,
            const std::function<void()>& fn) {
  const double ms = median_ms(fn);
  const size_t half = std::min(copy_buf.cap, static_cast<size_t>(bytes / 2));
  const double copy_ms = median_ms([&] {
    TS_CUDA_CHECK(cudaMemcpyAsync(copy_buf.dst, copy_buf.src, half, cudaMemcpyDeviceToDevice));
  });
  const double gbps = bytes / (ms * 1e6), copy_gbps = 2.0 * half / (copy_ms * 1e6);
  std::printf(
      "{\"name\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", \"median_ms\": %.4f, "
      "\"gbps\": %.1f, \"copy_gbps\": %.1f, \"fraction_of_copy\": %.3f, \"gpu\": \"%s\"}\n",
      name, shape, dtype, ms, gbps, copy_gbps, gbps / copy_gbps, gpu_name.c_str());
  std::fflush(stdout);
}

template <typename E>
void bench_type(const char* dt) {
  constexpr int64_t B = 16, T = 1024, N = B * T, C = 768, V = 50257, Vp = 50304, F = 4 * C;
  constexpr int64_t H = 12, D = 64;
  const double s = sizeof(E), nc = static_cast<double>(N) * C;
  E* x = alloc<E>(N * C);
  E* y = alloc<E>(N * C);
  E* r = alloc<E>(N * C);
  E* big = alloc<E>(N * F);
  E* big2 = alloc<E>(N * F);
  E* big3 = alloc<E>(N * F);
  float* w = alloc<float>(C, 0.001f);
  float* b = alloc<float>(C);
  float* dw = alloc<float>(C);
  float* db = alloc<float>(C);
  float* mean = alloc<float>(N);
  float* rstd = alloc<float>(N, 0.001f);
  float* ws = alloc<float>(static_cast<size_t>(k::norm_backward_workspace_floats(N, C)));
  const char* nc_shape = "N=16384 C=768";

  report("layernorm_forward", nc_shape, dt, 2 * nc * s,
         [&] { k::layernorm_forward<E>(y, mean, rstd, x, w, b, N, C, nullptr); });
  report("layernorm_residual_forward", nc_shape, dt, 4 * nc * s,
         [&] { k::layernorm_residual_forward<E>(r, y, mean, rstd, r, x, w, b, N, C, nullptr); });
  report("layernorm_backward", nc_shape, dt, 4 * nc * s,
         [&] { k::layernorm_backward<E>(y, dw, db, x, r, w, mean, rstd, N, C, ws, nullptr); });
  report("rmsnorm_forward", nc_shape, dt, 2 * nc * s,
         [&] { k::rmsnorm_forward<E>(y, rstd, x, w, N, C, 1e-5f, nullptr); });
  report("rmsnorm_residual_forward", nc_shape, dt, 4 * nc * s,
         [&] { k::rmsnorm_residual_forward<E>(r, y, rstd, r, x, w, N, C, 1e-5f, nullptr); });
  report("rmsnorm_backward", nc_shape, dt, 4 * nc * s,
         [&] { k::rmsnorm_backward<E>(y, dw, x, r, w, rstd, N, C, ws, nullptr); });

  const double nf = static_cast<double>(N) * F;
  report("gelu_forward", "n=16384*3072", dt, 2 * nf * s,
         [&] { k::gelu_forward<E>(big2, big, N * F, nullptr); });
  report("gelu_backward", "n=16384*3072", dt, 3 * nf * s,
         [&] { k::gelu_backward<E>(big2, big, big2, N * F, nullptr); });
  report("swiglu_forward", "N=16384 F=3072", dt, 3 * nf * s,
         [&] { k::swiglu_forward<E>(big3, big, big2, N, F, nullptr); });
  report("swiglu_backward", "N=16384 F=3072", dt, 5 * nf * s,
         [&] { k::swiglu_backward<E>(big2, big3, big2, big, big3, N, F, nullptr); });
  report("scale", "n=16384*3072", dt, 2 * nf * s, [&] { k::scale<E>(big, N * F, 1.0f, nullptr); });

  float* cos_tab = alloc<float>(T * D / 2);
  float* sin_tab = alloc<float>(T * D / 2);
  k::RopeTableView view;
  view.cos = cos_tab;
  view.sin = sin_tab;
  view.max_pos = T;
  view.rotary_dim = D;
  report("rope_forward_half", "B=16 T=1024 H=12 D=64", dt, 2 * nc * s, [&] {
    k::rope_forward<E>(y, x, view, nullptr, 0, B, T, H, D, k::RopeLayout::half, nullptr);
  });
  report("rope_forward_interleaved", "B=16 T=1024 H=12 D=64", dt, 2 * nc * s, [&] {
    k::rope_forward<E>(y, x, view, nullptr, 0, B, T, H, D, k::RopeLayout::interleaved, nullptr);
  });

  int32_t* tokens = nullptr;
  {
    std::vector<int32_t> h(N);
    for (int64_t i = 0; i < N; ++i) h[i] = static_cast<int32_t>((i * 7919) % V);
    TS_CUDA_CHECK(cudaMalloc(&tokens, N * sizeof(int32_t)));
    TS_CUDA_CHECK(cudaMemcpy(tokens, h.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  E* wte = alloc<E>(V * C);
  E* wpe = alloc<E>(T * C);
  float* dwte = alloc<float>(V * C);
  float* dwpe = alloc<float>(T * C);
  report("embedding_forward", "B=16 T=1024 C=768", dt, 3 * nc * s,
         [&] { k::embedding_forward<E>(y, tokens, wte, wpe, B, T, C, V, nullptr); });
  // dout read, dwte rows read and written once per occurrence (distinct tokens here).
  report("embedding_backward", "B=16 T=1024 C=768 V=50257", dt, nc * s + 2 * nc * 4,
         [&] { k::embedding_backward<E>(dwte, dwpe, x, tokens, B, T, C, V, nullptr); });

  E* logits = alloc<E>(N * Vp, 0.0f);
  float* losses = alloc<float>(N);
  // The kernel reads the row twice and writes it once.
  report("softmax_xent", "N=16384 V=50257 Vp=50304", dt, 3.0 * N * Vp * s,
         [&] { k::softmax_xent<E>(losses, logits, tokens, N, V, Vp, 1.0f / N, nullptr); });

  for (void* p :
       {(void*)x,    (void*)y,       (void*)r,       (void*)big,    (void*)big2, (void*)big3,
        (void*)w,    (void*)b,       (void*)dw,      (void*)db,     (void*)mean, (void*)rstd,
        (void*)ws,   (void*)cos_tab, (void*)sin_tab, (void*)tokens, (void*)wte,  (void*)wpe,
        (void*)dwte, (void*)dwpe,    (void*)logits,  (void*)losses})
    TS_CUDA_CHECK(cudaFree(p));
}

void bench_optimizer() {
  constexpr int64_t n = 124475904;  // GPT-2 small with padded vocabulary
  float* p = alloc<float>(n);
  float* g = alloc<float>(n);
  bf16* g16 = alloc<bf16>(n);
  float* m = alloc<float>(n);
  float* v = alloc<float>(n);
  bf16* p16 = alloc<bf16>(n);
  AdamWArgs a;
  a.lr = 1e-4f;
  a.weight_decay = 0.1f;
  const double dn = static_cast<double>(n);
  report("adamw", "n=124475904 grads f32 + bf16 copy", "f32", dn * (8 + 4 + 8 + 8 + 2),
         [&] { k::adamw<float>(p, p16, g, m, v, n, a, nullptr); });
  report("adamw", "n=124475904 grads bf16 + bf16 copy", "bf16", dn * (8 + 2 + 8 + 8 + 2),
         [&] { k::adamw<bf16>(p, p16, g16, m, v, n, a, nullptr); });
  const int64_t sizes[1] = {n};
  const float* ptrs[1] = {g};
  double* ws = alloc<double>(static_cast<size_t>(k::global_sum_squares_workspace(sizes, 1)));
  double* out = alloc<double>(1);
  report("global_sum_squares", "n=124475904", "f32", dn * 4,
         [&] { k::global_sum_squares<float>(out, ptrs, sizes, 1, ws, nullptr); });
  report("convert_f32_to_bf16", "n=124475904", "f32->bf16", dn * 6,
         [&] { k::convert_f32_to_bf16(p16, p, n, nullptr); });
  report("convert_bf16_to_f32", "n=124475904", "bf16->f32", dn * 6,
         [&] { k::convert_bf16_to_f32(g, g16, n, nullptr); });
  for (void* q :
       {(void*)p, (void*)g, (void*)g16, (void*)m, (void*)v, (void*)p16, (void*)ws, (void*)out})
    TS_CUDA_CHECK(cudaFree(q));
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("kernels_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    gpu_name = prop.name;
    copy_buf.cap = size_t{2} << 30;  // larger copies are timed at 2 GiB: bandwidth is flat there
    TS_CUDA_CHECK(cudaMalloc(&copy_buf.src, copy_buf.cap));
    TS_CUDA_CHECK(cudaMalloc(&copy_buf.dst, copy_buf.cap));
    TS_CUDA_CHECK(cudaMemset(copy_buf.src, 0, copy_buf.cap));
    bench_type<float>("f32");
    bench_type<bf16>("bf16");
    bench_optimizer();
    TS_CUDA_CHECK(cudaFree(copy_buf.src));
    TS_CUDA_CHECK(cudaFree(copy_buf.dst));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernels_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
