// CUDA attention kernels (FlashAttention-2 forward/backward, paged decode) against float64 host
// references and the CPU reference kernels; host-only checks of the tiling and split math.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/paged_attention.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/attention.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace tessera {
namespace {

using cuda::AttnLayout;
using cuda::test::DeviceArray;
namespace ai = cuda::attn_index;

// ---- float64 host references (general: GQA, causal or not, any scale) ----

// q (B,T,Hq,D), k, v (B,T,Hkv,D) contiguous. out (B,T,Hq,D); lse (B,Hq,T); absw (B,T,Hq,D) is
// sum_j p_j |v_jd| / l, the size of the terms whose rounding the tolerance must cover.
struct FwdRef {
  std::vector<double> out, lse, absw, score_abs;  // score_abs (B,Hq,T): max_j scale*sum|q||k|
};
FwdRef ref_forward(const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                   int64_t D, double scale, bool causal) {
  FwdRef r;
  r.out.assign(static_cast<size_t>(B * T * Hq * D), 0.0);
  r.absw = r.out;
  r.lse.assign(static_cast<size_t>(B * Hq * T), 0.0);
  r.score_abs = r.lse;
  const int64_t group = Hq / Hkv;
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = &q[static_cast<size_t>(((b * T + i) * Hq + h) * D)];
        const int64_t n = causal ? i + 1 : T;
        double mx = -INFINITY, sabs = 0;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = &k[static_cast<size_t>(((b * T + j) * Hkv + h / group) * D)];
          double dot = 0, a = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += static_cast<double>(qi[d]) * kj[d];
            a += std::fabs(static_cast<double>(qi[d]) * kj[d]);
          }
          s[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, s[static_cast<size_t>(j)]);
          sabs = std::max(sabs, a * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        const size_t o = static_cast<size_t>(((b * T + i) * Hq + h) * D);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[static_cast<size_t>(j)] - mx) / sum;
          const float* vj = &v[static_cast<size_t>(((b * T + j) * Hkv + h / group) * D)];
          for (int64_t d = 0; d < D; ++d) {
            r.out[o + d] += p * vj[d];
            r.absw[o + d] += p * std::fabs(vj[d]);
          }
        }
        r.lse[static_cast<size_t>((b * Hq + h) * T + i)] = mx + std::log(sum);
        r.score_abs[static_cast<size_t>((b * Hq + h) * T + i)] = sabs;
      }
  return r;
}

// Gradients given the o and lse the kernel also receives; *_abs are the sums of |terms| of each
// gradient entry (sum_j |dS||k|, sum_i |dS||q|, sum_i p|dO|).
struct BwdRef {
  std::vector<double> dq, dk, dv, dq_abs, dk_abs, dv_abs;
};
BwdRef ref_backward(const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, const std::vector<float>& o,
                    const std::vector<float>& dout, const std::vector<float>& lse, int64_t B,
                    int64_t T, int64_t Hq, int64_t Hkv, int64_t D, double scale, bool causal) {
  BwdRef r;
  r.dq.assign(q.size(), 0.0);
  r.dq_abs = r.dq;
  r.dk.assign(k.size(), 0.0);
  r.dk_abs = r.dk;
  r.dv = r.dk;
  r.dv_abs = r.dk;
  const int64_t group = Hq / Hkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const size_t qi = static_cast<size_t>(((b * T + i) * Hq + h) * D);
        double di = 0;
        for (int64_t d = 0; d < D; ++d) di += static_cast<double>(dout[qi + d]) * o[qi + d];
        const double l = lse[static_cast<size_t>((b * Hq + h) * T + i)];
        const int64_t n = causal ? i + 1 : T;
        for (int64_t j = 0; j < n; ++j) {
          const size_t kj = static_cast<size_t>(((b * T + j) * Hkv + h / group) * D);
          double s = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            s += static_cast<double>(q[qi + d]) * k[kj + d];
            dp += static_cast<double>(dout[qi + d]) * v[kj + d];
          }
          const double p = std::exp(s * scale - l);
          const double ds = p * (dp - di) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi + d] += ds * k[kj + d];
            r.dq_abs[qi + d] += std::fabs(ds * k[kj + d]);
            r.dk[kj + d] += ds * q[qi + d];
            r.dk_abs[kj + d] += std::fabs(ds * q[qi + d]);
            r.dv[kj + d] += p * dout[qi + d];
            r.dv_abs[kj + d] += std::fabs(p * dout[qi + d]);
          }
        }
      }
  return r;
}

