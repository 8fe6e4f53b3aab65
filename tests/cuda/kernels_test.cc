// CUDA training kernels (backend/cuda/kernels.h) against the CPU reference kernels, in f32 and
// bf16, on shapes that are not multiples of the vector widths (C = 771), N = 1, and GPT-2's
// vocabulary (V = 50257 padded to 50304).
//
// Tolerances. The reference evaluates in double (or, for embedding backward, AdamW, scale and
// conversion, in the same f32 operation order: those must match bit for bit). Our kernels
// compute in f32, so an f32 result differs by a few f32 rounding errors of the terms involved
// (eps32 = 2^-24 ~ 6e-8, times a small factor for the reductions, stated per test). A bf16
// result is our f32 value rounded once more to 8 significant bits: the extra error is at most
// half a bf16 ulp, 2^-8 relative (~3.9e-3), so bf16 tolerances are 2^-8 |ref| plus the f32 one.
// Inputs for bf16 runs are rounded to bf16 first and the reference sees those same values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/ops.h"

namespace tessera {
namespace {

using bf16 = __nv_bfloat16;
using cuda::test::DeviceArray;

constexpr double kBf16Rel = 1.0 / 256;  // half a bf16 ulp, relative

template <typename E>
constexpr bool kIsBf16 = std::is_same_v<E, bf16>;

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The values x takes once stored as E.
template <typename E>
std::vector<float> as_e(std::vector<float> v) {
  if constexpr (kIsBf16<E>)
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// n values of E on the device: f32 host values in, f32 host values out.
template <typename E>
class Buf {
  using S = std::conditional_t<kIsBf16<E>, uint16_t, float>;

 public:
  explicit Buf(const std::vector<float>& host) : d_(host.size()) { upload(host); }
  explicit Buf(int64_t n) : d_(static_cast<size_t>(n)) {}  // zeros
  void upload(const std::vector<float>& host) {
    std::vector<S> s(host.size());
    for (size_t i = 0; i < host.size(); ++i) {
      if constexpr (kIsBf16<E>)
        s[i] = f32_to_bf16(host[i]);
      else
        s[i] = host[i];
    }
    d_.upload(s);
  }
  std::vector<float> download() const {
    const std::vector<S> s = d_.download();
    std::vector<float> out(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if constexpr (kIsBf16<E>)
        out[i] = bf16_to_f32(s[i]);
      else
        out[i] = s[i];
    }
    return out;
  }
  E* get() { return reinterpret_cast<E*>(d_.get()); }

 private:
  DeviceArray<S> d_;
};

// |got - ref| <= atol + rtol |ref| for every element; reports the first few failures.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double atol,
                  double rtol, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = atol + rtol * std::fabs(ref[i]);
    const bool ok = std::fabs(static_cast<double>(got[i]) - ref[i]) <= tol ||
                    (std::isnan(got[i]) && std::isnan(ref[i]));
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << ref[i] << " (tol "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements out of tolerance";
}

// Bit-for-bit equality (NaN equal to NaN of the same bits).
void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& ref,
                       const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], 4) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << ref[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements differ";
}

// Rounds a reference result the way a bf16 kernel output is stored.
template <typename E>
std::vector<float> stored(const std::vector<float>& ref) {
  return as_e<E>(ref);
}

template <typename E>
class CudaKernels : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CudaKernels, ElementTypes);

// ---- Embedding ----

TYPED_TEST(CudaKernels, EmbeddingForwardMatchesReferenceExactly) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  struct Shape {
    int64_t B, T, C, V;
    bool pos;
  };
  for (const Shape s : {Shape{2, 5, 771, 37, true}, Shape{3, 17, 768, 1000, true},
                        Shape{1, 1, 64, 10, true}, Shape{2, 9, 256, 50, false}}) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const int64_t N = s.B * s.T;
    std::vector<int32_t> tokens(N);
    std::mt19937 rng(7);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.V);
    const auto wte = as_e<E>(randn(s.V * s.C, 1));
    const auto wpe = s.pos ? as_e<E>(randn(s.T * s.C, 2)) : std::vector<float>(s.T * s.C, 0.0f);
    std::vector<float> ref(N * s.C);
    cpu::ref::embedding_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C,
                                s.V);
    Buf<E> d_out(static_cast<int64_t>(N * s.C)), d_wte(wte), d_wpe(wpe);
    DeviceArray<int32_t> d_tok(tokens);
    cuda::embedding_forward<E>(d_out.get(), d_tok.get(), d_wte.get(), s.pos ? d_wpe.get() : nullptr,
                               s.B, s.T, s.C, s.V, nullptr);
    // One f32 addition, as the reference, then (bf16) one rounding: identical bits.
    expect_bits_equal(d_out.download(), stored<E>(ref), "out");
  }
}

