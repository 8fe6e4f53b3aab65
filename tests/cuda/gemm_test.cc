// cuBLASLt GEMM against the CPU reference gemm: every layout, input/output type, epilogue and odd
// shapes on a device; argument checks and the row-major -> column-major mapping on the host.
#include "backend/cuda/gemm_lt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/ops.h"

namespace tessera::cuda {
namespace {

using ops::Trans;

// ---- host helpers ----

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Rounds each value to `t` and returns the stored bytes; `v` is replaced by the rounded values.
std::vector<uint8_t> encode(std::vector<float>& v, LtType t) {
  std::vector<uint8_t> bytes(v.size() * lt_type_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == LtType::f32) {
      std::memcpy(&bytes[i * 4], &v[i], 4);
    } else {
      const uint16_t h = t == LtType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      v[i] = t == LtType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, LtType t) {
  const size_t n = bytes.size() / lt_type_bytes(t);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == LtType::f32) {
      std::memcpy(&v[i], &bytes[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      v[i] = t == LtType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return v;
}

// Unit roundoff of the output's final rounding, taken as one ulp (2^-p for p stored mantissa
// bits) rather than half of one, so a value sitting on a rounding boundary, reached by a slightly
// different f32 sum on the GPU, still passes: bf16 2^-8 (~4e-3), f16 2^-11, f32 0 (its rounding
// is inside the accumulation term).
double output_ulp(LtType t) {
  return t == LtType::bf16 ? std::ldexp(1.0, -8) : t == LtType::f16 ? std::ldexp(1.0, -11) : 0.0;
}

// Inputs are exactly representable in f32 and so are their products (bf16 x bf16 needs 16
// significant bits, f16 x f16 22), so the only differences from the double-precision reference
// are the f32 accumulation and the output rounding. f32 summation of K terms errs by at most
// about K * 2^-24 * sum|a_i b_i| (each of K additions rounds once, relative 2^-24, to a partial
// sum no larger than sum|a_i b_i|); we allow 4x that for tensor-core accumulators that truncate
// internally and split-K orders, plus one output ulp of |ref|. A layout or transpose mistake
// changes results by O(sum|a b| / sqrt(K)), orders of magnitude above this.
double gemm_tolerance(int64_t k, double abs_sum, double ref, LtType out) {
  return 4.0 * static_cast<double>(k) * std::ldexp(1.0, -24) * abs_sum +
         output_ulp(out) * std::fabs(ref) + 1e-30;
}

float gelu_ref(float x) {
  float y = 0;
  cpu::ref::gelu_forward(&y, &x, 1);
  return y;
}

// ---- host-only tests (run without a GPU) ----

// Emulates cuBLAS's column-major GEMM exactly as described by a ColMajorGemm (first = cuBLAS's A
// = our b, second = cuBLAS's B = our a) and checks it reproduces the row-major reference.
void col_major_emulation(const ColMajorGemm& g, const float* first, const float* second, float* c) {
  // Stored shapes must agree with the ops and with column-major ld >= rows.
  ASSERT_EQ(g.first_rows, g.op_t_first ? g.k : g.m);
  ASSERT_EQ(g.first_cols, g.op_t_first ? g.m : g.k);
  ASSERT_EQ(g.second_rows, g.op_t_second ? g.n : g.k);
  ASSERT_EQ(g.second_cols, g.op_t_second ? g.k : g.n);
  ASSERT_GE(g.first_ld, g.first_rows);
  ASSERT_GE(g.second_ld, g.second_rows);
  ASSERT_EQ(g.c_rows, g.m);
  ASSERT_EQ(g.c_cols, g.n);
  ASSERT_GE(g.c_ld, g.c_rows);
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const float x = g.op_t_first ? first[p + i * g.first_ld] : first[i + p * g.first_ld];
        const float y = g.op_t_second ? second[j + p * g.second_ld] : second[p + j * g.second_ld];
        acc += static_cast<double>(x) * y;
      }
      c[i + j * g.c_ld] = static_cast<float>(acc);
    }
}

TEST(GemmLtHost, ColumnMajorMappingMatchesRowMajorReference) {
  struct Shape {
    int64_t m, n, k, pad;
  };
  for (const Shape s : {Shape{1, 7, 5, 0}, Shape{17, 33, 65, 0}, Shape{65, 17, 33, 3},
                        Shape{4, 1, 9, 2}, Shape{8, 8, 1, 1}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(cat("m=", s.m, " n=", s.n, " k=", s.k, " ta=", ta, " tb=", tb));
        const int64_t lda = (ta ? s.m : s.k) + s.pad, ldb = (tb ? s.k : s.n) + s.pad;
        const int64_t ldc = s.n + s.pad;
        const auto a = random_values((ta ? s.k : s.m) * lda, 1);
        const auto b = random_values((tb ? s.n : s.k) * ldb, 2);
        std::vector<float> want(s.m * ldc, 0.f), got(s.m * ldc, 0.f);
        ops::GemmArgs g;
        g.trans_a = ta ? Trans::T : Trans::N;
        g.trans_b = tb ? Trans::T : Trans::N;
        g.m = s.m, g.n = s.n, g.k = s.k;
        g.a = a.data(), g.lda = lda, g.b = b.data(), g.ldb = ldb, g.c = want.data(), g.ldc = ldc;
        cpu::ref::gemm(g);
        const ColMajorGemm cm = to_col_major(ta, tb, s.m, s.n, s.k, lda, ldb, ldc);
        col_major_emulation(cm, b.data(), a.data(), got.data());
        EXPECT_EQ(got, want);  // same products, same order, both in double
      }
  }
}

LtGemmArgs valid_args() {
  static uint16_t dummy[64];
  LtGemmArgs g;
  g.m = 4, g.n = 4, g.k = 4;
  g.a = dummy, g.lda = 4, g.b = dummy, g.ldb = 4, g.c = dummy, g.ldc = 4;
  g.a_type = g.b_type = LtType::bf16;
  g.c_type = LtType::bf16;
  return g;
}

void expect_error_mentions(const LtGemmArgs& g, const std::string& part) {
  try {
    check_gemm_lt_args(g);
    ADD_FAILURE() << "expected an Error mentioning '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(GemmLtHost, ArgumentChecksNameTheParameter) {
  EXPECT_TRUE(check_gemm_lt_args(valid_args()));
  LtGemmArgs g = valid_args();
  g.lda = 3;
  expect_error_mentions(g, "lda");
  g = valid_args();
  g.trans_b = true, g.ldb = 3;
  expect_error_mentions(g, "ldb");
  g = valid_args();
  g.ldc = 2;
  expect_error_mentions(g, "ldc");
  g = valid_args();
  g.k = 0;
  expect_error_mentions(g, "k must be positive");
  g = valid_args();
  g.b_type = LtType::f16;
  expect_error_mentions(g, "differ");
  g = valid_args();
  g.c_type = LtType::f16;
  expect_error_mentions(g, "c_type");
  g = valid_args();
  g.epilogue = LtEpilogue::bias;
  expect_error_mentions(g, "needs bias");
  g = valid_args();
  g.gelu_input = g.c, g.ld_gelu_input = 8;
  expect_error_mentions(g, "gelu_input");
  g = valid_args();
  g.epilogue = LtEpilogue::bias_gelu, g.bias = g.c, g.gelu_input = g.c, g.ld_gelu_input = 4;
  expect_error_mentions(g, "ld_gelu_input");
  g = valid_args();
  g.bias = g.c;  // a bias with no epilogue would be silently ignored
  expect_error_mentions(g, "epilogue is none");
  g = valid_args();
  g.epilogue = LtEpilogue::bias_grad, g.bias = g.c;  // without trans_a
  expect_error_mentions(g, "needs trans_a");
  g = valid_args();
  g.a = nullptr;
  expect_error_mentions(g, "a is null");
  g = valid_args();
  g.a_scale = reinterpret_cast<const float*>(g.c);
  expect_error_mentions(g, "e4m3 inputs only");
}

TEST(GemmLtHost, E4m3ArgumentChecks) {
  LtGemmArgs g = valid_args();
  g.a_type = g.b_type = LtType::e4m3;
  g.m = 16, g.n = 16, g.k = 32, g.lda = 32, g.ldb = 32, g.ldc = 16, g.trans_b = true;
  EXPECT_TRUE(check_gemm_lt_args(g));
  LtGemmArgs d = g;
  d.trans_b = false, d.ldb = 16;
  expect_error_mentions(d, "only the y = x W^T form");
  d = g;
  d.k = 24, d.lda = 32, d.ldb = 32;
  expect_error_mentions(d, "k a multiple of 16");
  d = g;
  d.c_type = LtType::f32, d.epilogue = LtEpilogue::bias, d.bias = d.c;
  expect_error_mentions(d, "bias needs c_type bf16 or f16");
  d = g;
  d.epilogue = LtEpilogue::bias_gelu, d.bias = d.c;
  expect_error_mentions(d, "epilogues none and bias");
}

TEST(GemmLtHost, EmptyProblemIsANoOp) {
  LtGemmArgs g = valid_args();
  g.m = 0;
  EXPECT_FALSE(check_gemm_lt_args(g));
  gemm_lt(g, nullptr);  // returns before touching any device
}

TEST(GemmLtHost, CublasLtLoadsOnDemandWithEveryEntryPoint) {
  // The backend does not link cuBLASLt; it loads it on first use. This needs the toolkit's
  // library, not a GPU: every symbol the GEMMs call must resolve.
  load_cublaslt_entry_points();
}

// ---- device tests ----

struct Case {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, pad = 0;
  LtType in = LtType::bf16, out = LtType::f32;
  LtEpilogue epi = LtEpilogue::none;
  bool accumulate = false;
  bool save_gelu = false;
};

std::string describe(const Case& c) {
  return cat("m=", c.m, " n=", c.n, " k=", c.k, " pad=", c.pad, " ta=", c.ta, " tb=", c.tb, " ",
             lt_type_name(c.in), "->", lt_type_name(c.out), " epi=", lt_epilogue_name(c.epi),
             " acc=", c.accumulate, " aux=", c.save_gelu);
}

void run_case(const Case& cs) {
  SCOPED_TRACE(describe(cs));
  const int64_t M = cs.m, N = cs.n, K = cs.k;
  const int64_t lda = (cs.ta ? M : K) + cs.pad, ldb = (cs.tb ? K : N) + cs.pad;
  const int64_t ldc = N + cs.pad, ldg = (N + 7) / 8 * 8 + (cs.pad ? 8 : 0);
  const int64_t a_rows = cs.ta ? K : M, b_rows = cs.tb ? N : K;
  const uint32_t seed = static_cast<uint32_t>(M * 131 + N * 17 + K * 7 + cs.pad);

  auto a = random_values(a_rows * lda, seed + 1);
  auto b = random_values(b_rows * ldb, seed + 2);
  const bool has_bias = cs.epi == LtEpilogue::bias || cs.epi == LtEpilogue::bias_gelu;
  auto bias = random_values(has_bias ? N : 1, seed + 3);
  // Every element of c (padding too) starts at a sentinel or, when accumulating, a value.
  auto c0 = cs.accumulate ? random_values(M * ldc, seed + 4) : std::vector<float>(M * ldc, 7.f);
  const auto a_bytes = encode(a, cs.in);
  const auto b_bytes = encode(b, cs.in);
  const auto bias_bytes = encode(bias, cs.out);
  const auto c0_bytes = encode(c0, cs.out);

  test::DeviceArray<uint8_t> da(a_bytes), db(b_bytes), dc(c0_bytes);
  test::DeviceArray<uint8_t> dbias(cs.epi == LtEpilogue::bias_grad
                                       ? std::vector<uint8_t>(M * lt_type_bytes(cs.out), 0)
                                       : bias_bytes);
  test::DeviceArray<uint8_t> dgelu(static_cast<size_t>(M * ldg) * lt_type_bytes(cs.out));

  LtGemmArgs g;
  g.trans_a = cs.ta, g.trans_b = cs.tb;
  g.m = M, g.n = N, g.k = K;
  g.a = da.get(), g.a_type = cs.in, g.lda = lda;
  g.b = db.get(), g.b_type = cs.in, g.ldb = ldb;
  g.c = dc.get(), g.c_type = cs.out, g.ldc = ldc;
  g.accumulate = cs.accumulate;
  g.epilogue = cs.epi;
  if (cs.epi != LtEpilogue::none) g.bias = dbias.get();
  if (cs.save_gelu) g.gelu_input = dgelu.get(), g.ld_gelu_input = ldg;
  Stream stream;
  gemm_lt(g, stream.get());
  stream.synchronize();
  const auto got = decode(dc.download(), cs.out);

  // Reference on the rounded values, and the same product of absolute values for the bound.
  ops::GemmArgs r;
  r.trans_a = cs.ta ? Trans::T : Trans::N;
  r.trans_b = cs.tb ? Trans::T : Trans::N;
  r.m = M, r.n = N, r.k = K, r.lda = lda, r.ldb = ldb, r.ldc = ldc;
  r.accumulate = cs.accumulate;
  std::vector<float> want = c0;
  r.a = a.data(), r.b = b.data(), r.c = want.data();
  r.bias = has_bias ? bias.data() : nullptr;
  cpu::ref::gemm(r);
  std::vector<float> abs_a(a.size()), abs_b(b.size()), abs_bias(bias.size()), bound(c0.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(b[i]);
  for (size_t i = 0; i < bias.size(); ++i) abs_bias[i] = std::fabs(bias[i]);
  for (size_t i = 0; i < c0.size(); ++i) bound[i] = std::fabs(c0[i]);
  r.a = abs_a.data(), r.b = abs_b.data(), r.c = bound.data();
  r.bias = has_bias ? abs_bias.data() : nullptr;
  cpu::ref::gemm(r);

  int bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = i * ldc + j;
      if (j >= N) {  // padding: never written
        if (got[at] != c0[at] && ++bad <= 5)
          ADD_FAILURE() << "padding c[" << i << "," << j << "] changed to " << got[at];
        continue;
      }
      double expect = want[at];
      // GELU is 1.13-Lipschitz; 1e-3 absolute covers cuBLASLt evaluating GELU by another
      // formula (the erf form differs from the tanh form by < 5e-4) and its f32 tanh.
      double tol = gemm_tolerance(K, bound[at], expect, cs.out);
      if (cs.epi == LtEpilogue::bias_gelu) {
        expect = gelu_ref(want[at]);
        tol = 1.13 * tol + output_ulp(cs.out) * std::fabs(expect) + 1e-3;
      }
      if (std::fabs(got[at] - expect) > tol && ++bad <= 5)
        ADD_FAILURE() << "c[" << i << "," << j << "] = " << got[at] << ", want " << expect
                      << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0);

  if (cs.save_gelu) {
    const auto pre = decode(dgelu.download(), cs.out);
    int bad_pre = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const double expect = want[i * ldc + j];
        const double tol = gemm_tolerance(K, bound[i * ldc + j], expect, cs.out);
        if (std::fabs(pre[i * ldg + j] - expect) > tol && ++bad_pre <= 5)
          ADD_FAILURE() << "gelu_input[" << i << "," << j << "] = " << pre[i * ldg + j] << ", want "
                        << expect;
      }
    EXPECT_EQ(bad_pre, 0);
  }

  if (cs.epi == LtEpilogue::bias_grad) {
    const auto dbias_got = decode(dbias.download(), cs.out);
    for (int64_t i = 0; i < M; ++i) {
      double sum = 0, abs_sum = 0;
      for (int64_t p = 0; p < K; ++p) {
        const float x = cs.ta ? a[p * lda + i] : a[i * lda + p];
        sum += x;
        abs_sum += std::fabs(x);
      }
      EXPECT_NEAR(dbias_got[i], sum, gemm_tolerance(K, abs_sum, sum, cs.out))
          << "bias[" << i << "]";
    }
  }
}

struct Shape {
  int64_t m, n, k, pad;
};
// Odd sizes on purpose (17x33x65 and its permutation, M = 1, N = 1), plus padded leading
// dimensions, so every layout is exercised off any tile multiple.
const Shape kShapes[] = {{1, 64, 64, 0}, {17, 33, 65, 0},   {65, 17, 33, 0},   {64, 1, 128, 0},
                         {3, 5, 7, 2},   {128, 96, 200, 8}, {200, 72, 1000, 0}};

TEST(GemmLt, EveryLayoutBf16ToF32) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        run_case({.ta = ta != 0, .tb = tb != 0, .m = s.m, .n = s.n, .k = s.k, .pad = s.pad});
}

TEST(GemmLt, EveryLayoutBf16ToBf16) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        run_case({.ta = ta != 0,
                  .tb = tb != 0,
                  .m = s.m,
                  .n = s.n,
                  .k = s.k,
                  .pad = s.pad,
                  .out = LtType::bf16});
}

TEST(GemmLt, Fp16InputsToF16AndF32) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    for (LtType out : {LtType::f16, LtType::f32}) {
      run_case(
          {.tb = true, .m = s.m, .n = s.n, .k = s.k, .pad = s.pad, .in = LtType::f16, .out = out});
      run_case({.m = s.m, .n = s.n, .k = s.k, .pad = s.pad, .in = LtType::f16, .out = out});
      run_case(
          {.ta = true, .m = s.m, .n = s.n, .k = s.k, .pad = s.pad, .in = LtType::f16, .out = out});
    }
}