// Random values already representable in 16 bits (bf16 or f16), so host and device see the
// same inputs and only the accumulation differs.
std::vector<float> random_16bit(size_t n, float lo, float hi, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) {
    const float f = u(rng);
    e = t == DType::bf16 ? bf16_to_f32(f32_to_bf16(f)) : f16_to_f32(f32_to_f16(f));
  }
  return x;
}
std::vector<uint16_t> to_16bit(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    h[i] = t == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
  return h;
}
float from_16bit(uint16_t h, DType t) {
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
// Unit roundoff (half an ulp of 1) of the 16-bit type: bf16 keeps 8 significant bits (7 stored
// plus the implicit one), so 2^-8; f16 keeps 11, so 2^-11.
double unit_roundoff(DType t) {
  return t == DType::bf16 ? 0x1p-8 : 0x1p-11;
}

// ---- Host-only checks of the index math (these run without a GPU) ----

TEST(CudaAttentionIndex, CausalTileSkipAndMaskRulesMatchBruteForce) {
  for (const auto& [bm, bn] : {std::pair{64, 64}, std::pair{32, 64}, std::pair{64, 32}}) {
    for (int T : {1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 300}) {
      for (bool causal : {false, true}) {
        const int nq = ai::ceil_div(T, bm), nk = ai::ceil_div(T, bn);
        for (int qt = 0; qt < nq; ++qt) {
          int last_visible = -1;
          for (int kt = 0; kt < nk; ++kt) {
            bool any_visible = false, any_masked = false;
            for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row)
              for (int col = kt * bn; col < kt * bn + bn; ++col) {
                const bool visible = col < T && (!causal || col <= row);
                any_visible |= visible;
                any_masked |= !visible;
              }
            if (any_visible) last_visible = kt;
            if (kt < ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal)) {
              EXPECT_EQ(ai::tile_needs_mask(qt, kt, T, bm, bn, causal), any_masked)
                  << "T=" << T << " qt=" << qt << " kt=" << kt << " causal=" << causal;
            }
          }
          // Visible tiles form a prefix, and the kernel visits exactly that prefix.
          EXPECT_EQ(ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal), last_visible + 1)
              << "T=" << T << " qt=" << qt << " causal=" << causal;
        }
        for (int kt = 0; kt < nk; ++kt) {
          int first = nq;
          for (int qt = nq - 1; qt >= 0; --qt)
            for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row)
              for (int col = kt * bn; col < std::min(T, kt * bn + bn); ++col) {
                if (!causal || col <= row) first = qt;
              }
          // The backward starts at the first query tile that sees the K tile, skipping none.
          EXPECT_EQ(ai::first_q_tile_for_kv_tile(kt, bm, bn, causal), first)
              << "T=" << T << " kt=" << kt << " causal=" << causal;
        }
      }
    }
  }
}

TEST(CudaAttentionIndex, SwizzleIsAPermutationAndSpreadsLdmatrixRows) {
  for (int cols : {64, 128}) {
    for (int row = 0; row < 64; ++row) {
      std::vector<int> seen(static_cast<size_t>(cols), 0);
      for (int col = 0; col < cols; ++col) {
        const int off = ai::swizzle(row, col, cols);
        ASSERT_GE(off, row * cols);
        ASSERT_LT(off, row * cols + cols);
        ++seen[static_cast<size_t>(off - row * cols)];
        if (col % 8 != 0) {
          EXPECT_EQ(off, ai::swizzle(row, col - col % 8, cols) + col % 8);
        }
      }
      for (int c : seen) EXPECT_EQ(c, 1);
    }
    // The 8 rows of one ldmatrix 8x8 read (same logical chunk) hit 8 different 16-byte bank
    // groups of a 128-byte line.
    for (int r0 = 0; r0 < 64; r0 += 8)
      for (int chunk = 0; chunk < cols / 8; ++chunk) {
        std::vector<int> group(8, 0);
        for (int r = r0; r < r0 + 8; ++r)
          ++group[static_cast<size_t>((ai::swizzle(r, chunk * 8, cols) * 2 / 16) % 8)];
        for (int g : group) EXPECT_EQ(g, 1);
      }
  }
}