TYPED_TEST(CudaKernels, EmbeddingForwardMarksBadTokenWithNaN) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  const int64_t B = 1, T = 3, C = 16, V = 5;
  std::vector<int32_t> tokens = {1, 5, -1};
  Buf<E> d_out(static_cast<int64_t>(T * C)), d_wte(randn(V * C, 3)), d_wpe(randn(T * C, 4));
  DeviceArray<int32_t> d_tok(tokens);
  cuda::embedding_forward<E>(d_out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, T, C, V,
                             nullptr);
  const auto out = d_out.download();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_FALSE(std::isnan(out[c]));
    EXPECT_TRUE(std::isnan(out[C + c]));
    EXPECT_TRUE(std::isnan(out[2 * C + c]));
  }
}

TYPED_TEST(CudaKernels, EmbeddingBackwardMatchesReferenceExactly) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  struct Shape {
    int64_t B, T, C, V;
    bool pos;
  };
  // Small vocabularies force many repeated tokens (the case atomics would reorder).
  for (const Shape s :
       {Shape{2, 7, 771, 13, true}, Shape{4, 33, 768, 50, true}, Shape{1, 1, 8, 3, true},
        Shape{3, 64, 128, 5000, false}, Shape{2, 40, 100, 2, true}}) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
    const int64_t N = s.B * s.T;
    std::vector<int32_t> tokens(N);
    std::mt19937 rng(11);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % s.V);
    const auto dout = as_e<E>(randn(N * s.C, 5));
    auto dwte = randn(s.V * s.C, 6), dwpe = randn(s.T * s.C, 8);
    DeviceArray<float> d_dwte(dwte), d_dwpe(dwpe);
    Buf<E> d_dout(dout);
    DeviceArray<int32_t> d_tok(tokens);
    cuda::embedding_backward<E>(d_dwte.get(), s.pos ? d_dwpe.get() : nullptr, d_dout.get(),
                                d_tok.get(), s.B, s.T, s.C, s.V, nullptr);
    std::vector<float> scratch_dwpe = dwpe;
    cpu::ref::embedding_backward(dwte.data(), scratch_dwpe.data(), dout.data(), tokens.data(), s.B,
                                 s.T, s.C, s.V);
    // Same f32 additions in the same (row) order as the reference.
    expect_bits_equal(d_dwte.download(), dwte, "dwte");
    expect_bits_equal(d_dwpe.download(), s.pos ? scratch_dwpe : dwpe, "dwpe");
  }
}

// ---- LayerNorm / RMSNorm ----

struct NormShape {
  int64_t N, C;
};
// C=771: scalar path; 768: vectors; 64: one warp; 3001: scalar, several vectors per thread;
// 12288: vector path with several vectors per thread.
const NormShape kNormShapes[] = {{1, 771}, {7, 768}, {33, 64}, {3, 3001}, {2, 12288}};

// f32 forward tolerance: mean and variance are f32 sums of C terms (relative error ~C^0.5 eps32
// typical, bounded well below 1e-5 for C <= 12288 with pairwise block sums), so
// |out error| <~ 1e-5 (|xhat| |w| + |b|) <= 1e-5 (1 + |ref|)-ish with O(1) weights: we use
// atol 2e-5 and rtol 2e-5.
constexpr double kNormAtol = 2e-5, kNormRtol = 2e-5;

TYPED_TEST(CudaKernels, LayerNormForwardMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  for (const NormShape s : kNormShapes) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " residual=" << residual);
      // A mean offset of 3 checks the centered (two-pass) variance.
      const auto a = as_e<E>(randn(s.N * s.C, 21, 1.0f, 3.0f));
      const auto r = as_e<E>(randn(s.N * s.C, 22));
      const auto w = randn(s.C, 23, 0.5f, 1.0f), b = randn(s.C, 24, 0.2f);
      std::vector<float> x = a;
      if (residual) {
        for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + r[i];
        x = as_e<E>(x);
      }
      std::vector<float> ref(s.N * s.C), mean(s.N), rstd(s.N);
      cpu::ref::layernorm_forward(ref.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                  b.data(), s.N, s.C);
      Buf<E> d_a(a), d_r(r), d_out(static_cast<int64_t>(s.N * s.C)),
          d_res(static_cast<int64_t>(s.N * s.C));
      DeviceArray<float> d_w(w), d_b(b), d_mean(s.N), d_rstd(s.N);
      if (residual)
        cuda::layernorm_residual_forward<E>(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(),
                                            d_a.get(), d_r.get(), d_w.get(), d_b.get(), s.N, s.C,
                                            nullptr);
      else
        cuda::layernorm_forward<E>(d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_w.get(),
                                   d_b.get(), s.N, s.C, nullptr);
      const double rel = kIsBf16<E> ? kBf16Rel + kNormRtol : kNormRtol;
      expect_close(d_out.download(), ref, kNormAtol, rel, "out");
      expect_close(d_mean.download(), mean, 1e-5, 1e-5, "mean");
      expect_close(d_rstd.download(), rstd, 0, 2e-5, "rstd");
      if (residual) expect_bits_equal(d_res.download(), x, "res_out");  // one add, one rounding
    }
  }
}

