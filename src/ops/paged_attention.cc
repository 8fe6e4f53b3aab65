// Paged attention op: argument checks, dispatch, and its cost (for the roofline report).
#include "ops/paged_attention.h"

#include "core/error.h"
#include "ops/backend.h"
#include "ops/observed.h"

namespace tessera::ops {

namespace {

void check_layout(const PagedKvLayout& a, const char* op) {
  TS_CHECK(a.Hkv > 0 && a.D > 0, "[", op, "] bad head shape Hkv=", a.Hkv, " D=", a.D);
  TS_CHECK(a.block_tokens > 0 && a.v_offset >= a.Hkv * a.block_tokens * a.D &&
               a.block_stride >= a.v_offset + a.Hkv * a.block_tokens * a.D,
           "[", op, "] bad cache layout (block_tokens ", a.block_tokens, ", v_offset ", a.v_offset,
           ", block_stride ", a.block_stride, ")");
  TS_CHECK(a.kv_type == DType::f32 || a.kv_type == DType::f16, "[", op,
           "] KV cache type must be f32 or f16, not ", dtype_name(a.kv_type));
}

// kv_append's checks: the layout, the shapes, and on the CPU every row's slot.
void check_append(const Context& ctx, const KvAppendArgs& a, const char* op) {
  check_layout(a, op);
  const int64_t KV = a.Hkv * a.D;
  TS_CHECK(a.rows >= 0 && a.ldk >= KV && a.ldv >= KV, "[", op, "] bad shape (rows ", a.rows,
           ", ldk ", a.ldk, ", ldv ", a.ldv, ", Hkv*D ", KV, ")");
  if (ctx.device == Device::cpu)
    for (int64_t r = 0; r < a.rows; ++r)
      TS_CHECK(a.slot[r] >= 0 && a.slot[r] < a.n_blocks * a.block_tokens, "[", op, "] row ", r,
               ": slot ", a.slot[r], " outside the cache's ", a.n_blocks * a.block_tokens);
}

}  // namespace

void paged_attention(const Context& ctx, const PagedAttentionArgs& a) {
  TS_CHECK(a.rows >= 0 && a.H > 0 && a.Hkv > 0 && a.H % a.Hkv == 0,
           "[attention] bad head shape H=", a.H, " Hkv=", a.Hkv);
  check_layout(a, "attention");
  TS_CHECK(a.table_stride > 0, "[attention] table_stride must be positive, got ", a.table_stride);
  const bool host = ctx.device == Device::cpu;
  if (host)
    for (int64_t r = 0; r < a.rows; ++r) {
      TS_CHECK(a.n_keys[r] >= 1 && a.n_keys[r] <= a.table_stride * a.block_tokens,
               "[attention] row ", r, " has ", a.n_keys[r], " keys (its table holds ",
               a.table_stride * a.block_tokens, ")");
      TS_CHECK(!a.first_key || (a.first_key[r] >= 0 && a.first_key[r] < a.n_keys[r]),
               "[attention] row ", r, ": first key ", a.first_key ? a.first_key[r] : 0,
               " outside [0, ", a.n_keys[r], ")");
      TS_CHECK(a.max_keys == 0 || a.n_keys[r] <= a.max_keys, "[attention] row ", r, " has ",
               a.n_keys[r], " keys, more than max_keys ", a.max_keys);
    }
  else
    TS_CHECK(a.max_keys > 0, "[attention] max_keys must be set on ", device_name(ctx.device));
  check_quantized_rows(ctx, a.q_out, a.rows, a.H * a.D, "attention");
  if (a.rows == 0) return;
  detail::observed(
      ctx, "paged_attention",
      [&] {
        return OpShape{"rows h hkv d", {a.rows, a.H, a.Hkv, a.D}, dtype_name(a.kv_type)};
      },
      [&] { return paged_attention_cost(a, host); },
      [&] { backend(ctx.device).paged_attention(ctx, a); });
}

int64_t paged_attention_plan_bytes(const Context& ctx, int64_t rows) {
  TS_CHECK(rows >= 0, "[attention] plan for ", rows, " rows");
  return backend(ctx.device).paged_attention_plan_bytes(rows);
}

int64_t plan_paged_attention(const Context& ctx, const PagedAttentionArgs& a, void* plan) {
  TS_CHECK(a.rows >= 0 && a.table_stride > 0 && a.n_keys && a.block_tables && plan,
           "[attention] a plan needs rows, the tables, n_keys and the plan's memory");
  return backend(ctx.device).plan_paged_attention(a, plan);
}

bool paged_keys_transposed(Device d) {
  return backend(d).paged_keys_transposed();
}

void kv_append(const Context& ctx, const KvAppendArgs& a) {
  check_append(ctx, a, "kv_append");
  const int64_t KV = a.Hkv * a.D;
  if (a.rows == 0) return;
  detail::observed(
      ctx, "kv_append",
      [&] {
        return OpShape{"rows hkv d", {a.rows, a.Hkv, a.D}, dtype_name(a.kv_type)};
      },
      [&] {
        const double n = static_cast<double>(a.rows * KV);
        return OpCost{0, 2 * n * (4 + dtype_bytes(a.kv_type, 1))};
      },
      [&] { backend(ctx.device).kv_append(ctx, a); });
}

void rope_kv_append(const Context& ctx, const RopeKvAppendArgs& a) {
  const char* op = "rope_kv_append";
  check_append(ctx, a, op);
  TS_CHECK(a.H > 0 && a.H % a.Hkv == 0 && a.ldq >= a.H * a.D, "[", op, "] bad query shape (H ", a.H,
           ", Hkv ", a.Hkv, ", ldq ", a.ldq, ", H*D ", a.H * a.D, ")");
  if (a.rope) {
    const int64_t R = a.rope->rotary_dim;
    TS_CHECK(R > 0 && R % 2 == 0 && R <= a.D, "[", op, "] rotary_dim=", R,
             " must be positive, even and at most D=", a.D);
    TS_CHECK(a.positions != nullptr, "[", op, "] a rotation needs the rows' positions");
    TS_CHECK(ctx.device == Device::cpu || a.rope->device != nullptr, "[", op,
             "] the rope table has no copy on ", device_name(ctx.device));
    if (ctx.device == Device::cpu)
      for (int64_t r = 0; r < a.rows; ++r)
        TS_CHECK(a.positions[r] >= 0 && a.positions[r] < a.rope->max_pos, "[", op, "] row ", r,
                 ": position ", a.positions[r], " outside the rope table's [0, ", a.rope->max_pos,
                 ")");
  }
  if (a.rows == 0) return;
  detail::observed(
      ctx, op,
      [&] {
        return OpShape{"rows h hkv d", {a.rows, a.H, a.Hkv, a.D}, dtype_name(a.kv_type)};
      },
      [&] {
        // q read and written, k and v read (f32) and written to the cache; 6 flops a rotated pair.
        const double rows = static_cast<double>(a.rows), D = static_cast<double>(a.D);
        const double pairs = a.rope ? rows * (a.H + a.Hkv) * (a.rope->rotary_dim / 2) : 0;
        return OpCost{6 * pairs,
                      rows * D * (8.0 * a.H + 2 * a.Hkv * (4 + dtype_bytes(a.kv_type, 1)))};
      },
      [&] { backend(ctx.device).rope_kv_append(ctx, a); });
}

OpCost paged_attention_cost(const PagedAttentionArgs& a, bool arrays_on_host) {
  OpCost c;
  for (int64_t r = 0; r < a.rows; ++r) {
    const double keys = arrays_on_host
                            ? static_cast<double>(a.n_keys[r] - (a.first_key ? a.first_key[r] : 0))
                            : static_cast<double>(a.max_keys);
    c.flops += 4.0 * keys * static_cast<double>(a.H * a.D);  // q.k and p.v, 2 flops each
    c.bytes += 2.0 * keys * static_cast<double>(a.Hkv * a.D) * dtype_bytes(a.kv_type, 1);
  }
  c.state_bytes = c.bytes;  // all of it the cache's keys and values
  return c;
}

}  // namespace tessera::ops
