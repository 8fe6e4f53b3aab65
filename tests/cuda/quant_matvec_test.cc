// CUDA quantized matvec (matmul_wt, M <= 8) against the CPU: dequantize-then-double and the
// reference kernel that quantizes x the same way; the norm and the SwiGLU that quantize their
// output against each followed by matmul_wt; host-side checks of the block decoders and of the
// kernel's chunk/slot/unit index math (those run without a GPU).
#include "backend/cuda/quant_matvec.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_act.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_blocks.cuh"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera {
namespace {

namespace qb = cuda::qblocks;

// Random weights of type t: quantized from f32 with per-row scales over two decades, so block
// scales, mins and k-quant sub-scales all vary.
std::vector<uint8_t> random_weights(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const float row_scale = std::pow(10.0f, u(rng));
    for (int64_t k = 0; k < K; ++k) {
      // A positive bias on some rows gives q4_1 / q4_K non-trivial mins.
      f[n * K + k] = row_scale * (u(rng) + (n % 3 == 0 ? 0.5f : 0.0f));
    }
  }
  std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(t, N * K)));
  from_f32(t, f.data(), w.data(), N * K);
  return w;
}

std::vector<float> random_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = g(rng);
  // One outlier per row: activation blocks with a large max, as real activations have.
  for (int64_t m = 0; m < M; ++m) x[m * K + (7 * m + 3) % K] = 20.0f;
  return x;
}

// ---- Host: block decoders against core/dtype.h's to_f32 ----

// Per-element offset of a block's value (the part applied through the activation sums).
template <class T>
float element_offset(const uint8_t* blk, int e) {
  if constexpr (T::kType == DType::q4_0 || T::kType == DType::q5_0 || T::kType == DType::q5_1) {
    return T::offset(blk);
  } else if constexpr (T::kType == DType::q4_1) {
    return T::min(blk);
  } else if constexpr (T::kType == DType::q4_k || T::kType == DType::q5_k) {
    int sc, m;
    T::scale_min(blk, e / 32, &sc, &m);
    return -T::dmin(blk) * static_cast<float>(m);
  } else {
    (void)blk, (void)e;
    return 0.0f;
  }
}

template <class T>
void check_units_rebuild_blocks(uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(T::kType)));
  const int64_t nblocks = 64;
  const int64_t K = nblocks * T::kBlockElems;
  const auto w = random_weights(T::kType, 1, K, seed);
  std::vector<float> ref(static_cast<size_t>(K));
  to_f32(T::kType, w.data(), ref.data(), K);
  // An odd offset: the host decoders must not assume alignment either.
  std::vector<uint8_t> shifted(w.size() + 1);
  std::memcpy(shifted.data() + 1, w.data(), w.size());
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = shifted.data() + 1 + b * T::kBlockBytes;
    std::vector<int> seen(T::kBlockElems, 0);
    for (int u = 0; u < T::kUnitsPerBlock; ++u) {
      uint32_t q[8];
      int sc[8];
      T::unit(blk, u, q, sc);
      for (int wd = 0; wd < T::kWords; ++wd) {
        // Vector loads of x need words w..w+kXVec-1 on contiguous elements.
        if (wd % T::kXVec != 0) {
          ASSERT_EQ(T::x_first(u, wd), T::x_first(u, wd - 1) + 4) << "unit " << u << " word " << wd;
        }
        for (int i = 0; i < 4; ++i) {
          const int e = T::x_first(u, wd) + i;
          ASSERT_GE(e, 0);
          ASSERT_LT(e, T::kBlockElems);
          ++seen[e];
          const float d = T::scale(blk);
          const float v =
              d * static_cast<float>(sc[wd]) * static_cast<float>(qb::byte_s8(q[wd], i)) +
              element_offset<T>(blk, e);
          const float r = ref[b * T::kBlockElems + e];
          // Same products, possibly another rounding order: a few ulps of the larger term.
          const float tol = 4 * FLT_EPSILON * (std::fabs(r) + std::fabs(element_offset<T>(blk, e)));
          ASSERT_NEAR(v, r, tol) << "block " << b << " unit " << u << " word " << wd << " byte "
                                 << i << " element " << e;
        }
      }
    }
    for (int e = 0; e < T::kBlockElems; ++e) ASSERT_EQ(seen[e], 1) << "element " << e;
  }
}

