// GPU benchmark of the attention kernels: causal FlashAttention forward/backward TFLOP/s (bf16,
// D=128), paged decode bandwidth, and prompt attention over the paged cache (tiles against the
// decode kernel); one JSON object per line.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"

namespace {

using namespace tessera;

// Dense bf16 tensor-core peak by device name (H100/H200 SXM: 989.4 TFLOP/s); 0 when unknown.
double bf16_peak(const std::string& name) {
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos)
    return 989.4e12;
  return 0;
}

std::string peak_fraction(double achieved, double peak) {
  if (peak <= 0) return "\"unknown\"";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", achieved / peak);
  return buf;
}

// Median of reps timed runs after warmup runs, in ms.
double median_ms(const std::function<void()>& fn, int warmup = 3, int reps = 10) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  TS_CUDA_CHECK(cudaEventCreate(&a));
  TS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(a));
    fn();
    TS_CUDA_CHECK(cudaEventRecord(b));
    TS_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  TS_CUDA_CHECK(cudaEventDestroy(a));
  TS_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

__global__ void fill_kernel(uint16_t* p, size_t n, uint32_t seed) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // A small hash to values in [-1, 1) as bf16 bit patterns (top half of an f32).
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  const float f = static_cast<float>(h & 0xffff) / 32768.f - 1.f;
  p[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
}

void fill(uint16_t* p, size_t n, uint32_t seed) {
  fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(p, n, seed);
  TS_CUDA_CHECK_LAUNCH();
}

void bench_flash(const std::string& gpu, int64_t B, int64_t H, int64_t T, int64_t D) {
  const size_t n = static_cast<size_t>(B * T * H * D);
  uint16_t *q, *k, *v, *o, *go, *dq, *dk, *dv;
  float* lse;
  void* ws;
  for (uint16_t** p : {&q, &k, &v, &o, &go, &dq, &dk, &dv}) TS_CUDA_CHECK(cudaMalloc(p, n * 2));
  TS_CUDA_CHECK(cudaMalloc(&lse, static_cast<size_t>(B * H * T) * 4));
  fill(q, n, 1);
  fill(k, n, 2);
  fill(v, n, 3);
  fill(go, n, 4);
  const cuda::AttnLayout l = cuda::contiguous_layout(T, H, D);
  cuda::FlashForwardArgs f;
  f.shape = {B, T, H, H, D, 1.0f / std::sqrt(static_cast<float>(D)), true, DType::bf16};
  f.q = {q, l};
  f.k = {k, l};
  f.v = {v, l};
  f.out = {o, l};
  f.lse = lse;
  TS_CUDA_CHECK(cudaMalloc(&ws, cuda::flash_attention_backward_workspace_bytes(f.shape)));
  cuda::FlashBackwardArgs bw;
  bw.shape = f.shape;
  bw.q = f.q;
  bw.k = f.k;
  bw.v = f.v;
  bw.out = {o, l};
  bw.dout = {go, l};
  bw.lse = lse;
  bw.dq = {dq, l};
  bw.dk = {dk, l};
  bw.dv = {dv, l};
  bw.workspace = ws;

  const double fwd_flops = 0.5 * 4.0 * B * H * double(T) * T * D;  // causal: half of dense
  const double peak = bf16_peak(gpu);
  const int reps = T >= 4096 ? 10 : 20;
  f.kernel = cuda::FlashKernel::mma_sync;
  const double fwd_ms = median_ms([&] { cuda::flash_attention_forward(f, nullptr); }, 3, reps);
  // The Hopper kernel, where it runs (-1: not measured).
  double wgmma_ms = -1;
  if (cuda::flash_wgmma_available()) {
    f.kernel = cuda::FlashKernel::wgmma;
    wgmma_ms = median_ms([&] { cuda::flash_attention_forward(f, nullptr); }, 3, reps);
  }
  bw.kernel = cuda::FlashKernel::mma_sync;
  const double bwd_ms = median_ms([&] { cuda::flash_attention_backward(bw, nullptr); }, 3, reps);
  double bwd_wgmma_ms = -1;
  if (cuda::flash_wgmma_available()) {
    bw.kernel = cuda::FlashKernel::wgmma;
    bwd_wgmma_ms = median_ms([&] { cuda::flash_attention_backward(bw, nullptr); }, 3, reps);
  }
  const char* names[4] = {"forward", "forward_wgmma", "backward", "backward_wgmma"};
  const double times[4] = {fwd_ms, wgmma_ms, bwd_ms, bwd_wgmma_ms};
  for (int pass = 0; pass < 4; ++pass) {
    const double ms = times[pass];
    if (ms < 0) continue;
    const double flops = pass < 2 ? fwd_flops : 2.5 * fwd_flops;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf(
        "{\"name\": \"flash_attention_%s\", \"shape\": \"B=%lld H=%lld T=%lld D=%lld causal "
        "bf16\", \"median_ms\": %.4f, \"tflops\": %.2f, \"peak_fraction\": %s, \"gpu\": "
        "\"%s\"}\n",
        names[pass], static_cast<long long>(B), static_cast<long long>(H),
        static_cast<long long>(T), static_cast<long long>(D), ms, tflops,
        peak_fraction(tflops * 1e12, peak).c_str(), gpu.c_str());
  }
  for (uint16_t* p : {q, k, v, o, go, dq, dk, dv}) TS_CUDA_CHECK(cudaFree(p));
  TS_CUDA_CHECK(cudaFree(lse));
  TS_CUDA_CHECK(cudaFree(ws));
}