TYPED_TEST(CudaKernels, RmsNormForwardMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  const float eps = 1e-6f;
  for (const NormShape s : kNormShapes) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " residual=" << residual);
      const auto a = as_e<E>(randn(s.N * s.C, 31, 1.5f));
      const auto r = as_e<E>(randn(s.N * s.C, 32));
      const auto w = randn(s.C, 33, 0.5f, 1.0f);
      std::vector<float> x = a;
      if (residual) {
        for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + r[i];
        x = as_e<E>(x);
      }
      std::vector<float> ref(s.N * s.C), rstd(s.N);
      cpu::ref::rmsnorm_forward(ref.data(), rstd.data(), x.data(), w.data(), s.N, s.C, eps);
      Buf<E> d_a(a), d_r(r), d_out(static_cast<int64_t>(s.N * s.C)),
          d_res(static_cast<int64_t>(s.N * s.C));
      DeviceArray<float> d_w(w), d_rstd(s.N);
      if (residual)
        cuda::rmsnorm_residual_forward<E>(d_res.get(), d_out.get(), d_rstd.get(), d_a.get(),
                                          d_r.get(), d_w.get(), s.N, s.C, eps, nullptr);
      else
        cuda::rmsnorm_forward<E>(d_out.get(), d_rstd.get(), d_a.get(), d_w.get(), s.N, s.C, eps,
                                 nullptr);
      const double rel = kIsBf16<E> ? kBf16Rel + kNormRtol : kNormRtol;
      expect_close(d_out.download(), ref, kNormAtol, rel, "out");
      expect_close(d_rstd.download(), rstd, 0, 2e-5, "rstd");
      if (residual) expect_bits_equal(d_res.download(), x, "res_out");
    }
  }
  // In place (out == inp), as ops::rmsnorm_forward allows.
  const int64_t N = 3, C = 768;
  const auto x = as_e<E>(randn(N * C, 34));
  const auto w = randn(C, 35, 0.5f, 1.0f);
  std::vector<float> ref(N * C), rstd(N);
  cpu::ref::rmsnorm_forward(ref.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  Buf<E> d_x(x);
  DeviceArray<float> d_w(w), d_rstd(N);
  cuda::rmsnorm_forward<E>(d_x.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, 1e-5f, nullptr);
  expect_close(d_x.download(), ref, kNormAtol, (kIsBf16<E> ? kBf16Rel : 0) + kNormRtol, "inplace");
}

