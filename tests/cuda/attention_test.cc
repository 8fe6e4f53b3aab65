// CUDA FlashAttention-2 forward/backward against float64 host references and the CPU reference
// kernels; host-only checks of the tiling and split math (the paged decode kernel's tests are in
// paged_attention_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/wgmma.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace tessera {
namespace {

using cuda::AttnLayout;
using cuda::test::DeviceArray;
using cuda::test::random_16bit;
using cuda::test::to_16bit;
namespace ai = cuda::attn_index;

// ---- float64 host references (general: GQA, causal or not, sliding windows, any scale) ----

// q (B,T,Hq,D), k, v (B,T,Hkv,D) contiguous. out (B,T,Hq,D); lse (B,Hq,T); absw (B,T,Hq,D) is
// sum_j p_j |v_jd| / l, the size of the terms whose rounding the tolerance must cover.
struct FwdRef {
  std::vector<double> out, lse, absw, score_abs;  // score_abs (B,Hq,T): max_j scale*sum|q||k|
};
FwdRef ref_forward(const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                   int64_t D, double scale, bool causal, int64_t window = 0) {
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
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i + 1 - window) : 0;
        double mx = -INFINITY, sabs = 0;
        for (int64_t j = j0; j < n; ++j) {
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
        for (int64_t j = j0; j < n; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        const size_t o = static_cast<size_t>(((b * T + i) * Hq + h) * D);
        for (int64_t j = j0; j < n; ++j) {
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

float from_16bit(uint16_t h, DType t) {
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}
// Unit roundoff (half an ulp of 1) of the 16-bit type: bf16 keeps 8 significant bits (7 stored
// plus the implicit one), so 2^-8; f16 keeps 11, so 2^-11.
double unit_roundoff(DType t) {
  return t == DType::bf16 ? 0x1p-8 : 0x1p-11;
}

// ---- Host-only checks of the index math (these run without a GPU) ----

// The tile rules, causal or not, and with sliding windows (causal only): 1 key, under a tile,
// not a multiple of any tile, a tile, and more than T.
TEST(CudaAttentionIndex, CausalTileSkipAndMaskRulesMatchBruteForce) {
  // mma.sync forward 64 x 64 and backward 32 x 64; wgmma forward 128 x 128, backward 64 x 128.
  for (const auto& [bm, bn] : {std::pair{64, 64}, std::pair{32, 64}, std::pair{64, 32},
                               std::pair{128, 128}, std::pair{64, 128}}) {
    for (int T : {1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 300}) {
      for (const auto& [causal, W] :
           {std::pair{false, 0}, std::pair{true, 0}, std::pair{true, 1}, std::pair{true, 5},
            std::pair{true, 64}, std::pair{true, 100}, std::pair{true, 400}}) {
        const int nq = ai::ceil_div(T, bm), nk = ai::ceil_div(T, bn);
        for (int qt = 0; qt < nq; ++qt) {
          int first_visible = nk, last_visible = -1;
          const int begin = ai::first_kv_tile_for_q_tile(qt, bm, bn, W);
          for (int kt = 0; kt < nk; ++kt) {
            bool any_visible = false, any_masked = false;
            for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row)
              for (int col = kt * bn; col < kt * bn + bn; ++col) {
                const bool visible = col < T && ai::key_visible(row, col, causal, W);
                EXPECT_EQ(visible, col < T && (!causal || col <= row) && (W == 0 || col > row - W));
                any_visible |= visible;
                any_masked |= !visible;
              }
            if (any_visible) first_visible = std::min(first_visible, kt), last_visible = kt;
            if (kt >= begin && kt < ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal)) {
              EXPECT_EQ(ai::tile_needs_mask(qt, kt, T, bm, bn, causal, W), any_masked)
                  << "T=" << T << " qt=" << qt << " kt=" << kt << " causal=" << causal
                  << " W=" << W;
            }
          }
          // Visible tiles form a range, and the kernel visits exactly that range.
          EXPECT_EQ(begin, first_visible) << "T=" << T << " qt=" << qt << " W=" << W;
          EXPECT_EQ(ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal), last_visible + 1)
              << "T=" << T << " qt=" << qt << " causal=" << causal;
        }
        for (int kt = 0; kt < nk; ++kt) {
          int first = nq, last = -1;
          for (int qt = nq - 1; qt >= 0; --qt)
            for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row)
              for (int col = kt * bn; col < std::min(T, kt * bn + bn); ++col) {
                if (ai::key_visible(row, col, causal, W)) first = qt, last = std::max(last, qt);
              }
          // The backward visits the query tiles that see the K tile, skipping none.
          EXPECT_EQ(ai::first_q_tile_for_kv_tile(kt, bm, bn, causal), first)
              << "T=" << T << " kt=" << kt << " causal=" << causal;
          EXPECT_EQ(ai::end_q_tile_for_kv_tile(kt, T, bm, bn, W), last + 1)
              << "T=" << T << " kt=" << kt << " W=" << W;
        }
      }
    }
  }
}