// The paged-cache benches' heads (H=32, Hkv=8, D=128) over blocks of bt tokens, K then V in
// each block (kv: 16-bit elements), one block table of table_stride entries per row.
constexpr int64_t kPagedH = 32, kPagedHkv = 8, kPagedD = 128;
cuda::PagedDecodeArgs paged_args(const float* q, float* out, int64_t rows, const uint16_t* kv,
                                 DType kv_dtype, int64_t bt, const int32_t* tables,
                                 int64_t table_stride, const int32_t* n_keys, int64_t max_keys) {
  cuda::PagedDecodeArgs a;
  a.out = out;
  a.q = q;
  a.rows = rows;
  a.H = kPagedH;
  a.Hkv = kPagedHkv;
  a.D = kPagedD;
  a.kv = kv;
  a.kv_dtype = kv_dtype;
  a.block_tokens = bt;
  a.v_offset = kPagedHkv * bt * kPagedD;
  a.block_stride = 2 * a.v_offset;
  a.block_tables = tables;
  a.table_stride = table_stride;
  a.n_keys = n_keys;
  a.max_keys = max_keys;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kPagedD));
  return a;
}

// Decode over a bf16 paged cache, Llama-8B-like heads (H=32, Hkv=8, D=128), 16-token blocks
// laid out in a scattered order; bandwidth counts the K and V bytes read.
void bench_decode(const std::string& gpu, int64_t batch, int64_t context, double hbm_peak) {
  const int64_t H = kPagedH, Hkv = kPagedHkv, D = kPagedD, bt = 16;
  const int64_t blocks_per_seq = (context + bt - 1) / bt;
  const int64_t n_blocks = batch * blocks_per_seq;
  const int64_t half = Hkv * bt * D, block_stride = 2 * half;
  uint16_t* kv;
  float *q, *out, *ws;
  int32_t *tables, *nk;
  TS_CUDA_CHECK(cudaMalloc(&kv, static_cast<size_t>(n_blocks * block_stride) * 2));
  fill(kv, static_cast<size_t>(n_blocks * block_stride), 9);
  TS_CUDA_CHECK(cudaMalloc(&q, static_cast<size_t>(batch * H * D) * 4));
  TS_CUDA_CHECK(cudaMemset(q, 0, static_cast<size_t>(batch * H * D) * 4));
  TS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(batch * H * D) * 4));
  const int64_t ws_floats = cuda::paged_decode_workspace_floats(batch, H, D, 64);
  TS_CUDA_CHECK(cudaMalloc(&ws, static_cast<size_t>(ws_floats) * 4));
  std::vector<int32_t> h_tables(static_cast<size_t>(n_blocks));
  for (int64_t i = 0; i < n_blocks; ++i)  // a fixed stride permutation scatters the blocks
    h_tables[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % n_blocks);
  std::vector<int32_t> h_nk(static_cast<size_t>(batch), static_cast<int32_t>(context));
  TS_CUDA_CHECK(cudaMalloc(&tables, h_tables.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&nk, h_nk.size() * 4));
  TS_CUDA_CHECK(cudaMemcpy(tables, h_tables.data(), h_tables.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(nk, h_nk.data(), h_nk.size() * 4, cudaMemcpyHostToDevice));
  cuda::PagedDecodeArgs a =
      paged_args(q, out, batch, kv, DType::bf16, bt, tables, blocks_per_seq, nk, context);
  a.workspace = ws;
  a.workspace_floats = ws_floats;
  const double ms = median_ms([&] { cuda::paged_decode_attention(a, nullptr); }, 3, 20);
  const double bytes = 2.0 * batch * context * Hkv * D * 2;  // K and V, bf16
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf(
      "{\"name\": \"paged_decode_attention\", \"shape\": \"batch=%lld context=%lld H=32 Hkv=8 "
      "D=128 bf16 cache\", \"median_ms\": %.4f, \"gbps\": %.1f, \"peak_fraction\": %s, \"gpu\": "
      "\"%s\"}\n",
      static_cast<long long>(batch), static_cast<long long>(context), ms, gbs,
      peak_fraction(gbs * 1e9, hbm_peak).c_str(), gpu.c_str());
  TS_CUDA_CHECK(cudaFree(kv));
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
  TS_CUDA_CHECK(cudaFree(ws));
  TS_CUDA_CHECK(cudaFree(tables));
  TS_CUDA_CHECK(cudaFree(nk));
}