// Backward tolerances. dinp: r (g - mean(g) - xhat mean(g xhat)) with f32 row sums over C
// (as the forward) -> 5e-5 (1 + |ref|); the accumulated dinp start values are O(1).
// dw, db: sums over N rows, f32, in chunks of <= 32 rows plus <= 512 chunk partials: the error
// is below (32 + 64) eps32 ~ 6e-6 times sum_n |term| (mag below), so 1e-5 mag + 1e-6 |start|.
template <typename E>
void run_norm_backward(bool layer, NormShape s) {
  SCOPED_TRACE(testing::Message() << (layer ? "layernorm" : "rmsnorm") << " N=" << s.N
                                  << " C=" << s.C);
  const auto x = as_e<E>(randn(s.N * s.C, 41, 1.0f, layer ? 2.0f : 0.0f));
  const auto dout = as_e<E>(randn(s.N * s.C, 42));
  const auto w = randn(s.C, 43, 0.5f, 1.0f), b = randn(s.C, 44);
  const auto dinp0 = as_e<E>(randn(s.N * s.C, 45));
  const auto dw0 = randn(s.C, 46), db0 = randn(s.C, 47);
  std::vector<float> y(s.N * s.C), mean(s.N, 0.0f), rstd(s.N);
  if (layer)
    cpu::ref::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                s.N, s.C);
  else
    cpu::ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), s.N, s.C, 1e-5f);
  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  if (layer)
    cpu::ref::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                                 mean.data(), rstd.data(), s.N, s.C);
  else
    cpu::ref::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(),
                               s.N, s.C);
  std::vector<double> mag_w(s.C, 0.0), mag_b(s.C, 0.0);
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t c = 0; c < s.C; ++c) {
      const double d = dout[n * s.C + c];
      mag_w[c] += std::fabs(d * (x[n * s.C + c] - mean[n]) * rstd[n]);
      mag_b[c] += std::fabs(d);
    }
  }

  Buf<E> d_x(x), d_dout(dout), d_dinp(dinp0);
  DeviceArray<float> d_w(w), d_mean(mean), d_rstd(rstd), d_dw(dw0), d_db(db0);
  DeviceArray<float> ws(static_cast<size_t>(cuda::norm_backward_workspace_floats(s.N, s.C)));
  if (layer)
    cuda::layernorm_backward<E>(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(),
                                d_w.get(), d_mean.get(), d_rstd.get(), s.N, s.C, ws.get(), nullptr);
  else
    cuda::rmsnorm_backward<E>(d_dinp.get(), d_dw.get(), d_dout.get(), d_x.get(), d_w.get(),
                              d_rstd.get(), s.N, s.C, ws.get(), nullptr);
  expect_close(d_dinp.download(), dinp, 5e-5, (kIsBf16<E> ? kBf16Rel : 0) + 5e-5, "dinp");
  const auto got_dw = d_dw.download(), got_db = d_db.download();
  for (int64_t c = 0; c < s.C; ++c) {
    EXPECT_NEAR(got_dw[c], dw[c], 1e-5 * mag_w[c] + 1e-6 * std::fabs(dw0[c]) + 1e-6)
        << "dw[" << c << "]";
    if (layer) {
      EXPECT_NEAR(got_db[c], db[c], 1e-5 * mag_b[c] + 1e-6 * std::fabs(db0[c]) + 1e-6)
          << "db[" << c << "]";
    } else {
      EXPECT_EQ(got_db[c], db0[c]) << "rmsnorm must not touch db";
    }
    if (::testing::Test::HasFailure()) break;
  }
}

TYPED_TEST(CudaKernels, NormBackwardMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  for (bool layer : {true, false}) {
    for (const NormShape s : kNormShapes) run_norm_backward<TypeParam>(layer, s);
    run_norm_backward<TypeParam>(layer, {1000, 96});  // several rows per chunk, many chunks
  }
}

// ---- Activations ----

// f32 activations: expf is within 2 ulp and the f32 argument u carries ~3 eps32 relative error,
// which exp turns into ~3 eps32 |2u| relative error; for |x| <= 6 (|2u| <= 25) that is < 5e-6.
// Larger |x| give tiny values (gelu) or values equal to x to f32 precision; atol covers them.
constexpr double kActRtol = 1e-5, kActAtol = 1e-6;

const int64_t kElementwiseSizes[] = {1, 7, 771, 100003};

TYPED_TEST(CudaKernels, GeluMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  for (int64_t n : kElementwiseSizes) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = as_e<E>(randn(n, 51, 2.5f)), dout = as_e<E>(randn(n, 52));
    std::vector<float> ref(n), dref(n);
    cpu::ref::gelu_forward(ref.data(), x.data(), n);
    cpu::ref::gelu_backward(dref.data(), x.data(), dout.data(), n);
    Buf<E> d_x(x), d_out(static_cast<int64_t>(n)), d_dout(dout);
    cuda::gelu_forward<E>(d_out.get(), d_x.get(), n, nullptr);
    cuda::gelu_backward<E>(d_dout.get(), d_x.get(), d_dout.get(), n, nullptr);  // in place
    const double rel = (kIsBf16<E> ? kBf16Rel : 0) + kActRtol;
    expect_close(d_out.download(), ref, kActAtol, rel, "gelu");
    expect_close(d_dout.download(), dref, kActAtol, rel, "gelu'");
  }
}