TEST(CudaQuantBlocks, UnitsRebuildEveryBlockType) {
  check_units_rebuild_blocks<qb::Q8_0>(1);
  check_units_rebuild_blocks<qb::Q4_0>(2);
  check_units_rebuild_blocks<qb::Q4_1>(3);
  check_units_rebuild_blocks<qb::Q4K>(4);
  check_units_rebuild_blocks<qb::Q6K>(5);
  check_units_rebuild_blocks<qb::Q5_0>(6);
  check_units_rebuild_blocks<qb::Q5_1>(7);
  check_units_rebuild_blocks<qb::Q5K>(8);
}

TEST(CudaQuantBlocks, HostByteHelpers) {
  EXPECT_EQ(qb::sub_bytes(0x00203f10u, 0x20202020u), 0xe0001ff0u);
  EXPECT_EQ(qb::dot4(0xff02ff01u, 0x7f7f0302u, 10), 10 + 1 * 2 + (-1) * 3 + 2 * 127 + (-1) * 127);
}

// ---- Host: the kernel's index math, emulated lane by lane ----

// Quantized activations as the device holds them (int8, scales, sums of 32), from the CPU's own
// quantizer, so the integers are the ones the GPU kernel computes.
struct HostActs {
  int64_t M = 0, K = 0, block = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
};
HostActs quantize_host(const std::vector<float>& x, int64_t M, int64_t K, int64_t block) {
  std::vector<int16_t> q16(static_cast<size_t>(M * K));
  HostActs a;
  a.M = M, a.K = K, a.block = block;
  a.d.resize(static_cast<size_t>(M * (K / block)));
  a.s.resize(static_cast<size_t>(M * (K / 32)));
  cpu::QuantizedActs qa;
  qa.M = M, qa.K = K, qa.block = block, qa.q = q16.data(), qa.d = a.d.data(), qa.sum32 = a.s.data();
  cpu::quantize_act_rows(x.data(), qa, 0, M);
  a.q.assign(q16.begin(), q16.end());
  return a;
}

// One warp's view of block_matvec_kernel for one row and activation row m: the same chunk
// spans, 16-byte slots, phase, unit-to-lane assignment, decoders and offset terms.
template <class T>
float emulate_row(const uint8_t* w, int64_t row_bytes, int64_t n, const HostActs& a, int64_t m) {
  using G = qb::Chunk<T>;
  const int64_t K = a.K, nblk = K / T::kBlockElems;
  const int64_t nchunks = (nblk + G::kBlocks - 1) / G::kBlocks;
  float acc[32] = {};
  std::vector<uint8_t> stage(G::kRowBuf);
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t blocks = std::min<int64_t>(G::kBlocks, nblk - c * G::kBlocks);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(w) + n * row_bytes + c * G::kBytes;
    const uintptr_t hi = lo + blocks * T::kBlockBytes;
    const int phase = static_cast<int>(lo & 15u);
    const uintptr_t base = lo & ~uintptr_t{15};
    std::fill(stage.begin(), stage.end(), uint8_t{0});
    int covered = 0;
    for (int lane = 0; lane < 32; ++lane)
      for (int s = 0; s < G::kSlotsPerLane; ++s) {
        const int slot = lane + 32 * s;
        const uintptr_t addr = base + 16 * static_cast<uintptr_t>(slot);
        for (int j = 0; j < 16; ++j)
          if (addr + j >= lo && addr + j < hi) {
            EXPECT_LE(16 * slot + j + 4, G::kRowBuf) << "staging overflow";
            stage[16 * slot + j] = *reinterpret_cast<const uint8_t*>(addr + j);
            ++covered;
          }
      }
    EXPECT_EQ(covered, blocks * T::kBlockBytes) << "every chunk byte staged once";
    EXPECT_LE(phase + G::kBytes + 4, G::kRowBuf);
    for (int i = 0; i < G::kUnitsPerLane; ++i)
      for (int lane = 0; lane < 32; ++lane) {
        const int v = lane + 32 * i, bl = v / T::kUnitsPerBlock, u = v % T::kUnitsPerBlock;
        const int64_t b = c * G::kBlocks + bl;
        if (b >= nblk) continue;
        const uint8_t* blk = stage.data() + phase + bl * T::kBlockBytes;
        uint32_t q[8];
        int sc[8];
        T::unit(blk, u, q, sc);
        const float d = T::scale(blk);
        const int8_t* xb = a.q.data() + m * K + b * T::kBlockElems;
        const float dx = a.d[m * nblk + b];
        const int32_t* sums = a.s.data() + m * (K / 32) + b * (T::kBlockElems / 32);
        int isum = 0;
        for (int k = 0; k < T::kWords; ++k) {
          uint32_t xw;
          std::memcpy(&xw, xb + T::x_first(u, k), 4);
          isum += sc[k] * qb::dot4(q[k], xw, 0);
        }
        float f = 0.0f;
        T::offset_terms(blk, u, sums, &isum, &f);  // the kernel's own offset code
        acc[lane] += d * dx * static_cast<float>(isum);
        acc[lane] += f * dx;
      }
  }
  for (int o = 16; o > 0; o /= 2) {  // the butterfly of __shfl_xor_sync
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = acc[l] + acc[l ^ o];
    std::memcpy(acc, next, sizeof(acc));
  }
  return acc[0];
}