// The forward's tile loop (visited tiles, masks only where tile_needs_mask says, online
// softmax with rescaling) emulated in double must equal the direct softmax.
TEST(CudaAttentionIndex, TiledOnlineSoftmaxEmulationMatchesReference) {
  std::mt19937 rng(7);
  const int64_t D = 8, H = 1;
  for (int T : {1, 63, 64, 129, 300}) {
    for (bool causal : {false, true}) {
      const auto q = random_16bit(static_cast<size_t>(T * D), -3, 3, DType::bf16, rng);
      const auto k = random_16bit(q.size(), -1, 1, DType::bf16, rng);
      const auto v = random_16bit(q.size(), -1, 1, DType::bf16, rng);
      const double scale = 0.5;
      const FwdRef ref = ref_forward(q, k, v, 1, T, H, H, D, scale, causal);
      const int bm = ai::kFwdBlockM, bn = ai::kFwdBlockN;
      for (int qt = 0; qt < ai::ceil_div(T, bm); ++qt) {
        for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row) {
          double m = -INFINITY, l = 0;
          std::vector<double> acc(static_cast<size_t>(D), 0.0);
          for (int kt = 0; kt < ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal); ++kt) {
            const bool mask = ai::tile_needs_mask(qt, kt, T, bm, bn, causal);
            std::vector<double> s(static_cast<size_t>(bn));
            double mx = m;
            for (int c = 0; c < bn; ++c) {
              const int col = kt * bn + c;
              if (mask && (col >= T || (causal && col > row))) {
                s[static_cast<size_t>(c)] = -INFINITY;
                continue;
              }
              ASSERT_LT(col, T) << "an unmasked tile read past T";
              ASSERT_TRUE(!causal || col <= row) << "an unmasked tile saw the future";
              double dot = 0;
              for (int64_t d = 0; d < D; ++d)
                dot += double(q[size_t(row * D + d)]) * k[size_t(col * D + d)];
              s[static_cast<size_t>(c)] = dot;
              mx = std::max(mx, dot);
            }
            const double base = mx == -INFINITY ? 0 : mx;
            const double corr = std::exp((m - base) * scale);
            l *= corr;
            for (auto& a : acc) a *= corr;
            for (int c = 0; c < bn; ++c) {
              const double p = std::exp((s[static_cast<size_t>(c)] - base) * scale);
              if (p == 0) continue;
              l += p;
              for (int64_t d = 0; d < D; ++d)
                acc[size_t(d)] += p * v[size_t((kt * bn + c) * D + d)];
            }
            m = mx;
          }
          for (int64_t d = 0; d < D; ++d)
            EXPECT_NEAR(acc[size_t(d)] / l, ref.out[size_t(row * D + d)], 1e-12);
          EXPECT_NEAR(m * scale + std::log(l), ref.lse[size_t(row)], 1e-12);
        }
      }
    }
  }
}

// plan_paged_splits, the per-split softmax (log2 domain, normalised partials, -inf for empty
// splits) and the combine, emulated in double, must equal one softmax over all keys.
TEST(CudaAttentionIndex, PagedSplitCombineEmulationMatchesDirectSoftmax) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0, 2);
  for (int64_t max_keys : {1, 255, 256, 257, 1000, 4096, 32768}) {
    for (int64_t blocks : {1, 8, 64, 1024}) {
      const ai::SplitPlan plan = ai::plan_paged_splits(blocks, max_keys, 132, 64);
      ASSERT_GE(plan.splits, 1);
      ASSERT_LE(plan.splits, 64);
      ASSERT_GE(plan.splits * plan.keys_per_split, max_keys);
      ASSERT_LT((plan.splits - 1) * plan.keys_per_split, max_keys) << "empty trailing split";
      for (int64_t nk : {int64_t{1}, std::max<int64_t>(1, max_keys / 3), max_keys}) {
        std::vector<double> s(static_cast<size_t>(nk)), v(s.size());
        for (size_t j = 0; j < s.size(); ++j) {
          s[j] = nd(rng);
          v[j] = nd(rng);
        }
        double mx = -INFINITY, sum = 0, acc = 0;
        for (double x : s) mx = std::max(mx, x);
        for (size_t j = 0; j < s.size(); ++j) {
          sum += std::exp2(s[j] - mx);
          acc += std::exp2(s[j] - mx) * v[j];
        }
        std::vector<double> part_o, part_lse;
        for (int64_t sp = 0; sp < plan.splits; ++sp) {
          const int64_t start = sp * plan.keys_per_split;
          const int64_t end = std::min(nk, start + plan.keys_per_split);
          double m = -INFINITY, l = 0, a = 0;
          for (int64_t j = start; j < end; ++j) {  // online, as each lane group does
            const double m_new = std::max(m, s[size_t(j)]);
            const double corr = std::exp2(m - m_new), p = std::exp2(s[size_t(j)] - m_new);
            l = l * corr + p;
            a = a * corr + p * v[size_t(j)];
            m = m_new;
          }
          part_o.push_back(l > 0 ? a / l : 0);
          part_lse.push_back(l > 0 ? m + std::log2(l) : -INFINITY);
        }
        double lmax = -INFINITY;
        for (double x : part_lse) lmax = std::max(lmax, x);
        double w_sum = 0, o = 0;
        for (size_t sp = 0; sp < part_o.size(); ++sp) {
          if (part_lse[sp] == -INFINITY) continue;
          const double w = std::exp2(part_lse[sp] - lmax);
          w_sum += w;
          o += w * part_o[sp];
        }
        EXPECT_NEAR(o / w_sum, acc / sum, 1e-12) << "max_keys=" << max_keys << " nk=" << nk;
      }
    }
  }
  EXPECT_EQ(ai::decode_heads_per_block(4), 4);
  EXPECT_EQ(ai::decode_heads_per_block(16), 8);
  EXPECT_EQ(ai::decode_heads_per_block(6), 2);
  EXPECT_EQ(ai::decode_heads_per_block(7), 1);
}