TEST(GemmLt, F32Inputs) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    run_case({.tb = true, .m = s.m, .n = s.n, .k = s.k, .pad = s.pad, .in = LtType::f32});
}

TEST(GemmLt, AccumulateAddsToC) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes) {
    run_case({.ta = true, .m = s.m, .n = s.n, .k = s.k, .pad = s.pad, .accumulate = true});
    run_case({.tb = true,
              .m = s.m,
              .n = s.n,
              .k = s.k,
              .pad = s.pad,
              .out = LtType::bf16,
              .accumulate = true});
  }
}

TEST(GemmLt, BiasEpilogue) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    for (LtType out : {LtType::f32, LtType::bf16}) {
      run_case({.tb = true,
                .m = s.m,
                .n = s.n,
                .k = s.k,
                .pad = s.pad,
                .out = out,
                .epi = LtEpilogue::bias});
      run_case({.m = s.m,
                .n = s.n,
                .k = s.k,
                .pad = s.pad,
                .out = out,
                .epi = LtEpilogue::bias,
                .accumulate = true});
    }
}

TEST(GemmLt, BiasGeluEpilogue) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : kShapes)
    for (LtType out : {LtType::f32, LtType::bf16})
      run_case({.tb = true,
                .m = s.m,
                .n = s.n,
                .k = s.k,
                .pad = s.pad,
                .out = out,
                .epi = LtEpilogue::bias_gelu});
}