// Bound on the f32 rounding of a sum of `terms` products, relative to sum |w| |x_hat|:
// each of the GPU's and the CPU's accumulations is within (terms) * 2^-24 of that sum (the
// standard gamma_n bound; products add two roundings each).
double float_sum_tol(int64_t terms, double abs_sum) {
  return 2.0 * static_cast<double>(terms + 8) * std::ldexp(1.0, -24) * abs_sum;
}

// sum_k (|d sc q| + |offset|) * amax of x's block: bounds every f32 term of both sums.
double abs_term_sum(DType t, const uint8_t* w_row, const HostActs& a, int64_t m);

template <class T>
double abs_term_sum_t(const uint8_t* w_row, const HostActs& a, int64_t m) {
  const int64_t nblk = a.K / T::kBlockElems;
  double s = 0;
  for (int64_t b = 0; b < nblk; ++b) {
    const uint8_t* blk = w_row + b * T::kBlockBytes;
    const double amax = std::fabs(static_cast<double>(a.d[m * nblk + b])) * 127.0;
    for (int u = 0; u < T::kUnitsPerBlock; ++u) {
      uint32_t q[8];
      int sc[8];
      T::unit(blk, u, q, sc);
      for (int k = 0; k < T::kWords; ++k)
        for (int i = 0; i < 4; ++i) {
          const int e = T::x_first(u, k) + i;
          const double wq =
              std::fabs(static_cast<double>(T::scale(blk)) * sc[k] * qb::byte_s8(q[k], i));
          s += (wq + std::fabs(static_cast<double>(element_offset<T>(blk, e)))) * amax;
        }
    }
  }
  return s;
}

double abs_term_sum(DType t, const uint8_t* w_row, const HostActs& a, int64_t m) {
  switch (t) {
    case DType::q8_0:
      return abs_term_sum_t<qb::Q8_0>(w_row, a, m);
    case DType::q4_0:
      return abs_term_sum_t<qb::Q4_0>(w_row, a, m);
    case DType::q4_1:
      return abs_term_sum_t<qb::Q4_1>(w_row, a, m);
    case DType::q4_k:
      return abs_term_sum_t<qb::Q4K>(w_row, a, m);
    case DType::q5_0:
      return abs_term_sum_t<qb::Q5_0>(w_row, a, m);
    case DType::q5_1:
      return abs_term_sum_t<qb::Q5_1>(w_row, a, m);
    case DType::q5_k:
      return abs_term_sum_t<qb::Q5K>(w_row, a, m);
    default:
      return abs_term_sum_t<qb::Q6K>(w_row, a, m);
  }
}