// The float64 host references above agree with the CPU reference kernels on the case those
// cover (packed qkv, causal, MHA, scale 1/sqrt(D)).
TEST(CudaAttentionIndex, HostReferenceMatchesCpuReference) {
  std::mt19937 rng(3);
  const int64_t B = 2, T = 37, H = 3, D = 16, C = H * D;
  const auto qkv = random_16bit(static_cast<size_t>(B * T * 3 * C), -2, 2, DType::bf16, rng);
  const auto dout = random_16bit(static_cast<size_t>(B * T * C), -1, 1, DType::bf16, rng);
  std::vector<float> q(static_cast<size_t>(B * T * C)), k(q.size()), v(q.size());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      q[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + c)];
      k[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + C + c)];
      v[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + 2 * C + c)];
    }
  std::vector<float> out(q.size()), lse(static_cast<size_t>(B * H * T)), dqkv(qkv.size());
  cpu::ref::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
  const double scale = 1.0 / std::sqrt(double(D));
  const FwdRef fr = ref_forward(q, k, v, B, T, H, H, D, scale, true);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], fr.out[i], 1e-6);
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], fr.lse[i], 1e-5);
  cpu::ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T,
                               C, H);
  const BwdRef br = ref_backward(q, k, v, out, dout, lse, B, T, H, H, D, scale, true);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(dqkv[size_t(bt * 3 * C + c)], br.dq[size_t(bt * C + c)], 1e-5);
      EXPECT_NEAR(dqkv[size_t(bt * 3 * C + C + c)], br.dk[size_t(bt * C + c)], 1e-5);
      EXPECT_NEAR(dqkv[size_t(bt * 3 * C + 2 * C + c)], br.dv[size_t(bt * C + c)], 1e-5);
    }
}

// ---- GPU tests ----

struct AttnCase {
  int64_t B, T, Hq, Hkv, D;
  bool causal;
  DType dtype;
};

// Forward tolerance, per output entry: the kernel rounds P to 16 bits before P V (relative u
// per term, u the unit roundoff) and rounds O once more on output, so
// |err| <= u * sum_j p_j |v_j| / l + u * |o| (+ f32 accumulation, ~2^-24 per term, far below).
// We allow 2x on the first term and add 1e-6 for the f32 softmax sums.
// LSE: the f32 score dot products err by <= D * 2^-24 * scale * sum |q||k| and lse moves by at
// most the largest score error; logf/exp2f add a few f32 ulps of |lse|.
void run_forward_case(const AttnCase& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 131 + c.D + c.causal));
  const size_t nq = size_t(c.B * c.T * c.Hq * c.D), nk = size_t(c.B * c.T * c.Hkv * c.D);
  const auto q = random_16bit(nq, -3, 3, c.dtype, rng);
  const auto k = random_16bit(nk, -1, 1, c.dtype, rng);
  const auto v = random_16bit(nk, -1, 1, c.dtype, rng);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const FwdRef ref = ref_forward(q, k, v, c.B, c.T, c.Hq, c.Hkv, c.D, scale, c.causal);

  DeviceArray<uint16_t> dq(to_16bit(q, c.dtype)), dk(to_16bit(k, c.dtype)),
      dv(to_16bit(v, c.dtype)), dout(nq);
  DeviceArray<float> dlse(size_t(c.B * c.Hq * c.T));
  cuda::FlashForwardArgs a;
  a.shape = {c.B, c.T, c.Hq, c.Hkv, c.D, static_cast<float>(scale), c.causal, c.dtype};
  a.q = {dq.get(), cuda::contiguous_layout(c.T, c.Hq, c.D)};
  a.k = {dk.get(), cuda::contiguous_layout(c.T, c.Hkv, c.D)};
  a.v = {dv.get(), cuda::contiguous_layout(c.T, c.Hkv, c.D)};
  a.out = {dout.get(), cuda::contiguous_layout(c.T, c.Hq, c.D)};
  a.lse = dlse.get();
  cuda::flash_attention_forward(a, nullptr);
  const auto out = dout.download();
  const auto lse = dlse.download();

  const double u = unit_roundoff(c.dtype);
  int bad = 0;
  for (size_t i = 0; i < nq && bad < 10; ++i) {
    const double got = from_16bit(out[i], c.dtype);
    const double tol = 2 * u * ref.absw[i] + u * std::fabs(ref.out[i]) + 1e-6;
    if (!(std::fabs(got - ref.out[i]) <= tol)) {
      ++bad;
      ADD_FAILURE() << "out[" << i << "] = " << got << ", want " << ref.out[i] << " +- " << tol;
    }
  }
  for (size_t i = 0; i < lse.size() && bad < 20; ++i) {
    const double tol =
        double(c.D) * 0x1p-23 * ref.score_abs[i] + 4e-6 * (1 + std::fabs(ref.lse[i]));
    if (!(std::fabs(lse[i] - ref.lse[i]) <= tol)) {
      ++bad;
      ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", want " << ref.lse[i] << " +- " << tol;
    }
  }
}