// A backward block walks every (query head of its group, query tile from the first that sees its
// keys) pair exactly once, head-major.
TEST(CudaAttentionIndex, BackwardStepsCoverEachHeadAndTileOnce) {
  for (const auto& [bm, bn] : {std::pair{32, 64}, std::pair{64, 128}}) {
    for (int T : {1, 63, 64, 65, 129, 300}) {
      for (const auto& [causal, W] :
           {std::pair{false, 0}, std::pair{true, 0}, std::pair{true, 5}, std::pair{true, 100}}) {
        for (int group : {1, 4}) {
          const int hk = 2;
          for (int kt = 0; kt < ai::ceil_div(T, bn); ++kt) {
            const ai::BwdSteps st(kt, T, bm, bn, causal, W, hk, group);
            const int first = ai::first_q_tile_for_kv_tile(kt, bm, bn, causal);
            const int nq = ai::end_q_tile_for_kv_tile(kt, T, bm, bn, W);
            ASSERT_EQ(st.count, group * (nq - first)) << "T=" << T << " kt=" << kt;
            std::vector<int> seen(static_cast<size_t>(group * nq), 0);
            for (int s = 0; s < st.count; ++s) {
              const int h = st.head(s), q0 = st.q0(s, bm);
              ASSERT_GE(h, hk * group);
              ASSERT_LT(h, (hk + 1) * group);
              ASSERT_EQ(q0 % bm, 0);
              ASSERT_GE(q0 / bm, first);
              ASSERT_LT(q0, T);
              ++seen[static_cast<size_t>((h - hk * group) * nq + q0 / bm)];
              if (s > 0) {
                EXPECT_GE(h, st.head(s - 1)) << "head-major";
              }
            }
            for (int h = 0; h < group; ++h)
              for (int qt = first; qt < nq; ++qt)
                EXPECT_EQ(seen[static_cast<size_t>(h * nq + qt)], 1)
                    << "T=" << T << " kt=" << kt << " head " << h << " tile " << qt;
          }
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
    for (const auto& [causal, W] : {std::pair{false, 0}, std::pair{true, 0}, std::pair{true, 70}}) {
      const auto q = random_16bit(static_cast<size_t>(T * D), -3, 3, DType::bf16, rng);
      const auto k = random_16bit(q.size(), -1, 1, DType::bf16, rng);
      const auto v = random_16bit(q.size(), -1, 1, DType::bf16, rng);
      const double scale = 0.5;
      const FwdRef ref = ref_forward(q, k, v, 1, T, H, H, D, scale, causal, W);
      const int bm = ai::kFwdBlockM, bn = ai::kFwdBlockN;
      for (int qt = 0; qt < ai::ceil_div(T, bm); ++qt) {
        for (int row = qt * bm; row < std::min(T, qt * bm + bm); ++row) {
          double m = -INFINITY, l = 0;
          std::vector<double> acc(static_cast<size_t>(D), 0.0);
          for (int kt = ai::first_kv_tile_for_q_tile(qt, bm, bn, W);
               kt < ai::kv_tiles_for_q_tile(qt, T, bm, bn, causal); ++kt) {
            const bool mask = ai::tile_needs_mask(qt, kt, T, bm, bn, causal, W);
            std::vector<double> s(static_cast<size_t>(bn));
            double mx = m;
            for (int c = 0; c < bn; ++c) {
              const int col = kt * bn + c;
              if (mask && (col >= T || !ai::key_visible(row, col, causal, W))) {
                s[static_cast<size_t>(c)] = -INFINITY;
                continue;
              }
              ASSERT_LT(col, T) << "an unmasked tile read past T";
              ASSERT_TRUE(!causal || col <= row) << "an unmasked tile saw the future";
              ASSERT_TRUE(W == 0 || col > row - W) << "an unmasked tile saw past the window";
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
  cpu::ref::attention_forward(out.data(), lse.data(), qkv.data(),
                              ops::AttentionArgs{B, T, C, H, H});
  const double scale = 1.0 / std::sqrt(double(D));
  const FwdRef fr = ref_forward(q, k, v, B, T, H, H, D, scale, true);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], fr.out[i], 1e-6);
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], fr.lse[i], 1e-5);
  cpu::ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                               ops::AttentionArgs{B, T, C, H, H});
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

std::string attn_case_name(const AttnCase& c) {
  return "T" + std::to_string(c.T) + "_D" + std::to_string(c.D) + (c.causal ? "_causal" : "_full") +
         "_" + std::string(dtype_name(c.dtype));
}
// gtest (and so the ctest names) would print the struct's bytes, padding included.
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "B" << c.B << "_Hq" << c.Hq << "_Hkv" << c.Hkv << "_" << attn_case_name(c);
}

// Forward tolerance, per output entry: the kernel rounds P to 16 bits before P V (relative u
// per term, u the unit roundoff) and rounds O once more on output, so
// |err| <= u * sum_j p_j |v_j| / l + u * |o| (+ f32 accumulation, ~2^-24 per term, far below).
// We allow 2x on the first term and add 1e-6 for the f32 softmax sums.
// LSE: the f32 score dot products err by <= D * 2^-24 * scale * sum |q||k| and lse moves by at
// most the largest score error; logf/exp2f add a few f32 ulps of |lse|.
void run_forward_case(const AttnCase& c, cuda::FlashKernel kernel) {
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
  a.kernel = kernel;
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

// Skips (with the reason) where the sm_90a wgmma kernel cannot run.
#define TS_REQUIRE_WGMMA()                                                                  \
  do {                                                                                      \
    TS_REQUIRE_CUDA_DEVICE();                                                               \
    if (!cuda::flash_wgmma_available())                                                     \
      GTEST_SKIP() << "the wgmma kernels need sm_90a code on a compute capability 9.0 GPU"; \
  } while (0)

class CudaFlashForward : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CudaFlashForward, MatchesFloat64Reference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_forward_case(GetParam(), cuda::FlashKernel::mma_sync);
}
// The Hopper kernel (128 x 128 tiles, two warpgroups): same arithmetic, same tolerance.
TEST_P(CudaFlashForward, WgmmaMatchesFloat64Reference) {
  TS_REQUIRE_WGMMA();
  run_forward_case(GetParam(), cuda::FlashKernel::wgmma);
}
std::vector<AttnCase> forward_cases() {
  std::vector<AttnCase> cases;
  // Lengths around both kernels' tiles (64 and 128 rows / keys).
  for (int64_t D : {64, 128})
    for (int64_t T : {1, 63, 64, 129, 256, 300})
      for (bool causal : {true, false}) cases.push_back({2, T, 8, 2, D, causal, DType::bf16});
  cases.push_back({1, 129, 4, 4, 128, true, DType::f16});
  cases.push_back({1, 77, 4, 1, 64, false, DType::f16});
  cases.push_back({1, 1000, 2, 1, 128, true, DType::bf16});  // many K tiles per query tile
  cases.push_back({1, 383, 2, 2, 64, true, DType::f16});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return attn_case_name(info.param); });

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

void run_backward_case(const AttnCase& c, cuda::FlashKernel kernel) {
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
  a.kernel = kernel;
  cuda::flash_attention_backward(a, nullptr);
  int bad = 0;
  check_grad("dq", dq.download(), ref.dq, ref.dq_abs, c.dtype, bad);
  check_grad("dk", dk.download(), ref.dk, ref.dk_abs, c.dtype, bad);
  check_grad("dv", dv.download(), ref.dv, ref.dv_abs, c.dtype, bad);
}

class CudaFlashBackward : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CudaFlashBackward, MatchesFloat64Reference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_backward_case(GetParam(), cuda::FlashKernel::mma_sync);
}
// The Hopper main pass (128-key blocks, 64-query steps, two warpgroups): same tolerance.
TEST_P(CudaFlashBackward, WgmmaMatchesFloat64Reference) {
  TS_REQUIRE_WGMMA();
  run_backward_case(GetParam(), cuda::FlashKernel::wgmma);
}
std::vector<AttnCase> backward_cases() {
  std::vector<AttnCase> cases;
  // Lengths around both kernels' tiles (keys 64 / 128, queries 32 / 64).
  for (int64_t D : {64, 128})
    for (int64_t T : {1, 63, 129, 256, 300})
      for (bool causal : {true, false}) cases.push_back({2, T, 8, 2, D, causal, DType::bf16});
  cases.push_back({1, 100, 4, 4, 64, true, DType::f16});
  cases.push_back({1, 383, 4, 1, 128, true, DType::f16});  // GQA group of 4, several key tiles
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashBackward, ::testing::ValuesIn(backward_cases()),
                         [](const auto& info) { return attn_case_name(info.param); });

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
  cpu::ref::attention_forward(out.data(), lse.data(), qkv.data(),
                              ops::AttentionArgs{B, T, C, H, H});
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
  const double u = unit_roundoff(t);
  int bad = 0;
  for (cuda::FlashKernel kernel : {cuda::FlashKernel::mma_sync, cuda::FlashKernel::wgmma}) {
    if (kernel == cuda::FlashKernel::wgmma && !cuda::flash_wgmma_available()) {
      std::printf("[ info ] packed qkv: no wgmma forward on this GPU, mma.sync only\n");
      continue;
    }
    SCOPED_TRACE(cuda::flash_kernel_name(kernel));
    fa.kernel = kernel;
    cuda::flash_attention_forward(fa, nullptr);
    const auto got_out = d_out.download();
    const auto got_lse = d_lse.download();
    for (size_t i = 0; i < out.size() && bad < 10; ++i) {
      const double tol = 2 * u * fr.absw[i] + u * std::fabs(out[i]) + 1e-6;
      if (!(std::fabs(from_16bit(got_out[i], t) - out[i]) <= tol)) {
        ++bad;
        ADD_FAILURE() << "out[" << i << "] = " << from_16bit(got_out[i], t) << ", cpu " << out[i];
      }
    }
    for (size_t i = 0; i < lse.size(); ++i)
      EXPECT_NEAR(got_lse[i], lse[i],
                  D * 0x1p-23 * fr.score_abs[i] + 4e-6 * (1 + std::fabs(lse[i])));
  }

  // Backward from the CPU forward's O (rounded to bf16) and LSE.
  std::vector<float> o16(out.size());
  for (size_t i = 0; i < out.size(); ++i) o16[i] = bf16_to_f32(f32_to_bf16(out[i]));
  cpu::ref::attention_backward(dqkv.data(), go.data(), qkv.data(), o16.data(), lse.data(),
                               ops::AttentionArgs{B, T, C, H, H});
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
  const std::vector<double>* abs_terms[3] = {&br.dq_abs, &br.dk_abs, &br.dv_abs};
  for (cuda::FlashKernel kernel : {cuda::FlashKernel::mma_sync, cuda::FlashKernel::wgmma}) {
    if (kernel == cuda::FlashKernel::wgmma && !cuda::flash_wgmma_available()) continue;
    SCOPED_TRACE(cuda::flash_kernel_name(kernel));
    ba.kernel = kernel;
    cuda::flash_attention_backward(ba, nullptr);
    const auto got = d_dqkv.download();
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
}

// The 128-byte swizzle the wgmma kernel stores its tiles in: within each 1024-byte group of 8
// rows every 16-byte chunk lands once, a row's chunks stay in the row, and chunk 0 of row r
// moves to chunk r % 8 (the pattern wgmma decodes from address bits 4-6 ^ 7-9).
TEST(WgmmaLayout, Sw128OffsetsPermuteChunksInsideEachRow) {
  for (int group = 0; group < 4; ++group) {
    std::vector<int> seen(64, 0);
    for (int r = group * 8; r < group * 8 + 8; ++r)
      for (int c = 0; c < 8; ++c) {
        const uint32_t off = cuda::wgmma::sw128_offset(r, c);
        ASSERT_EQ(off % 16, 0u);
        ASSERT_EQ(off / 128, static_cast<uint32_t>(r)) << "row " << r << " chunk " << c;
        const uint32_t in_group = off - group * 1024;
        ASSERT_LT(in_group, 1024u);
        ++seen[in_group / 16];
        // Address bits 4-6 hold the logical chunk XOR bits 7-9 (the row within the group).
        EXPECT_EQ((off >> 4) & 7, static_cast<uint32_t>(c ^ ((off >> 7) & 7)));
      }
    for (int i = 0; i < 64; ++i) EXPECT_EQ(seen[i], 1) << "group " << group << " slot " << i;
  }
}

// Descriptor fields (PTX ISA "matrix descriptor"): start address, leading and stride byte
// offsets in 16-byte units, swizzle mode 1 (128 bytes) in bits 62-63, base offset 0.
TEST(WgmmaLayout, DescriptorPacksItsFields) {
  const uint64_t d = cuda::wgmma::sw128_desc(0x12340, 16384, 1024);
  EXPECT_EQ(d & 0x3FFF, 0x1234u);
  EXPECT_EQ((d >> 16) & 0x3FFF, 16384u / 16);
  EXPECT_EQ((d >> 32) & 0x3FFF, 1024u / 16);
  EXPECT_EQ((d >> 49) & 7, 0u);
  EXPECT_EQ(d >> 62, 1u);
  EXPECT_EQ(d & ((uint64_t{3} << 14) | (uint64_t{3} << 30) | (uint64_t{7} << 46)), 0u)
      << "reserved bits stay clear";
  // The largest shared address of a block (227 KiB) still fits the 14-bit start field.
  EXPECT_EQ(cuda::wgmma::sw128_desc(227 * 1024 - 16, 16, 1024) & 0x3FFF, (227u * 1024 - 16) / 16);
}

TEST(CudaFlashAttention, ForwardKernelEnvironmentValues) {
  using K = cuda::FlashKernel;
  EXPECT_EQ(cuda::parse_flash_kernel_env("TESSERA_CUDA_FLASH_FWD", nullptr), K::mma_sync);
  EXPECT_EQ(cuda::parse_flash_kernel_env("TESSERA_CUDA_FLASH_FWD", "mma"), K::mma_sync);
  EXPECT_EQ(cuda::parse_flash_kernel_env("TESSERA_CUDA_FLASH_FWD", "wgmma"), K::wgmma);
  EXPECT_EQ(cuda::parse_flash_kernel_env("TESSERA_CUDA_FLASH_FWD", "auto"), K::automatic);
  for (const char* bad : {"", "WGMMA", "1", "mma "}) {
    try {
      cuda::parse_flash_kernel_env("TESSERA_CUDA_FLASH_BWD", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TESSERA_CUDA_FLASH_BWD"), std::string::npos)
          << e.what();
    }
  }
}

TEST(CudaFlashAttention, ExplicitMmaKernelNeedsNoProbe) {
  EXPECT_EQ(cuda::resolve_flash_kernel(cuda::FlashKernel::mma_sync, cuda::FlashPass::forward),
            cuda::FlashKernel::mma_sync);
  EXPECT_STREQ(cuda::flash_kernel_name(cuda::FlashKernel::wgmma), "wgmma");
}

TEST(CudaFlashAttention, RejectsBadArguments) {
  cuda::FlashForwardArgs a;
  a.shape = {1, 16, 4, 3, 64, 0.125f, true, DType::bf16};  // Hq not a multiple of Hkv
  EXPECT_THROW(cuda::flash_attention_forward(a, nullptr), Error);
  a.shape = {1, 16, 4, 2, 96, 0.125f, true, DType::bf16};  // unsupported head dim
  EXPECT_THROW(cuda::flash_attention_forward(a, nullptr), Error);
}

}  // namespace
}  // namespace tessera