template <class T>
void check_emulation(int64_t M, int64_t K, int64_t N, int misalign, uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(T::kType)) + " M=" + std::to_string(M) +
               " K=" + std::to_string(K) + " N=" + std::to_string(N) +
               " misalign=" + std::to_string(misalign));
  const auto w0 = random_weights(T::kType, N, K, seed);
  std::vector<uint8_t> wbuf(w0.size() + 16);
  std::memcpy(wbuf.data() + misalign, w0.data(), w0.size());
  const uint8_t* w = wbuf.data() + misalign;
  const auto x = random_x(M, K, seed + 1);
  const HostActs a = quantize_host(x, M, K, T::kActBlock);
  std::vector<float> yref(static_cast<size_t>(M * N));
  cpu::ref::matmul_wt(yref.data(), N, x.data(), M, K, w, T::kType, N, nullptr);
  const int64_t row_bytes = dtype_bytes(T::kType, K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float got = emulate_row<T>(w, row_bytes, n, a, m);
      const double tol = float_sum_tol(K / 4, abs_term_sum(T::kType, w + n * row_bytes, a, m));
      ASSERT_NEAR(got, yref[m * N + n], tol) << "m " << m << " n " << n;
    }
}

TEST(CudaQuantMatvecHost, KernelIndexMathMatchesReference) {
  // K spans one partial chunk (256), several chunks with a partial last one (5632 = 176 q*_0
  // blocks = 3 chunks of 56 + 8, 22 k-quant blocks), and odd misalignment of the weights.
  for (int64_t K : {256, 5632})
    for (int misalign : {0, 6, 13}) {
      check_emulation<qb::Q8_0>(2, K, 3, misalign, 10);
      check_emulation<qb::Q4_0>(2, K, 3, misalign, 11);
      check_emulation<qb::Q4_1>(2, K, 3, misalign, 12);
      check_emulation<qb::Q4K>(2, K, 3, misalign, 13);
      check_emulation<qb::Q6K>(2, K, 3, misalign, 14);
      check_emulation<qb::Q5_0>(2, K, 3, misalign, 15);
      check_emulation<qb::Q5_1>(2, K, 3, misalign, 16);
      check_emulation<qb::Q5K>(2, K, 3, misalign, 17);
    }
}

TEST(CudaQuantMatvecHost, RejectsBadArguments) {
  // Every check runs before any CUDA call, so these run without a GPU.
  float* p = nullptr;
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([&] {
              cuda::matmul_wt(p, 8, p, 9, 256, p, DType::q4_0, 8, nullptr, nullptr);
            }).find("M=9"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              cuda::matmul_wt(p, 8, p, 1, 100, p, DType::q4_0, 8, nullptr, nullptr);
            }).find("K=100"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              cuda::matmul_wt(p, 8, p, 1, 512, p, DType::q4_k, 8, nullptr, nullptr);
            }).find("null"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              cuda::matmul_wt(p, 4, p, 1, 256, p, DType::q8_0, 8, nullptr, nullptr);
            }).find("ldy=4"),
            std::string::npos);
  // Pre-quantized activations: a float weight type has none, a workspace must hold them all,
  // and a norm must quantize the rows it normalizes (all host-side checks).
  static uint8_t ws_host[4096];
  EXPECT_NE(msg([&] {
              cuda::quantized_acts_view(ws_host, sizeof ws_host, 1, 256, DType::f16);
            }).find("nothing to quantize"),
            std::string::npos);
  EXPECT_NE(
      msg([&] { cuda::quantized_acts_view(ws_host, 100, 1, 256, DType::q8_0); }).find("smaller"),
      std::string::npos);
  cuda::QuantizedActs qa;
  qa.M = 2, qa.K = 256, qa.block = 32;
  qa.q = reinterpret_cast<int8_t*>(ws_host), qa.d = p, qa.s = reinterpret_cast<int32_t*>(ws_host);
  EXPECT_NE(msg([&] {
              cuda::norm_quantize_f32(false, nullptr, p, nullptr, nullptr, p, nullptr, p, nullptr,
                                      1, 256, 1e-6f, qa, nullptr);
            }).find("not the (1, 256)"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              cuda::matmul_wt_quantized(p, 8, qa, p, DType::q4_k, 8, nullptr, nullptr);
            }).find("blocks of 32"),
            std::string::npos);
  float f_host[4] = {};  // never read: the checks come first
  EXPECT_NE(msg([&] {
              cuda::swiglu_quantize_f32(f_host, f_host, f_host, 1, 256, qa, nullptr);
            }).find("not the (1, 256)"),
            std::string::npos);
  // Block types without a kernel here are refused by name before anything touches the device.
  for (DType t : {DType::q2_k, DType::q3_k, DType::q4_0x8, DType::q4_kx8})
    EXPECT_NE(msg([&] {
                cuda::matmul_wt(p, 8, p, 1, 256, p, t, 8, nullptr, nullptr);
              }).find(std::string(dtype_name(t)) + " is not supported"),
              std::string::npos)
        << dtype_name(t);
  EXPECT_NE(msg([&] {
              cuda::matmul_wt(p, 8, p, 1, 256, p, DType::f32, 8, nullptr, nullptr);
            }).find("f32"),
            std::string::npos);
}