class CudaFlashForward : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CudaFlashForward, MatchesFloat64Reference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_forward_case(GetParam());
}
std::vector<AttnCase> forward_cases() {
  std::vector<AttnCase> cases;
  for (int64_t D : {64, 128})
    for (int64_t T : {1, 63, 64, 129, 300})
      for (bool causal : {true, false}) cases.push_back({2, T, 8, 2, D, causal, DType::bf16});
  cases.push_back({1, 129, 4, 4, 128, true, DType::f16});
  cases.push_back({1, 77, 4, 1, 64, false, DType::f16});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "T" + std::to_string(c.T) + "_D" + std::to_string(c.D) +
                                  (c.causal ? "_causal" : "_full") + "_" +
                                  std::string(dtype_name(c.dtype));
                         });

// Backward tolerance, per gradient entry: the kernel rounds P (for dV) and dS (for dQ, dK) to
// 16 bits before the products (relative u per term) and rounds the result once, so
// |err| <= u * sum |terms| + u * |g|; we allow 2x on the first term, plus 1e-6 absolute for the
// f32 accumulations (dQ's atomics add the K tiles in any order).
void check_grad(const char* name, const std::vector<uint16_t>& got, const std::vector<double>& want,
                const std::vector<double>& abs_terms, DType t, int& bad) {
  const double u = unit_roundoff(t);
  for (size_t i = 0; i < want.size() && bad < 10; ++i) {
    const double g = from_16bit(got[i], t);
    const double tol = 2 * u * abs_terms[i] + u * std::fabs(want[i]) + 1e-6;
    if (!(std::fabs(g - want[i]) <= tol)) {
      ++bad;
      ADD_FAILURE() << name << "[" << i << "] = " << g << ", want " << want[i] << " +- " << tol;
    }
  }
}

void run_backward_case(const AttnCase& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.T * 17 + c.D + c.causal));
  const size_t nq = size_t(c.B * c.T * c.Hq * c.D), nk = size_t(c.B * c.T * c.Hkv * c.D);
  const auto q = random_16bit(nq, -3, 3, c.dtype, rng);
  const auto k = random_16bit(nk, -1, 1, c.dtype, rng);
  const auto v = random_16bit(nk, -1, 1, c.dtype, rng);
  const auto go = random_16bit(nq, -1, 1, c.dtype, rng);
  const double scale = 1.0 / std::sqrt(double(c.D));
  // O and LSE come from the host reference (rounded as the forward would store them), so this
  // test checks the backward alone.
  const FwdRef fr = ref_forward(q, k, v, c.B, c.T, c.Hq, c.Hkv, c.D, scale, c.causal);
  std::vector<float> o(nq), lse(fr.lse.size());
  for (size_t i = 0; i < nq; ++i)
    o[i] = from_16bit(to_16bit({float(fr.out[i])}, c.dtype)[0], c.dtype);
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = static_cast<float>(fr.lse[i]);
  const BwdRef ref = ref_backward(q, k, v, o, go, lse, c.B, c.T, c.Hq, c.Hkv, c.D, scale, c.causal);

  DeviceArray<uint16_t> dq_in(to_16bit(q, c.dtype)), dk_in(to_16bit(k, c.dtype)),
      dv_in(to_16bit(v, c.dtype)), d_o(to_16bit(o, c.dtype)), d_go(to_16bit(go, c.dtype));
  DeviceArray<float> d_lse(lse);
  DeviceArray<uint16_t> dq(nq), dk(nk), dv(nk);
  cuda::FlashBackwardArgs a;
  a.shape = {c.B, c.T, c.Hq, c.Hkv, c.D, static_cast<float>(scale), c.causal, c.dtype};
  const AttnLayout lq = cuda::contiguous_layout(c.T, c.Hq, c.D);
  const AttnLayout lk = cuda::contiguous_layout(c.T, c.Hkv, c.D);
  DeviceArray<unsigned char> ws(cuda::flash_attention_backward_workspace_bytes(a.shape));
  a.q = {dq_in.get(), lq};
  a.k = {dk_in.get(), lk};
  a.v = {dv_in.get(), lk};
  a.out = {d_o.get(), lq};
  a.dout = {d_go.get(), lq};
  a.lse = d_lse.get();
  a.dq = {dq.get(), lq};
  a.dk = {dk.get(), lk};
  a.dv = {dv.get(), lk};
  a.workspace = ws.get();
  cuda::flash_attention_backward(a, nullptr);
  int bad = 0;
  check_grad("dq", dq.download(), ref.dq, ref.dq_abs, c.dtype, bad);
  check_grad("dk", dk.download(), ref.dk, ref.dk_abs, c.dtype, bad);
  check_grad("dv", dv.download(), ref.dv, ref.dv_abs, c.dtype, bad);
}

class CudaFlashBackward : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CudaFlashBackward, MatchesFloat64Reference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_backward_case(GetParam());
}
std::vector<AttnCase> backward_cases() {
  std::vector<AttnCase> cases;
  for (int64_t D : {64, 128})
    for (int64_t T : {1, 63, 129, 300})
      for (bool causal : {true, false}) cases.push_back({2, T, 8, 2, D, causal, DType::bf16});
  cases.push_back({1, 100, 4, 4, 64, true, DType::f16});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashBackward, ::testing::ValuesIn(backward_cases()),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "T" + std::to_string(c.T) + "_D" + std::to_string(c.D) +
                                  (c.causal ? "_causal" : "_full") + "_" +
                                  std::string(dtype_name(c.dtype));
                         });