TYPED_TEST(CudaKernels, SwigluMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  for (int64_t F : {1, 771, 1024}) {
    const int64_t N = F == 1 ? 1 : 5;
    SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F);
    const int64_t n = N * F;
    const auto g = as_e<E>(randn(n, 61, 3.0f)), u = as_e<E>(randn(n, 62)),
               dout = as_e<E>(randn(n, 63));
    std::vector<float> ref(n), dg(n), du(n);
    cpu::ref::glu_forward(ref.data(), g.data(), u.data(), N, F, ops::GluAct::silu);
    cpu::ref::glu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), N, F,
                           ops::GluAct::silu);
    Buf<E> d_g(g), d_u(u), d_out(static_cast<int64_t>(n)), d_dout(dout),
        d_dg(static_cast<int64_t>(n)), d_du(static_cast<int64_t>(n));
    cuda::swiglu_forward<E>(d_out.get(), d_g.get(), d_u.get(), N, F, nullptr);
    cuda::swiglu_backward<E>(d_dg.get(), d_du.get(), d_dout.get(), d_g.get(), d_u.get(), N, F,
                             nullptr);
    const double rel = (kIsBf16<E> ? kBf16Rel : 0) + kActRtol;
    expect_close(d_out.download(), ref, kActAtol, rel, "swiglu");
    expect_close(d_dg.download(), dg, kActAtol, rel, "dgate");
    expect_close(d_du.download(), du, kActAtol, rel, "dup");
    // In place: out aliases gate.
    cuda::swiglu_forward<E>(d_g.get(), d_g.get(), d_u.get(), N, F, nullptr);
    expect_close(d_g.download(), ref, kActAtol, rel, "swiglu in place");
  }
}

// ---- RoPE ----

// The table's cos/sin are the exact values rounded once to f32 (0.5 eps32 each), so an f32
// output differs from the double reference by ~2 eps32 (|xa| + |xb|) <= ~1e-6 for |x| <= 4:
// tolerance 2e-6 plus 1e-6 |ref|.
TYPED_TEST(CudaKernels, RopeMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  struct Shape {
    int64_t B, T, H, D, R;
  };
  for (const Shape s : {Shape{2, 5, 3, 64, 32}, Shape{1, 1, 1, 128, 128}, Shape{3, 7, 2, 10, 6}}) {
    for (auto layout : {ops::RopeLayout::half, ops::RopeLayout::interleaved}) {
      for (bool use_positions : {false, true}) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " R="
                       << s.R << " interleaved=" << (layout == ops::RopeLayout::interleaved)
                       << " positions=" << use_positions << " in_place=" << in_place);
          const int64_t max_pos = 40, pos0 = 3, n = s.B * s.T * s.H * s.D;
          const ops::RopeTable table = ops::make_rope_table(max_pos, s.R, 10000.0);
          std::vector<int32_t> positions(s.T);
          for (int64_t t = 0; t < s.T; ++t)
            positions[t] = static_cast<int32_t>((t * 7 + 5) % max_pos);
          const int32_t* pos_host = use_positions ? positions.data() : nullptr;
          const auto x = as_e<E>(randn(n, 71)), dy = as_e<E>(randn(n, 72));
          std::vector<float> ref(n), dref(n);
          cpu::ref::rope_forward(ref.data(), x.data(), table, pos_host, pos0, s.B, s.T, s.H, s.D,
                                 layout);
          cpu::ref::rope_backward(dref.data(), dy.data(), table, pos_host, pos0, s.B, s.T, s.H, s.D,
                                  layout);
          DeviceArray<float> d_cos(table.cos), d_sin(table.sin);
          DeviceArray<int32_t> d_pos(positions);
          cuda::RopeTableView view;
          view.cos = d_cos.get();
          view.sin = d_sin.get();
          view.max_pos = max_pos;
          view.rotary_dim = s.R;
          const auto cl = layout == ops::RopeLayout::half ? cuda::RopeLayout::half
                                                          : cuda::RopeLayout::interleaved;
          Buf<E> d_x(x), d_dy(dy), d_out(static_cast<int64_t>(n)), d_dx(static_cast<int64_t>(n));
          const int32_t* pos_dev = use_positions ? d_pos.get() : nullptr;
          E* out = in_place ? d_x.get() : d_out.get();
          E* dx = in_place ? d_dy.get() : d_dx.get();
          cuda::rope_forward<E>(out, d_x.get(), view, pos_dev, pos0, s.B, s.T, s.H, s.D, cl,
                                nullptr);
          cuda::rope_backward<E>(dx, d_dy.get(), view, pos_dev, pos0, s.B, s.T, s.H, s.D, cl,
                                 nullptr);
          const double rel = (kIsBf16<E> ? kBf16Rel : 0) + 1e-6;
          expect_close(in_place ? d_x.download() : d_out.download(), ref, 2e-6, rel, "rope");
          expect_close(in_place ? d_dy.download() : d_dx.download(), dref, 2e-6, rel, "rope'");
        }
      }
    }
  }
}