TEST(GemmLt, BiasGeluSavesPreActivation) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Shape& s : {Shape{64, 128, 64, 0}, Shape{17, 40, 65, 0}, Shape{256, 96, 128, 8}})
    for (LtType out : {LtType::f32, LtType::bf16})
      run_case({.tb = true,
                .m = s.m,
                .n = s.n,
                .k = s.k,
                .pad = s.pad,
                .out = out,
                .epi = LtEpilogue::bias_gelu,
                .save_gelu = true});
}

TEST(GemmLt, BiasGradientOfWgrad) {
  TS_REQUIRE_CUDA_DEVICE();
  // dW (out, in) = dy^T (out, tokens) x (tokens, in): a = dy (tokens, out) transposed.
  for (const Shape& s : {Shape{64, 32, 256, 0}, Shape{33, 17, 65, 0}, Shape{768, 256, 512, 0}})
    for (bool acc : {false, true})
      run_case({.ta = true,
                .m = s.m,
                .n = s.n,
                .k = s.k,
                .pad = s.pad,
                .epi = LtEpilogue::bias_grad,
                .accumulate = acc});
}

TEST(GemmLt, AlgorithmChoiceIsCached) {
  TS_REQUIRE_CUDA_DEVICE();
  const Case c{.tb = true, .m = 48, .n = 80, .k = 96};
  run_case(c);
  const size_t after_first = gemm_lt_cached_plans();
  run_case(c);
  run_case(c);
  EXPECT_EQ(gemm_lt_cached_plans(), after_first);
  run_case({.tb = true, .m = 48, .n = 80, .k = 112});
  EXPECT_EQ(gemm_lt_cached_plans(), after_first + 1);
}