// Packed qkv (B,T,3,H,D) in and packed dqkv out, against the CPU reference kernels (causal,
// MHA, scale 1/sqrt(D)); tolerances as above, from the float64 reference's term sums.
TEST(CudaFlashAttention, PackedQkvMatchesCpuReference) {
  TS_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(5);
  const int64_t B = 2, T = 150, H = 4, D = 64, C = H * D;
  const DType t = DType::bf16;
  const auto qkv = random_16bit(size_t(B * T * 3 * C), -2, 2, t, rng);
  const auto go = random_16bit(size_t(B * T * C), -1, 1, t, rng);
  std::vector<float> out(size_t(B * T * C)), lse(size_t(B * H * T)), dqkv(qkv.size());
  cpu::ref::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
  std::vector<float> q(out.size()), k(out.size()), v(out.size());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) {
      q[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + c)];
      k[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + C + c)];
      v[size_t(bt * C + c)] = qkv[size_t(bt * 3 * C + 2 * C + c)];
    }
  const double scale = 1.0 / std::sqrt(double(D));
  const FwdRef fr = ref_forward(q, k, v, B, T, H, H, D, scale, true);

  DeviceArray<uint16_t> d_qkv(to_16bit(qkv, t)), d_out(out.size());
  DeviceArray<float> d_lse(lse.size());
  const auto* base = d_qkv.get();
  const AttnLayout packed = cuda::packed_qkv_layout(T, H, D);
  cuda::FlashForwardArgs fa;
  fa.shape = {B, T, H, H, D, static_cast<float>(scale), true, t};
  fa.q = {base, packed};
  fa.k = {base + C, packed};
  fa.v = {base + 2 * C, packed};
  fa.out = {d_out.get(), cuda::contiguous_layout(T, H, D)};
  fa.lse = d_lse.get();
  cuda::flash_attention_forward(fa, nullptr);
  const auto got_out = d_out.download();
  const auto got_lse = d_lse.download();
  const double u = unit_roundoff(t);
  int bad = 0;
  for (size_t i = 0; i < out.size() && bad < 10; ++i) {
    const double tol = 2 * u * fr.absw[i] + u * std::fabs(out[i]) + 1e-6;
    if (!(std::fabs(from_16bit(got_out[i], t) - out[i]) <= tol)) {
      ++bad;
      ADD_FAILURE() << "out[" << i << "] = " << from_16bit(got_out[i], t) << ", cpu " << out[i];
    }
  }
  for (size_t i = 0; i < lse.size(); ++i)
    EXPECT_NEAR(got_lse[i], lse[i], D * 0x1p-23 * fr.score_abs[i] + 4e-6 * (1 + std::fabs(lse[i])));

  // Backward from the CPU forward's O (rounded to bf16) and LSE.
  std::vector<float> o16(out.size());
  for (size_t i = 0; i < out.size(); ++i) o16[i] = bf16_to_f32(f32_to_bf16(out[i]));
  cpu::ref::attention_backward(dqkv.data(), go.data(), qkv.data(), o16.data(), lse.data(), B, T, C,
                               H);
  const BwdRef br = ref_backward(q, k, v, o16, go, lse, B, T, H, H, D, scale, true);
  DeviceArray<uint16_t> d_o(to_16bit(o16, t)), d_go(to_16bit(go, t)), d_dqkv(qkv.size());
  DeviceArray<float> d_lse_in(lse);
  cuda::FlashBackwardArgs ba;
  ba.shape = fa.shape;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.out = {d_o.get(), cuda::contiguous_layout(T, H, D)};
  ba.dout = {d_go.get(), cuda::contiguous_layout(T, H, D)};
  ba.lse = d_lse_in.get();
  ba.dq = {d_dqkv.get(), packed};
  ba.dk = {d_dqkv.get() + C, packed};
  ba.dv = {d_dqkv.get() + 2 * C, packed};
  DeviceArray<unsigned char> ws(cuda::flash_attention_backward_workspace_bytes(ba.shape));
  ba.workspace = ws.get();
  cuda::flash_attention_backward(ba, nullptr);
  const auto got = d_dqkv.download();
  const std::vector<double>* abs_terms[3] = {&br.dq_abs, &br.dk_abs, &br.dv_abs};
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int which = 0; which < 3; ++which)
      for (int64_t c = 0; c < C && bad < 20; ++c) {
        const size_t i = size_t(bt * 3 * C + which * C + c);
        const double tol =
            2 * u * (*abs_terms[which])[size_t(bt * C + c)] + u * std::fabs(dqkv[i]) + 2e-6;
        if (!(std::fabs(from_16bit(got[i], t) - dqkv[i]) <= tol)) {
          ++bad;
          ADD_FAILURE() << "dqkv[" << i << "] (part " << which << ") = " << from_16bit(got[i], t)
                        << ", cpu " << dqkv[i] << " +- " << tol;
        }
      }
}