// ---- GPU: the kernels against the CPU ----

// Exact y in double from the dequantized weights (to_f32, exact in double) and x as given.
std::vector<double> exact_y(const std::vector<float>& wf, const std::vector<float>& x, int64_t M,
                            int64_t K, int64_t N, const std::vector<float>* bias) {
  std::vector<double> y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(wf[n * K + k]) * x[m * K + k];
      y[m * N + n] = s + (bias ? (*bias)[n] : 0.0);
    }
  return y;
}

void check_on_device(DType t, int64_t M, int64_t K, int64_t N, bool with_bias, int misalign,
                     uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
               " N=" + std::to_string(N) + " bias=" + std::to_string(with_bias) +
               " misalign=" + std::to_string(misalign));
  const int64_t ldy = N + 3;  // the 3 padding columns must stay untouched
  std::vector<uint8_t> w;
  if (t == DType::f16 || t == DType::bf16) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> f(static_cast<size_t>(N * K));
    for (auto& v : f) v = u(rng);
    w.resize(static_cast<size_t>(dtype_bytes(t, N * K)));
    from_f32(t, f.data(), w.data(), N * K);
  } else {
    w = random_weights(t, N, K, seed);
  }
  std::vector<float> wf(static_cast<size_t>(N * K));
  to_f32(t, w.data(), wf.data(), N * K);
  const auto x = random_x(M, K, seed + 7);
  std::vector<float> bias(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) bias[n] = 0.25f * static_cast<float>(n % 7) - 0.5f;

  std::vector<uint8_t> wpad(w.size() + 16, 0);
  std::memcpy(wpad.data() + misalign, w.data(), w.size());
  cuda::test::DeviceArray<uint8_t> dw(wpad);
  cuda::test::DeviceArray<float> dx(x), db(bias);
  const float kSentinel = -12345.0f;
  cuda::test::DeviceArray<float> dy(std::vector<float>(static_cast<size_t>(M * ldy), kSentinel));
  cuda::matmul_wt(dy.get(), ldy, dx.get(), M, K, dw.get() + misalign, t, N,
                  with_bias ? db.get() : nullptr, nullptr);
  const auto y = dy.download();

  // bf16 weights take x rounded to bf16 (ops::matmul_wt's rule): the exact sum is over those x.
  std::vector<float> xr = x;
  if (t == DType::bf16)
    for (float& v : xr) v = bf16_to_f32(f32_to_bf16(v));
  const auto ye = exact_y(wf, xr, M, K, N, with_bias ? &bias : nullptr);
  const bool quantized_x = traits(t).block_elems > 1;
  std::vector<float> yref(static_cast<size_t>(M * N));
  if (quantized_x)
    cpu::ref::matmul_wt(yref.data(), N, x.data(), M, K, w.data(), t, N,
                        with_bias ? bias.data() : nullptr);
  const HostActs a = quantized_x ? quantize_host(x, M, K, act_block_elems(t)) : HostActs{};
  const int64_t row_bytes = dtype_bytes(t, K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float got = y[m * ldy + n];
      const double b = with_bias ? std::fabs(bias[n]) : 0.0;
      if (!quantized_x) {
        // f32 FMAs: each lane sums K/32 products, then 5 butterfly levels and the bias.
        double abs_sum = b;
        for (int64_t k = 0; k < K; ++k) abs_sum += std::fabs(double(wf[n * K + k]) * xr[m * K + k]);
        ASSERT_NEAR(got, ye[m * N + n], float_sum_tol(K / 32 + 8, abs_sum))
            << "m " << m << " n " << n;
        continue;
      }
      // Against the reference (same integers): only the f32 order of the block terms differs.
      const double abs_terms = abs_term_sum(t, w.data() + n * row_bytes, a, m) + b;
      ASSERT_NEAR(got, yref[m * N + n], float_sum_tol(K / 4, abs_terms)) << "m " << m << " n " << n;
      // Against exact math: plus x's rounding to 8 bits, at most half a step d_x / 2 per element.
      double quant_err = 0;
      const int64_t blk = a.block;
      for (int64_t k = 0; k < K; ++k)
        quant_err += std::fabs(double(wf[n * K + k])) * 0.5 * a.d[m * (K / blk) + k / blk];
      ASSERT_NEAR(got, ye[m * N + n], quant_err + float_sum_tol(K / 4, abs_terms))
          << "m " << m << " n " << n;
    }
    for (int64_t n = N; n < ldy; ++n) ASSERT_EQ(y[m * ldy + n], kSentinel) << "padding column";
  }
}