// ---- Softmax + cross-entropy ----

// Loss: log(sum) with the sum of exps (via __expf, relative error ~2e-6 for arguments down to
// -30) accumulated in f32 over <= 50304 terms in per-thread runs of ~100 and a tree: relative
// error < 1e-5, so the loss (log of it plus exact logit differences) is within 2e-5 (1+|loss|).
// Gradient: p carries the same ~1e-5 relative error; scale * (p - onehot).
TYPED_TEST(CudaKernels, SoftmaxXentMatchesReference) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  struct Shape {
    int64_t N, V, Vp;
  };
  for (const Shape s : {Shape{4, 50257, 50304}, Shape{1, 50257, 50304}, Shape{3, 771, 773},
                        Shape{5, 1000, 1000}, Shape{2, 3, 8}}) {
    for (float scale : {0.0f, 0.25f}) {
      SCOPED_TRACE(testing::Message()
                   << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " scale=" << scale);
      auto logits = as_e<E>(randn(s.N * s.Vp, 81, 2.0f));
      for (int64_t n = 0; n < s.N; ++n)  // padding holds garbage the kernel must ignore
        for (int64_t j = s.V; j < s.Vp; ++j) logits[n * s.Vp + j] = 1e4f;
      std::vector<int32_t> targets(s.N);
      for (int64_t n = 0; n < s.N; ++n) targets[n] = static_cast<int32_t>((n * 7919) % s.V);
      if (s.N >= 3) targets[1] = -1;  // ignored row
      std::vector<float> ref = logits, losses(s.N);
      cpu::ref::softmax_xent(losses.data(), ref.data(), targets.data(), s.N, s.V, s.Vp, scale);
      Buf<E> d_logits(logits);
      DeviceArray<float> d_losses(s.N);
      DeviceArray<int32_t> d_targets(targets);
      cuda::softmax_xent<E>(d_losses.get(), d_logits.get(), d_targets.get(), s.N, s.V, s.Vp, scale,
                            nullptr);
      const auto got_losses = d_losses.download();
      for (int64_t n = 0; n < s.N; ++n)
        EXPECT_NEAR(got_losses[n], losses[n], 2e-5 * (1.0 + std::fabs(losses[n])))
            << "loss[" << n << "]";
      const double rel = (kIsBf16<E> ? kBf16Rel : 0) + 2e-5;
      if (scale == 0.0f)
        expect_bits_equal(d_logits.download(), stored<E>(logits), "logits untouched");
      else
        expect_close(d_logits.download(), ref, 1e-9, rel, "dlogits");
    }
  }
}

// ---- AdamW, global norm, scale, conversion ----

template <typename G>
void run_adamw(int64_t n, int64_t offset, const ops::AdamWArgs& a, bool with_bf16) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset << " t=" << a.t
                                  << " bf16 grads=" << kIsBf16<G> << " bf16 copy=" << with_bf16);
  auto params = randn(n + offset, 91), m = randn(n + offset, 92, 0.1f);
  auto v = randn(n + offset, 93, 0.01f);
  for (auto& x : v) x = x * x;  // second moments are non-negative
  const auto grads = as_e<G>(randn(n + offset, 94));
  DeviceArray<float> d_p(params), d_m(m), d_v(v);
  Buf<G> d_g(grads);
  Buf<bf16> d_pb(static_cast<int64_t>(n + offset));
  cuda::adamw<G>(d_p.get() + offset, with_bf16 ? d_pb.get() + offset : nullptr, d_g.get() + offset,
                 d_m.get() + offset, d_v.get() + offset, n, a, nullptr);
  ops::AdamWArgs ra;
  ra.lr = a.lr;
  ra.beta1 = a.beta1;
  ra.beta2 = a.beta2;
  ra.eps = a.eps;
  ra.weight_decay = a.weight_decay;
  ra.t = a.t;
  ra.grad_scale = a.grad_scale;
  cpu::ref::adamw(params.data() + offset, grads.data() + offset, m.data() + offset,
                  v.data() + offset, n, ra);
  // The same separately rounded f32 operations as the reference: identical bits.
  expect_bits_equal(d_p.download(), params, "params");
  expect_bits_equal(d_m.download(), m, "m");
  expect_bits_equal(d_v.download(), v, "v");
  if (with_bf16) {
    auto want = stored<bf16>(params);
    for (int64_t i = 0; i < offset; ++i) want[i] = 0.0f;
    expect_bits_equal(d_pb.download(), want, "params_bf16");
  }
}