// Every Stream the tests make runs a GEMM; a destroyed stream's cuBLASLt workspace (32 MiB)
// must go back, or a process making streams would grow by one per stream.
TEST(GemmLt, StreamDestructionReleasesItsWorkspace) {
  TS_REQUIRE_CUDA_DEVICE();
  const size_t before = gemm_lt_workspaces();
  for (int i = 0; i < 3; ++i) {
    // Long K: the heuristic's split-K choices are the ones that ask for a workspace.
    run_case({.tb = true, .m = 64, .n = 64, .k = 8192});
    EXPECT_EQ(gemm_lt_workspaces(), before) << "round " << i;
  }
  size_t during = 0;
  {
    Stream s;
    std::vector<uint8_t> zeros(64 * 8192 * 2, 0);
    test::DeviceArray<uint8_t> a(zeros), b(zeros), c(std::vector<uint8_t>(64 * 64 * 4, 0));
    LtGemmArgs g = lt_linear(c.get(), LtType::f32, a.get(), b.get(), LtType::bf16, 64, 64, 8192);
    gemm_lt(g, s.get());
    during = gemm_lt_workspaces();
    EXPECT_LE(during, before + 1);
  }
  EXPECT_EQ(gemm_lt_workspaces(), before);
  std::printf("[ info ] cuBLASLt %s a workspace for 64x64x8192\n",
              during > before ? "took" : "did not need");
}