TEST(CudaFlashAttention, RejectsBadArguments) {
  cuda::FlashForwardArgs a;
  a.shape = {1, 16, 4, 3, 64, 0.125f, true, DType::bf16};  // Hq not a multiple of Hkv
  EXPECT_THROW(cuda::flash_attention_forward(a, nullptr), Error);
  a.shape = {1, 16, 4, 2, 96, 0.125f, true, DType::bf16};  // unsupported head dim
  EXPECT_THROW(cuda::flash_attention_forward(a, nullptr), Error);
  // Paged decode: the argument checks run before any device access (the pointers are never
  // read), so a zero head count is named, not left to fail at launch.
  cuda::PagedDecodeArgs d;
  alignas(16) float dummy[4] = {};
  int32_t ids[1] = {};
  d.out = dummy, d.q = dummy, d.kv = dummy, d.block_tables = ids, d.n_keys = ids;
  d.rows = 1, d.H = 0, d.Hkv = 1, d.D = 64, d.block_tokens = 16, d.table_stride = 1;
  d.max_keys = 1;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "H=0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads H=0"), std::string::npos) << e.what();
  }
  // quantize_out must match the output's shape and take blocks of 32.
  d.H = 2, d.v_offset = 16 * 64, d.block_stride = 2 * 16 * 64;
  int8_t qbytes[4] = {};
  int32_t sums[1] = {};
  cuda::QuantizedActs qa;
  qa.q = qbytes, qa.d = dummy, qa.s = sums, qa.M = 1, qa.K = 64, qa.block = 32;
  d.quantize_out = &qa;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "quantize_out of the wrong width accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantize_out is for (1, 64)"), std::string::npos)
        << e.what();
  }
  qa.K = 128, qa.block = 256;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "quantize_out in blocks of 256 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks of 32"), std::string::npos) << e.what();
  }
}

// ---- Paged decode ----

struct PagedCase {
  DType kv_dtype;
  int64_t D, block_tokens;
  std::vector<int32_t> n_keys;
  bool workspace;
};