TEST(CudaKernelsOptimizer, AdamWMatchesReferenceBitForBit) {
  TS_REQUIRE_CUDA_DEVICE();
  ops::AdamWArgs a;
  a.lr = 3e-4f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  for (int64_t t : {1, 7}) {
    a.t = t;
    for (int64_t n : {1, 771, 100003}) {
      run_adamw<float>(n, 0, a, true);
      run_adamw<bf16>(n, 0, a, true);
    }
    run_adamw<float>(771, 1, a, true);  // misaligned: scalar path
    run_adamw<bf16>(1000, 1, a, false);
  }
}

TEST(CudaKernelsOptimizer, GlobalSumSquaresMatchesReferenceAndRepeats) {
  TS_REQUIRE_CUDA_DEVICE();
  const std::vector<int64_t> sizes = {1, 771, 100003, 0, 5, 3000000};
  std::vector<std::vector<float>> host;
  double want = 0.0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    host.push_back(randn(sizes[k] + 1, 100 + static_cast<uint32_t>(k)));
    want += cpu::ref::sum_squares(host.back().data() + 1, sizes[k]);
  }
  for (bool bf : {false, true}) {
    SCOPED_TRACE(testing::Message() << "bf16=" << bf);
    std::vector<std::unique_ptr<DeviceArray<uint16_t>>> bufs16;
    std::vector<std::unique_ptr<DeviceArray<float>>> bufs32;
    std::vector<const float*> p32;
    std::vector<const bf16*> p16;
    double want_k = 0.0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      // Offset by one element: tensor starts need not be aligned.
      if (bf) {
        std::vector<uint16_t> h(host[k].size());
        std::vector<float> back(host[k].size());
        for (size_t i = 0; i < h.size(); ++i) {
          h[i] = f32_to_bf16(host[k][i]);
          back[i] = bf16_to_f32(h[i]);
        }
        want_k += cpu::ref::sum_squares(back.data() + 1, sizes[k]);
        bufs16.push_back(std::make_unique<DeviceArray<uint16_t>>(h));
        p16.push_back(reinterpret_cast<const bf16*>(bufs16.back()->get()) + 1);
      } else {
        bufs32.push_back(std::make_unique<DeviceArray<float>>(host[k]));
        p32.push_back(bufs32.back()->get() + 1);
      }
    }
    if (!bf) want_k = want;
    DeviceArray<double> ws(static_cast<size_t>(
        cuda::global_sum_squares_workspace(sizes.data(), static_cast<int>(sizes.size()))));
    DeviceArray<double> out(1);
    double got[2];
    for (int rep = 0; rep < 2; ++rep) {
      if (bf)
        cuda::global_sum_squares<bf16>(out.get(), p16.data(), sizes.data(),
                                       static_cast<int>(sizes.size()), ws.get(), nullptr);
      else
        cuda::global_sum_squares<float>(out.get(), p32.data(), sizes.data(),
                                        static_cast<int>(sizes.size()), ws.get(), nullptr);
      got[rep] = out.download()[0];
    }
    // Exact squares summed in double in another order: relative error ~1e-16 * log(n).
    EXPECT_NEAR(got[0], want_k, 1e-12 * want_k);
    EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(double)), 0) << "not deterministic";
  }
}

TYPED_TEST(CudaKernels, ScaleMatchesReferenceExactly) {
  TS_REQUIRE_CUDA_DEVICE();
  using E = TypeParam;
  for (int64_t n : kElementwiseSizes) {
    auto x = as_e<E>(randn(n, 111));
    Buf<E> d_x(x);
    cuda::scale<E>(d_x.get(), n, 0.37f, nullptr);
    cpu::ref::scale(x.data(), n, 0.37f);
    expect_bits_equal(d_x.download(), stored<E>(x), "scale");
  }
}

// n normal values (scale 10) with the rounding's special cases among them: infinities, NaNs
// (one with only a low payload bit), the smallest subnormal, -0, FLT_MAX (rounds to infinity),
// ties either way, a subnormal with only low bits set.
std::vector<float> bf16_test_values(size_t n, uint32_t seed) {
  auto x = randn(n, seed, 10.0f);
  const uint32_t special_bits[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                   0xff800001u, 0x00000001u, 0x80000000u, 0x7f7fffffu,
                                   0x3f808000u, 0x3f818000u, 0x0000ffffu};
  for (size_t i = 0; i < std::size(special_bits); ++i)
    std::memcpy(&x[10 * i + 3], &special_bits[i], 4);
  return x;
}