// Prompt attention over an f16 paged cache (H=32, Hkv=8, D=128, 32-token blocks, scattered):
// `rows` new tokens of one sequence after `prefix` cached ones, through the tensor-core tiles
// and through the decode kernel (one block per row and KV head, as prompts ran before the
// tiles). FLOP/s count the causal products (4 D H per query-key pair).
void bench_prompt(const std::string& gpu, int64_t rows, int64_t prefix, double bf16_peak_flops) {
  const int64_t H = kPagedH, Hkv = kPagedHkv, D = kPagedD, bt = 32;
  const int64_t context = prefix + rows;
  const int64_t blocks = (context + bt - 1) / bt;
  const int64_t half = Hkv * bt * D, block_stride = 2 * half;
  uint16_t* kv;
  float *q, *out;
  int32_t *tables, *nk, *decode_rows;
  cuda::PagedPrefillTile* tiles;
  TS_CUDA_CHECK(cudaMalloc(&kv, static_cast<size_t>(blocks * block_stride) * 2));
  fill(kv, static_cast<size_t>(blocks * block_stride), 5);  // bf16 patterns: finite f16 too
  TS_CUDA_CHECK(cudaMalloc(&q, static_cast<size_t>(rows * H * D) * 4));
  TS_CUDA_CHECK(cudaMemset(q, 0, static_cast<size_t>(rows * H * D) * 4));
  TS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(rows * H * D) * 4));
  std::vector<int32_t> h_tables(static_cast<size_t>(rows * blocks)),
      h_nk(static_cast<size_t>(rows));
  double pairs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b)
      h_tables[static_cast<size_t>(r * blocks + b)] = static_cast<int32_t>((b * 7919) % blocks);
    h_nk[static_cast<size_t>(r)] = static_cast<int32_t>(prefix + r + 1);
    pairs += static_cast<double>(prefix + r + 1);
  }
  const cuda::PagedPrefillPlan plan =
      cuda::plan_paged_prefill(rows, h_nk.data(), nullptr, h_tables.data(), blocks, 16);
  TS_CUDA_CHECK(cudaMalloc(&tables, h_tables.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&nk, h_nk.size() * 4));
  TS_CUDA_CHECK(cudaMalloc(&decode_rows, 4));
  TS_CUDA_CHECK(cudaMalloc(&tiles, plan.tiles.size() * sizeof(cuda::PagedPrefillTile)));
  TS_CUDA_CHECK(cudaMemcpy(tables, h_tables.data(), h_tables.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(nk, h_nk.data(), h_nk.size() * 4, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMemcpy(tiles, plan.tiles.data(),
                           plan.tiles.size() * sizeof(cuda::PagedPrefillTile),
                           cudaMemcpyHostToDevice));
  cuda::PagedDecodeArgs a =
      paged_args(q, out, rows, kv, DType::f16, bt, tables, blocks, nk, context);
  const double decode_ms = median_ms([&] { cuda::paged_decode_attention(a, nullptr); }, 1, 5);
  a.prefill_tiles = tiles;
  a.n_prefill_tiles = static_cast<int64_t>(plan.tiles.size());
  a.decode_rows = decode_rows;
  a.n_decode_rows = 0;
  const double tiles_ms = median_ms([&] { cuda::paged_decode_attention(a, nullptr); }, 3, 10);
  const double flops = 4.0 * static_cast<double>(D) * H * pairs;
  for (const auto& [kernel, ms] : {std::pair<const char*, double>{"tiles", tiles_ms},
                                   std::pair<const char*, double>{"decode", decode_ms}}) {
    const double fs = flops / (ms * 1e-3);
    std::printf(
        "{\"name\": \"paged_prompt_attention\", \"kernel\": \"%s\", \"shape\": \"rows=%lld "
        "prefix=%lld H=32 Hkv=8 D=128 f16 cache\", \"median_ms\": %.4f, \"tflops\": %.1f, "
        "\"peak_fraction\": %s, \"tiles_speedup\": %.2f, \"gpu\": \"%s\"}\n",
        kernel, static_cast<long long>(rows), static_cast<long long>(prefix), ms, fs / 1e12,
        peak_fraction(fs, bf16_peak_flops).c_str(), decode_ms / tiles_ms, gpu.c_str());
  }
  TS_CUDA_CHECK(cudaFree(kv));
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
  TS_CUDA_CHECK(cudaFree(tables));
  TS_CUDA_CHECK(cudaFree(nk));
  TS_CUDA_CHECK(cudaFree(decode_rows));
  TS_CUDA_CHECK(cudaFree(tiles));
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("attention_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::string gpu = prop.name;
    // HBM peak from the memory clock (kHz) and bus width, double data rate.
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    const double hbm_peak = 2.0 * clock_khz * 1e3 * bus_bits / 8;
    bench_flash(gpu, 4, 32, 1024, 128);
    bench_flash(gpu, 4, 32, 4096, 128);
    for (int64_t batch : {1, 32})
      for (int64_t context : {4096, 32768}) bench_decode(gpu, batch, context, hbm_peak);
    // A whole 4k prompt in one call, and the last 512-row chunk of one (the engine's chunks).
    bench_prompt(gpu, 4096, 0, bf16_peak(gpu));
    bench_prompt(gpu, 512, 3584, bf16_peak(gpu));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
