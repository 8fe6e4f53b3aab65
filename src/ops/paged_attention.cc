// Paged attention op: argument checks, dispatch, and its cost (for the roofline report).
#include "ops/paged_attention.h"

#include "core/error.h"
#include "ops/backend.h"
#include "ops/observed.h"

namespace tessera::ops {

void paged_attention(const Context& ctx, const PagedAttentionArgs& a) {
  TS_CHECK(a.rows >= 0 && a.H > 0 && a.Hkv > 0 && a.D > 0 && a.H % a.Hkv == 0,
           "[attention] bad "
           "head shape H=",
           a.H, " Hkv=", a.Hkv, " D=", a.D);
  TS_CHECK(a.block_tokens > 0 && a.v_offset >= a.Hkv * a.block_tokens * a.D &&
               a.block_stride >= a.v_offset + a.Hkv * a.block_tokens * a.D,
           "[attention] bad cache layout (block_tokens ", a.block_tokens, ", v_offset ", a.v_offset,
           ", block_stride ", a.block_stride, ")");
  TS_CHECK(a.kv_type == DType::f32 || a.kv_type == DType::f16,
           "[attention] KV cache type must be f32 or f16, not ", dtype_name(a.kv_type));
  for (int64_t r = 0; r < a.rows; ++r) {
    TS_CHECK(a.n_keys[r] >= 1 && a.block_tables[r] != nullptr, "[attention] row ", r,
             " has no keys");
    TS_CHECK(!a.first_key || (a.first_key[r] >= 0 && a.first_key[r] < a.n_keys[r]),
             "[attention] row ", r, ": first key ", a.first_key ? a.first_key[r] : 0,
             " outside [0, ", a.n_keys[r], ")");
  }
  if (a.rows == 0) return;
  detail::observed(
      ctx, "paged_attention", [&] { return paged_attention_cost(a); },
      [&] { backend(ctx.device).paged_attention(ctx, a); });
}

OpCost paged_attention_cost(const PagedAttentionArgs& a) {
  OpCost c;
  for (int64_t r = 0; r < a.rows; ++r) {
    const double keys = static_cast<double>(a.n_keys[r] - (a.first_key ? a.first_key[r] : 0));
    c.flops += 4.0 * keys * static_cast<double>(a.H * a.D);  // q.k and p.v, 2 flops each
    c.bytes += 2.0 * keys * static_cast<double>(a.Hkv * a.D) * dtype_bytes(a.kv_type, 1);
  }
  return c;
}

}  // namespace tessera::ops