TEST(CudaQuantMatvec, MatchesCpuEveryTypeAndShape) {
  TS_REQUIRE_CUDA_DEVICE();
  const DType types[] = {DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1,
                         DType::q5_0, DType::q5_1, DType::q4_k, DType::q5_k, DType::q6_k};
  uint32_t seed = 100;
  int i = 0;
  for (DType t : types)
    for (int64_t M : {1, 2, 3, 8})
      for (int64_t K : {256, 2048, 5632})
        for (int64_t N : {1, 33, 257}) {
          const bool bias = (i++ % 2) == 0;
          check_on_device(t, M, K, N, bias, 0, seed++);
          if (HasFatalFailure()) return;
        }
}

TEST(CudaQuantMatvec, MisalignedWeightsAndEveryM) {
  TS_REQUIRE_CUDA_DEVICE();
  // Weights at 2 and 6 bytes past an aligned address: every chunk starts mid-line, so the
  // masked edge slots and the funnel-shifted shared-memory reads are exercised; M 4..7 cover
  // the remaining template instances.
  const DType types[] = {DType::f16,  DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1,
                         DType::q5_0, DType::q5_1, DType::q4_k, DType::q5_k, DType::q6_k};
  uint32_t seed = 900;
  for (DType t : types)
    for (int64_t M : {4, 5, 6, 7}) {
      check_on_device(t, M, 2048, 37, M % 2 == 0, M < 6 ? 2 : 6, seed++);
      if (HasFatalFailure()) return;
    }
  // Many thread blocks, and the float types' scalar path (K % 8 != 0).
  check_on_device(DType::q4_0, 1, 4096, 4099, true, 0, 1234);
  check_on_device(DType::f16, 3, 1001, 65, true, 0, 1235);
  check_on_device(DType::bf16, 2, 999, 65, false, 2, 1236);
}