TEST(CudaKernelsConvert, F32ToBf16MatchesCoreBitForBit) {
  TS_REQUIRE_CUDA_DEVICE();
  for (int64_t offset : {0, 1}) {
    const auto x = bf16_test_values(100003 + offset, 121);
    DeviceArray<float> d_x(x);
    DeviceArray<uint16_t> d_h(x.size());
    const int64_t n = static_cast<int64_t>(x.size()) - offset;
    cuda::convert_f32_to_bf16(reinterpret_cast<bf16*>(d_h.get()) + offset, d_x.get() + offset, n,
                              nullptr);
    const auto h = d_h.download();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (h[offset + i] != f32_to_bf16(x[offset + i]) && ++bad <= 5)
        ADD_FAILURE() << "element " << i << ": got 0x" << std::hex << h[offset + i] << ", want 0x"
                      << f32_to_bf16(x[offset + i]);
    EXPECT_EQ(bad, 0);
    DeviceArray<float> d_back(x.size());
    cuda::convert_bf16_to_f32(d_back.get() + offset,
                              reinterpret_cast<const bf16*>(d_h.get()) + offset, n, nullptr);
    const auto back = d_back.download();
    for (int64_t i = 0; i < n; ++i) {
      const float want = bf16_to_f32(h[offset + i]);
      ASSERT_EQ(std::memcmp(&back[offset + i], &want, 4), 0) << "element " << i;
    }
  }
}

// round_to_bf16: x takes its bf16 value in place (core's rounding), keep its bits; also with no
// keep, and on a misaligned tail.
TEST(CudaKernelsConvert, RoundToBf16InPlaceMatchesCoreBitForBit) {
  TS_REQUIRE_CUDA_DEVICE();
  for (int64_t offset : {0, 1})
    for (bool with_keep : {true, false}) {
      const auto x = bf16_test_values(100003 + offset, 122);
      DeviceArray<float> d_x(x);
      DeviceArray<uint16_t> d_h(x.size());
      const int64_t n = static_cast<int64_t>(x.size()) - offset;
      cuda::round_to_bf16(d_x.get() + offset,
                          with_keep ? reinterpret_cast<bf16*>(d_h.get()) + offset : nullptr, n,
                          nullptr);
      const auto got = d_x.download();
      const auto h = d_h.download();
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = f32_to_bf16(x[offset + i]);
        const float wantf = bf16_to_f32(want);
        if ((std::memcmp(&got[offset + i], &wantf, 4) != 0 ||
             (with_keep && h[offset + i] != want)) &&
            ++bad <= 5)
          ADD_FAILURE() << "element " << i << " of " << (with_keep ? "kept" : "unkept");
      }
      EXPECT_EQ(bad, 0);
    }
}

// The trainer sizes the norm backward's workspace once, for its largest batch, and then runs
// smaller ones (the last batch of an epoch, evaluation): the size must never shrink as N grows.
// (It did: 512 rows needed 512 chunks, 513 rows only 257.) Host-only, runs without a GPU.
TEST(CudaKernelsArgs, NormBackwardWorkspaceCoversEverySmallerBatch) {
  for (int64_t C : {64, 768}) {
    int64_t prev = 0;
    for (int64_t N = 1; N <= 5000; ++N) {
      const int64_t w = cuda::norm_backward_workspace_floats(N, C);
      ASSERT_GE(w, prev) << "N=" << N << " C=" << C;
      ASSERT_GE(w, 2 * C) << "N=" << N;
      prev = w;
    }
  }
}

TEST(CudaKernelsArgs, BadArgumentsThrowNamingTheParameter) {
  // Host-side checks run before any device call, so they are tested without a GPU.
  EXPECT_THROW(cuda::layernorm_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                              1, 0, nullptr),
               Error);
  EXPECT_THROW(cuda::softmax_xent<float>(nullptr, nullptr, nullptr, 1, 10, 5, 1.0f, nullptr),
               Error);
  ops::AdamWArgs a;
  a.t = 0;
  float dummy = 0;
  EXPECT_THROW(cuda::adamw<float>(&dummy, nullptr, &dummy, &dummy, &dummy, 1, a, nullptr), Error);
  EXPECT_THROW(cuda::norm_backward_workspace_floats(-1, 4), Error);
  cuda::RopeTableView t;
  t.rotary_dim = 3;
  EXPECT_THROW(cuda::rope_forward<float>(&dummy, &dummy, t, nullptr, 0, 1, 1, 1, 4,
                                         cuda::RopeLayout::half, nullptr),
               Error);
}

}  // namespace
}  // namespace tessera