// e4m3 byte from sign, 4-bit exponent field (bias 7) and 3-bit mantissa; normal values only.
uint8_t e4m3(int sign, int exp_field, int mant) {
  return static_cast<uint8_t>((sign << 7) | (exp_field << 3) | mant);
}
float e4m3_value(uint8_t v) {
  const int exp_field = (v >> 3) & 15, mant = v & 7;
  const float x = std::ldexp(1.f + mant / 8.f, exp_field - 7);
  return (v & 0x80) ? -x : x;
}

TEST(GemmLt, E4m3ForwardWithScales) {
  TS_REQUIRE_CUDA_DEVICE();
  const DeviceInfo info = device_info(current_device());
  const int64_t M = 48, N = 80, K = 128;  // lda = ldb = K, a multiple of 16
  std::mt19937 rng(5);
  std::vector<uint8_t> a8(M * K), b8(N * K);
  std::vector<float> a(M * K), b(N * K);
  // Exponent fields 5..9 give magnitudes in [0.25, 7.5]: far from NaN (0x7f) and subnormals.
  for (size_t i = 0; i < a8.size(); ++i) a8[i] = e4m3(rng() & 1, 5 + rng() % 5, rng() % 8);
  for (size_t i = 0; i < b8.size(); ++i) b8[i] = e4m3(rng() & 1, 5 + rng() % 5, rng() % 8);
  // Power-of-two scales keep the scaled reference exact.
  const float sa = 0.5f, sb = 0.25f;
  for (size_t i = 0; i < a.size(); ++i) a[i] = e4m3_value(a8[i]) * sa;
  for (size_t i = 0; i < b.size(); ++i) b[i] = e4m3_value(b8[i]) * sb;
  auto bias = random_values(N, 9);
  const auto bias_bytes = encode(bias, LtType::bf16);
  std::vector<float> c0(M * N, 0.f);
  const auto c0_bytes = encode(c0, LtType::bf16);
  test::DeviceArray<uint8_t> da(a8), db(b8), dc(c0_bytes), dbias(bias_bytes);
  test::DeviceArray<float> dsa(std::vector<float>{sa}), dsb(std::vector<float>{sb});

  LtGemmArgs g;
  g.trans_b = true;
  g.m = M, g.n = N, g.k = K;
  g.a = da.get(), g.a_type = LtType::e4m3, g.lda = K;
  g.b = db.get(), g.b_type = LtType::e4m3, g.ldb = K;
  g.c = dc.get(), g.c_type = LtType::bf16, g.ldc = N;
  g.epilogue = LtEpilogue::bias, g.bias = dbias.get();
  g.a_scale = dsa.get(), g.b_scale = dsb.get();
  if (info.sm_major * 10 + info.sm_minor < 89) {
    try {
      gemm_lt(g, nullptr);
      FAIL() << "e4m3 on sm_" << info.sm_major << info.sm_minor << " should throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sm_89"), std::string::npos) << e.what();
    }
    return;
  }
  gemm_lt(g, nullptr);
  const auto got = decode(dc.download(), LtType::bf16);
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = bias[j], abs_acc = std::fabs(bias[j]);
      for (int64_t p = 0; p < K; ++p) {
        acc += static_cast<double>(a[i * K + p]) * b[j * K + p];
        abs_acc += std::fabs(static_cast<double>(a[i * K + p]) * b[j * K + p]);
      }
      // Hopper's fp8 tensor cores accumulate with fewer bits than f32 (about 2^-13 relative to
      // the running sum is reported), so allow 2^-10 * sum|ab| plus the bf16 output ulp: still
      // far below the O(sum|ab| / sqrt(K)) of a wrong operand or scale.
      const double tol = std::ldexp(1.0, -10) * abs_acc + output_ulp(LtType::bf16) * std::fabs(acc);
      if (std::fabs(got[i * N + j] - acc) > tol && ++bad <= 5)
        ADD_FAILURE() << "c[" << i << "," << j << "] = " << got[i * N + j] << ", want " << acc;
    }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace tessera::cuda