TEST(CudaQuantMatvec, ExplicitWorkspaceOnOwnStreamMatchesScratch) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t M = 3, K = 2048, N = 77;
  const auto w = random_weights(DType::q4_k, N, K, 55);
  const auto x = random_x(M, K, 56);
  cuda::test::DeviceArray<uint8_t> dw(w);
  cuda::test::DeviceArray<float> dx(x), y1(static_cast<size_t>(M * N)),
      y2(static_cast<size_t>(M * N));
  const size_t bytes = cuda::matmul_wt_workspace_bytes(M, K, DType::q4_k);
  ASSERT_GT(bytes, 0u);
  cuda::test::DeviceArray<uint8_t> ws(bytes);
  cudaStream_t s;
  TS_CUDA_CHECK(cudaStreamCreate(&s));
  cuda::matmul_wt(y1.get(), N, dx.get(), M, K, dw.get(), DType::q4_k, N, nullptr, ws.get(), bytes,
                  s);
  cuda::matmul_wt(y2.get(), N, dx.get(), M, K, dw.get(), DType::q4_k, N, nullptr, s);
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  TS_CUDA_CHECK(cudaStreamDestroy(s));
  EXPECT_EQ(y1.download(), y2.download());  // same kernels, same order: bit-identical
  EXPECT_THROW(cuda::matmul_wt(y1.get(), N, dx.get(), M, K, dw.get(), DType::q4_k, N, nullptr,
                               ws.get(), bytes - 1, nullptr),
               Error);
}

TEST(CudaQuantMatvec, NonFiniteActivationGivesNaN) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t M = 2, K = 256, N = 5;
  const auto w = random_weights(DType::q8_0, N, K, 77);
  auto x = random_x(M, K, 78);
  x[1 * K + 40] = INFINITY;  // row 1 only
  cuda::test::DeviceArray<uint8_t> dw(w);
  cuda::test::DeviceArray<float> dx(x), dy(static_cast<size_t>(M * N));
  cuda::matmul_wt(dy.get(), N, dx.get(), M, K, dw.get(), DType::q8_0, N, nullptr, nullptr);
  const auto y = dy.download();
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_TRUE(std::isfinite(y[n])) << n;
    EXPECT_TRUE(std::isnan(y[N + n])) << n;
  }
}

// The decoder's norm in front of block-typed products, fused with their activation quantizer
// (norm_quantize_f32) and followed by matmul_wt_quantized, against the plain norm followed by
// matmul_wt with its own quantizer: the same normalized rows, the same residual sum, the same
// workspace bytes (integers, scales, sums) and the same products, bit for bit, for RMSNorm and
// LayerNorm, with and without the residual add, both activation block sizes and M = 1..8.
TEST(CudaQuantMatvec, NormQuantizeMatchesNormThenMatmul) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t C = 768, N = 70;
  const float eps = 1e-6f;
  uint32_t seed = 500;
  for (DType t : {DType::q4_0, DType::q8_0, DType::q4_k, DType::q6_k})
    for (bool layer : {false, true})
      for (bool residual : {false, true})
        for (int64_t M : {1, 3, 8}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + (layer ? " layernorm" : " rmsnorm") +
                       (residual ? " +residual" : "") + " M=" + std::to_string(M));
          const auto w = random_weights(t, N, C, seed++);
          const auto x = random_x(M, C, seed++), r = random_x(M, C, seed++);
          const auto gain = random_x(1, C, seed++), shift = random_x(1, C, seed++);
          cuda::test::DeviceArray<uint8_t> dw(w);
          cuda::test::DeviceArray<float> dr(r), dg(gain), db(shift);
          const size_t bytes = cuda::matmul_wt_workspace_bytes(M, C, t);
          // Reference: the plain norm, then matmul_wt quantizing into ws1.
          cuda::test::DeviceArray<float> x1(x), out1(static_cast<size_t>(M * C)),
              y1(static_cast<size_t>(M * N));
          cuda::test::DeviceArray<uint8_t> ws1(bytes);
          if (layer && residual)
            cuda::layernorm_residual_forward<float>(x1.get(), out1.get(), nullptr, nullptr,
                                                    x1.get(), dr.get(), dg.get(), db.get(), M, C,
                                                    nullptr);
          else if (layer)
            cuda::layernorm_forward<float>(out1.get(), nullptr, nullptr, x1.get(), dg.get(),
                                           db.get(), M, C, nullptr);
          else if (residual)
            cuda::rmsnorm_residual_forward<float>(x1.get(), out1.get(), nullptr, x1.get(), dr.get(),
                                                  dg.get(), M, C, eps, nullptr);
          else
            cuda::rmsnorm_forward<float>(out1.get(), nullptr, x1.get(), dg.get(), M, C, eps,
                                         nullptr);
          cuda::matmul_wt(y1.get(), N, out1.get(), M, C, dw.get(), t, N, nullptr, ws1.get(), bytes,
                          nullptr);
          // Fused: the norm quantizes into ws2, the products read it.
          cuda::test::DeviceArray<float> x2(x), out2(static_cast<size_t>(M * C)),
              y2(static_cast<size_t>(M * N));
          cuda::test::DeviceArray<uint8_t> ws2(bytes);
          const cuda::QuantizedActs q = cuda::quantized_acts_view(ws2.get(), bytes, M, C, t);
          cuda::norm_quantize_f32(layer, residual ? x2.get() : nullptr, out2.get(), nullptr,
                                  nullptr, x2.get(), residual ? dr.get() : nullptr, dg.get(),
                                  layer ? db.get() : nullptr, M, C, eps, q, nullptr);
          cuda::matmul_wt_quantized(y2.get(), N, q, dw.get(), t, N, nullptr, nullptr);
          ASSERT_EQ(out2.download(), out1.download());
          ASSERT_EQ(x2.download(), x1.download());
          ASSERT_EQ(ws2.download(), ws1.download());
          ASSERT_EQ(y2.download(), y1.download());
        }
}

