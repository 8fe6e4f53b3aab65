// CUDA attention: FlashAttention-2 forward/backward (bf16/f16, tensor cores), decode and prompt
// (tensor-core) attention over the paged KV cache, plus the pure index math the kernels share
// with host-side tests.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/quant_matvec.h"
#include "core/dtype.h"

namespace tessera::cuda {

// Strides (in elements) of a (B, T, H, D) tensor whose last dimension is contiguous: element
// (b, t, h, d) sits at data[b * batch + t * token + h * head + d]. A packed qkv (B,T,3,H,D)
// buffer gives q, k, v views with token = 3*H*D and base pointers H*D elements apart.
struct AttnLayout {
  int64_t batch = 0, token = 0, head = 0;
};
// Layout of a contiguous (B, T, H, D) tensor.
inline AttnLayout contiguous_layout(int64_t T, int64_t H, int64_t D) {
  return AttnLayout{T * H * D, H * D, D};
}
// Layout of each of q, k, v inside a packed (B, T, 3, H, D) tensor (add which*H*D to the base).
inline AttnLayout packed_qkv_layout(int64_t T, int64_t H, int64_t D) {
  return AttnLayout{T * 3 * H * D, 3 * H * D, D};
}

struct AttnInput {
  const void* data = nullptr;
  AttnLayout layout;
};
struct AttnOutput {
  void* data = nullptr;
  AttnLayout layout;
};

// Self-attention shape: q (B,T,Hq,D); k, v (B,T,Hkv,D); query head h reads kv head
// h / (Hq/Hkv). D is 64 or 128. Causal: query t sees keys 0..t; with a window W > 0 (causal
// only) keys t-W+1..t, and key tiles wholly before a query tile's window are neither loaded nor
// scored (nor, in backward, query tiles wholly past a key tile's). Every pointer is device memory,
// 16-byte aligned, and every stride a multiple of 8 elements (cp.async moves 16-byte chunks).
struct FlashAttentionShape {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 1.0f;  // usually 1/sqrt(D)
  bool causal = true;
  DType dtype = DType::bf16;  // bf16 or f16: q, k, v, out, and all gradients
  int64_t window = 0;         // 0: none (as ops::AttentionArgs::window)
};

// Which FlashAttention kernel runs. mma_sync: mma.sync tiles (forward 64 x 64 with four warps,
// backward 64 keys x 32 queries), any sm_80+ GPU. wgmma: Hopper's wgmma.mma_async with two
// warpgroups (forward 128 x 128 tiles; backward 128 keys x 64 queries), sm_90a code on a compute
// capability 9.0 GPU. automatic: the environment's TESSERA_CUDA_FLASH_FWD (forward) or
// TESSERA_CUDA_FLASH_BWD (backward): mma, the default; wgmma; auto = wgmma where available;
// read once per process.
enum class FlashKernel : uint8_t { automatic, mma_sync, wgmma };
enum class FlashPass : uint8_t { forward, backward };
const char* flash_kernel_name(FlashKernel k);
// Whether the wgmma kernels can run on the current device: compute capability 9.0 and a build
// holding sm_90a code (asked of the code itself, once per device).
bool flash_wgmma_available();
// An environment value (null: unset) as a kernel: mma (or unset) -> mma_sync, wgmma, auto ->
// automatic; anything else throws naming `variable`.
FlashKernel parse_flash_kernel_env(const char* variable, const char* value);
// The kernel a call with `k` runs on the current device (throws on a bad environment value, or
// when wgmma is asked for where it cannot run).
FlashKernel resolve_flash_kernel(FlashKernel k, FlashPass pass);

// Elements cross this API as raw 16-bit patterns (bf16 or f16 per FlashAttentionShape::dtype).
struct FlashForwardArgs {
  FlashAttentionShape shape;
  AttnInput q, k, v;
  AttnOutput out;        // (B,T,Hq,D)
  float* lse = nullptr;  // (B,Hq,T) natural-log log-sum-exp of the scaled scores
  FlashKernel kernel = FlashKernel::automatic;
};
void flash_attention_forward(const FlashForwardArgs& a, cudaStream_t stream);

// dq (B,T,Hq,D), dk and dv (B,T,Hkv,D) are overwritten. dQ is accumulated with f32 atomics into
// an f32 workspace (one K tile per thread block, all query tiles) and converted in a last pass;
// dK/dV stay in registers per K tile and sum the query heads of a GQA group inside the block.
struct FlashBackwardArgs {
  FlashAttentionShape shape;
  AttnInput q, k, v, out, dout;
  const float* lse = nullptr;  // (B,Hq,T) from the forward
  AttnOutput dq, dk, dv;
  void* workspace = nullptr;  // flash_attention_backward_workspace_bytes(shape) bytes, device
  FlashKernel kernel = FlashKernel::automatic;
};
size_t flash_attention_backward_workspace_bytes(const FlashAttentionShape& s);
void flash_attention_backward(const FlashBackwardArgs& a, cudaStream_t stream);

// A tile of consecutive query rows that share one block table (row0's): one sequence's prompt
// tokens, say. Row r of the tile is query row row0 + r, for r < rows <= 64; min_keys and max_keys
// bound the tile's n_keys, min_first and max_first its first keys (sliding windows; else 0).
struct PagedPrefillTile {
  int32_t row0 = 0, rows = 0, min_keys = 0, max_keys = 0, min_first = 0, max_first = 0;
};

// Decode attention over the paged cache, the device form of ops::PagedAttentionArgs: block b's
// keys start at kv + b * block_stride (elements of kv_dtype: f32, f16 or bf16) as
// (Hkv, block_tokens, D), values v_offset elements later in the same layout. Query row r reads
// keys 0 .. n_keys[r]-1 through block_tables[r * table_stride + j / block_tokens]. q and out are
// f32 (rows, H, D). D is 64 or 128. block_tables and n_keys are device arrays; every n_keys[r]
// lies in [1, max_keys] and every table entry names a block inside the cache (not checked on
// the device). Long contexts are split along the keys (flash-decoding) when the workspace allows.
struct PagedDecodeArgs {
  float* out = nullptr;
  const float* q = nullptr;
  int64_t rows = 0, H = 0, Hkv = 0, D = 0;
  const void* kv = nullptr;
  DType kv_dtype = DType::f32;
  int64_t block_tokens = 0, block_stride = 0, v_offset = 0;
  const int32_t* block_tables = nullptr;
  int64_t table_stride = 0;
  const int32_t* n_keys = nullptr;
  int64_t max_keys = 0;  // host-known bound on n_keys, sizes the split
  // Optional sliding window: row r reads keys first_key[r] .. n_keys[r]-1 only (device array,
  // 0 <= first_key[r] < n_keys[r]); max_span, when positive, bounds n_keys - first_key and
  // sizes the split in place of max_keys.
  const int32_t* first_key = nullptr;
  int64_t max_span = 0;
  float scale = 1.0f;
  float* workspace = nullptr;  // optional: partial results of the splits
  int64_t workspace_floats = 0;
  // Optional: out also quantized for the next product's matvec (blocks of 32 only, M = rows,
  // K = H * D), the same bits as matmul_wt's own quantizer would give from out: saves the
  // caller the quantizer's launch in front of the attention output product.
  const QuantizedActs* quantize_out = nullptr;
  // Optional, for prompts (a 16-bit cache, no quantize_out): the rows of these tiles (a device
  // array of n_prefill_tiles) run on tensor cores, 64 query rows against 64 keys at a time
  // (Q and P rounded to the cache's 16-bit type, f32 accumulation); then the decode kernel
  // takes only the n_decode_rows rows listed in decode_rows (device). Together the two must
  // name every row once; plan_paged_prefill builds both lists.
  const PagedPrefillTile* prefill_tiles = nullptr;
  int64_t n_prefill_tiles = 0;
  const int32_t* decode_rows = nullptr;  // null: every row takes the decode kernel
  int64_t n_decode_rows = 0;
};
// Workspace floats that allow up to max_splits splits per (row, head).
int64_t paged_decode_workspace_floats(int64_t rows, int64_t H, int64_t D, int64_t max_splits);
void paged_decode_attention(const PagedDecodeArgs& a, cudaStream_t stream);
namespace detail {
// The prefill tiles' kernel (paged_prefill_attention.cu), launched by paged_decode_attention
// after its checks.
void paged_prefill_attention(const PagedDecodeArgs& a, cudaStream_t stream);
}  // namespace detail

// Which rows of a chunk take the tensor-core prefill: runs of consecutive rows with identical
// block tables (rows r..r+L-1 of tables, table_stride entries each) of at least min_rows rows
// become tiles of up to 64 rows, the heaviest (most keys) first; every other row is listed for
// the decode kernel, in order. n_keys and first_key (null: all 0) are the rows' host copies.
struct PagedPrefillPlan {
  std::vector<PagedPrefillTile> tiles;
  std::vector<int32_t> decode_rows;
};
inline constexpr int64_t kPrefillTileRows = 64;
PagedPrefillPlan plan_paged_prefill(int64_t rows, const int32_t* n_keys, const int32_t* first_key,
                                    const int32_t* tables, int64_t table_stride, int64_t min_rows);

// ---- Index math shared by the kernels and the host tests (no device code) ----
namespace attn_index {

// Forward tiles: 64 query rows (4 warps x 16) by 64 keys. Backward: 64 keys (4 warps x 16) per
// block, 32 query rows per step (keeps dK, dV, S and dP in registers: at D=128 ptxas 13.0 gives
// the backward 255 registers and a 32-byte spill on sm_90a, the forward 254 and none).
inline constexpr int kFwdBlockM = 64, kFwdBlockN = 64;
inline constexpr int kBwdBlockM = 32, kBwdBlockN = 64;

__host__ __device__ inline int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// The first K tile a query tile visits: 0, or with a window W the tile holding its first row's
// first key (q_tile * bm - W + 1), so the tiles wholly before the window are never loaded.
__host__ __device__ inline int first_kv_tile_for_q_tile(int q_tile, int bm, int bn, int window) {
  const int first_key = q_tile * bm - window + 1;
  return window > 0 && first_key > 0 ? first_key / bn : 0;
}

// K tiles a query tile visits (the end of its range): all of them, or (causal) those up to the
// tile that holds the tile's last row, so fully masked tiles are never loaded.
__host__ __device__ inline int kv_tiles_for_q_tile(int q_tile, int T, int bm, int bn, bool causal) {
  const int n = ceil_div(T, bn);
  if (!causal) return n;
  const int last_row = (q_tile * bm + bm - 1 < T - 1) ? q_tile * bm + bm - 1 : T - 1;
  const int needed = last_row / bn + 1;
  return needed < n ? needed : n;
}

// Whether tile (q_tile, kv_tile) holds any masked score: a key past T, (causal) a key after the
// tile's first row, or (window W) a key before its last row's window (key <= row - W). Only
// such tiles pay for the per-element mask.
__host__ __device__ inline bool tile_needs_mask(int q_tile, int kv_tile, int T, int bm, int bn,
                                                bool causal, int window) {
  if ((kv_tile + 1) * bn > T) return true;
  // The window hides the tile's first key from its last real row (rows past T are padding).
  const int last_row = (q_tile * bm + bm < T ? q_tile * bm + bm : T) - 1;
  if (window > 0 && kv_tile * bn <= last_row - window) return true;
  return causal && kv_tile * bn + bn - 1 > q_tile * bm;
}

// Whether a query row sees a key: causal key <= row, and with a window W key > row - W.
__host__ __device__ inline bool key_visible(int row, int key, bool causal, int window) {
  return (!causal || key <= row) && (window <= 0 || key > row - window);
}

// Backward: the first query tile that sees any key of kv_tile (causal rows >= first key).
__host__ __device__ inline int first_q_tile_for_kv_tile(int kv_tile, int bm, int bn, bool causal) {
  return causal ? kv_tile * bn / bm : 0;
}
// Backward: one past the last query tile that sees any key of kv_tile: all tiles, or with a
// window W the tile holding the tile's last key + W - 1.
__host__ __device__ inline int end_q_tile_for_kv_tile(int kv_tile, int T, int bm, int bn,
                                                      int window) {
  const int n = ceil_div(T, bm);
  if (window <= 0) return n;
  const int end = (kv_tile * bn + bn - 1 + window - 1) / bm + 1;
  return end < n ? end : n;
}

// A key-tile block's steps: (query head of the GQA group, query tile of bm rows) pairs,
// head-major, over the query tiles that see any of the tile's keys.
struct BwdSteps {
  int first_q_tile, tiles_per_head, count, first_head;
  __host__ __device__ BwdSteps(int kv_tile, int T, int bm, int bn, bool causal, int window, int hk,
                               int group)
      : first_q_tile(first_q_tile_for_kv_tile(kv_tile, bm, bn, causal)),
        tiles_per_head(end_q_tile_for_kv_tile(kv_tile, T, bm, bn, window) - first_q_tile),
        count(group * tiles_per_head),
        first_head(hk * group) {}
  __host__ __device__ int head(int step) const { return first_head + step / tiles_per_head; }
  __host__ __device__ int q0(int step, int bm) const {
    return (first_q_tile + step % tiles_per_head) * bm;
  }
};

// Shared-memory tiles of 16-bit elements with `cols` per row (cols a multiple of 64, so a row is
// a multiple of 128 bytes): 16-byte chunk c of row r is stored at chunk c ^ (r & 7), which puts
// the 8 rows read by one ldmatrix into 8 different bank groups. col is a multiple of 8 when a
// whole chunk is addressed.
__host__ __device__ inline int swizzle(int row, int col, int cols) {
  return row * cols + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// Flash-decoding split: enough blocks to fill the GPU twice over, each split at least
// kMinKeysPerSplit keys, at most max_splits splits.
inline constexpr int64_t kMinKeysPerSplit = 256;
struct SplitPlan {
  int64_t splits = 1, keys_per_split = 0;
};
inline SplitPlan plan_paged_splits(int64_t blocks_without_split, int64_t max_keys, int num_sms,
                                   int64_t max_splits) {
  SplitPlan p;
  p.keys_per_split = max_keys;
  if (max_splits <= 1 || max_keys <= kMinKeysPerSplit) return p;
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + blocks_without_split - 1) /
                       std::max<int64_t>(blocks_without_split, 1);
  const int64_t by_keys = (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const int64_t s = std::max<int64_t>(1, std::min({want, by_keys, max_splits}));
  p.keys_per_split = (max_keys + s - 1) / s;
  p.splits = (max_keys + p.keys_per_split - 1) / p.keys_per_split;  // no empty trailing split
  return p;
}

// Query heads handled together by one decode block (they share every K/V load): the largest of
// 8, 4, 2, 1 that divides the GQA group.
inline int decode_heads_per_block(int64_t group) {
  for (int g : {8, 4, 2}) {
    if (group % g == 0) return g;
  }
  return 1;
}

}  // namespace attn_index
}  // namespace tessera::cuda