// Tolerance: cache values are the same on both sides (the reference reads them as f32), so
// only f32 accumulation differs: score errors ~D * 2^-24 * scale * sum|q||k| (~1e-5 here) move
// each weight by that relative amount, and the running sums over up to 32k keys (split into
// many short runs) add ~1e-6 relative; 1e-4 * max|v| covers both with margin while a wrong key,
// block or split would be off by O(max|v|).
void run_paged_case(const PagedCase& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.D + c.block_tokens + c.n_keys.size()));
  const int64_t rows = static_cast<int64_t>(c.n_keys.size()), H = 8, Hkv = 2, D = c.D;
  const int64_t bt = c.block_tokens;
  const int64_t max_keys = *std::max_element(c.n_keys.begin(), c.n_keys.end());
  const int64_t table_stride = (max_keys + bt - 1) / bt;
  int64_t total_blocks = 0;
  for (int32_t nk : c.n_keys) total_blocks += (nk + bt - 1) / bt;
  total_blocks += 5;  // unused blocks in between
  const int64_t half = Hkv * bt * D, block_stride = 2 * half;
  // Cache values rounded to the cache type; the host copy is f32 for the CPU reference.
  std::vector<float> kv_f = random_16bit(size_t(total_blocks * block_stride), -1, 1,
                                         c.kv_dtype == DType::f16 ? DType::f16 : DType::bf16, rng);
  std::vector<float> q(size_t(rows * H * D));
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto& x : q) x = u(rng);
  // Random block tables: a shuffled pool, each row takes what it needs. Rows with a shared
  // prefix (multi-token decode) are not needed for correctness: each row is independent.
  std::vector<int32_t> pool(static_cast<size_t>(total_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(size_t(rows * table_stride), -1);
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < (c.n_keys[size_t(r)] + bt - 1) / bt; ++b)
      tables[size_t(r * table_stride + b)] = pool[next++];
  // Rows that share a table (a small multi-token step): the last row reuses row 0's blocks.
  if (rows >= 2 && c.n_keys.back() <= c.n_keys[0])
    std::copy(tables.begin(), tables.begin() + table_stride, tables.end() - table_stride);

  std::vector<const int32_t*> table_ptrs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) table_ptrs[size_t(r)] = &tables[size_t(r * table_stride)];
  std::vector<float> want(q.size());
  cpu::PagedAttentionArgs ra;
  ra.out = want.data();
  ra.q = q.data();
  ra.rows = rows;
  ra.H = H;
  ra.Hkv = Hkv;
  ra.D = D;
  ra.kv = kv_f.data();
  ra.block_tokens = bt;
  ra.block_stride = block_stride;
  ra.v_offset = half;
  ra.block_tables = table_ptrs.data();
  ra.n_keys = c.n_keys.data();
  ra.scale = 1.0f / std::sqrt(float(D));
  cpu::ref::paged_attention(ra);

  std::unique_ptr<DeviceArray<float>> d_f32;
  std::unique_ptr<DeviceArray<uint16_t>> d_16;
  const void* kv_dev = nullptr;
  if (c.kv_dtype == DType::f32) {
    d_f32 = std::make_unique<DeviceArray<float>>(kv_f);
    kv_dev = d_f32->get();
  } else {
    d_16 = std::make_unique<DeviceArray<uint16_t>>(to_16bit(kv_f, c.kv_dtype));
    kv_dev = d_16->get();
  }
  DeviceArray<float> d_q(q), d_out(q.size());
  DeviceArray<int32_t> d_tables(tables), d_nk(c.n_keys);
  const int64_t ws_floats = c.workspace ? cuda::paged_decode_workspace_floats(rows, H, D, 64) : 0;
  DeviceArray<float> d_ws(size_t(std::max<int64_t>(ws_floats, 1)));
  cuda::PagedDecodeArgs a;
  a.out = d_out.get();
  a.q = d_q.get();
  a.rows = rows;
  a.H = H;
  a.Hkv = Hkv;
  a.D = D;
  a.kv = kv_dev;
  a.kv_dtype = c.kv_dtype;
  a.block_tokens = bt;
  a.block_stride = block_stride;
  a.v_offset = half;
  a.block_tables = d_tables.get();
  a.table_stride = table_stride;
  a.n_keys = d_nk.get();
  a.max_keys = max_keys;
  a.scale = ra.scale;
  a.workspace = c.workspace ? d_ws.get() : nullptr;
  a.workspace_floats = ws_floats;
  cuda::paged_decode_attention(a, nullptr);
  const auto got = d_out.download();
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 10; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-4)) {
      ++bad;
      ADD_FAILURE() << "out[" << i << "] (row " << i / size_t(H * D) << ") = " << got[i]
                    << ", want " << want[i];
    }
  }
  if (rows > cuda::kMatvecMaxRows) return;
  // Once more quantizing the output for a q4_0 product (split and unsplit paths): the same
  // output bits, and the workspace bytes and product matmul_wt gives from that output.
  const int64_t K = H * D, N = 24;
  std::vector<float> wf(size_t(N * K));
  for (auto& x : wf) x = u(rng);
  std::vector<uint8_t> wq(size_t(dtype_bytes(DType::q4_0, N * K)));
  from_f32(DType::q4_0, wf.data(), wq.data(), N * K);
  DeviceArray<uint8_t> d_w(wq);
  const size_t ws_bytes = cuda::matmul_wt_workspace_bytes(rows, K, DType::q4_0);
  DeviceArray<uint8_t> ws1(ws_bytes), ws2(ws_bytes);
  DeviceArray<float> y1(size_t(rows * N)), y2(size_t(rows * N)), d_out2(q.size());
  cuda::matmul_wt(y1.get(), N, d_out.get(), rows, K, d_w.get(), DType::q4_0, N, nullptr, ws1.get(),
                  ws_bytes, nullptr);
  const cuda::QuantizedActs qa =
      cuda::quantized_acts_view(ws2.get(), ws_bytes, rows, K, DType::q4_0);
  a.out = d_out2.get();
  a.quantize_out = &qa;
  cuda::paged_decode_attention(a, nullptr);
  cuda::matmul_wt_quantized(y2.get(), N, qa, d_w.get(), DType::q4_0, N, nullptr, nullptr);
  ASSERT_EQ(d_out2.download(), got) << "quantizing changed the output";
  ASSERT_EQ(ws2.download(), ws1.download()) << "quantized output differs from matmul_wt's";
  ASSERT_EQ(y2.download(), y1.download());
}

class CudaPagedDecode : public ::testing::TestWithParam<PagedCase> {};
TEST_P(CudaPagedDecode, MatchesCpuReference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_paged_case(GetParam());
}
std::vector<PagedCase> paged_cases() {
  std::vector<PagedCase> cases;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t D : {64, 128})
      for (bool ws : {false, true}) {
        // Contexts ending mid-block, a single key, and a long one that forces splits; the last
        // row shares row 0's blocks with one key fewer (a multi-token step).
        cases.push_back({t, D, 16, {1000, 1, 37, 517, 999}, ws});
        cases.push_back({t, D, 32, {5000, 4097, 33}, ws});
      }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Caches, CudaPagedDecode, ::testing::ValuesIn(paged_cases()),
                         [](const auto& info) {
                           const PagedCase& c = info.param;
                           return std::string(dtype_name(c.kv_dtype)) + "_D" + std::to_string(c.D) +
                                  "_bt" + std::to_string(c.block_tokens) +
                                  (c.workspace ? "_split" : "_nosplit");
                         });

}  // namespace
}  // namespace tessera