// The decoder's SwiGLU in front of a block-typed down product, fused with its quantizer, against
// swiglu_forward then matmul_wt: the same activations, workspace bytes and products, bit for bit,
// in place (out == gate, as the decoder runs it for several rows) and into a separate buffer.
TEST(CudaQuantMatvec, SwigluQuantizeMatchesSwigluThenMatmul) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t F = 1536, N = 40;
  uint32_t seed = 900;
  for (DType t : {DType::q4_0, DType::q8_0, DType::q4_k, DType::q6_k})
    for (bool in_place : {false, true})
      for (int64_t M : {1, 3, 8}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (in_place ? " in place" : "") +
                     " M=" + std::to_string(M));
        const auto w = random_weights(t, N, F, seed++);
        const auto gate = random_x(M, F, seed++), up = random_x(M, F, seed++);
        cuda::test::DeviceArray<uint8_t> dw(w);
        cuda::test::DeviceArray<float> dup(up);
        const size_t bytes = cuda::matmul_wt_workspace_bytes(M, F, t);
        cuda::test::DeviceArray<float> g1(gate), out1(static_cast<size_t>(M * F)),
            y1(static_cast<size_t>(M * N));
        cuda::test::DeviceArray<uint8_t> ws1(bytes);
        float* o1 = in_place ? g1.get() : out1.get();
        cuda::swiglu_forward<float>(o1, g1.get(), dup.get(), M, F, nullptr);
        cuda::matmul_wt(y1.get(), N, o1, M, F, dw.get(), t, N, nullptr, ws1.get(), bytes, nullptr);
        cuda::test::DeviceArray<float> g2(gate), out2(static_cast<size_t>(M * F)),
            y2(static_cast<size_t>(M * N));
        cuda::test::DeviceArray<uint8_t> ws2(bytes);
        float* o2 = in_place ? g2.get() : out2.get();
        const cuda::QuantizedActs q = cuda::quantized_acts_view(ws2.get(), bytes, M, F, t);
        cuda::swiglu_quantize_f32(o2, g2.get(), dup.get(), M, F, q, nullptr);
        cuda::matmul_wt_quantized(y2.get(), N, q, dw.get(), t, N, nullptr, nullptr);
        ASSERT_EQ(g2.download(), g1.download());
        ASSERT_EQ(out2.download(), out1.download());
        ASSERT_EQ(ws2.download(), ws1.download());
        ASSERT_EQ(y2.download(), y1.download());
      }
}

}  // namespace
}  // namespace tessera
