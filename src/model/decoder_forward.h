// The inference forward pass of a DecoderModel (the Llama family and GPT-2) over a chunk of token
// rows from one or many sequences: embedding, the layers (block_forward, each row's key and value
// appended to a paged cache and attention over that cache), the final norm and the head for the
// rows whose logits are wanted. The engine drives it; it holds no forward of its own.
// Every tensor it touches lives on ctx.device and is touched only through ops/: the host keeps
// the bookkeeping (positions, block tables, which rows want logits), looks the embedding rows
// up, and copies both in and the logits out (no copies on the CPU, whose memory is the host's).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "model/decoder.h"
#include "model/decoder_block.h"
#include "ops/context.h"
#include "ops/graph.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "ops/paged_attention.h"

namespace tessera::model {

// A Llama model's rotary tables for positions [0, max_pos): the global one (its RoPE scaling;
// LongRoPE's factors picked by max_pos) and, where c has local layers, theirs (else empty). On a
// device that is not the CPU both are uploaded into a new `device` buffer (each table's cos then
// sin) and point at it there.
void make_rope_tables(const ops::Context& ctx, const DecoderConfig& c, int64_t max_pos,
                      ops::RopeTable* global, ops::RopeTable* local, ops::Buffer* device);

// A paged key/value cache on the forward's device, n_blocks blocks in the layout of `layout`
// (ops::PagedKvLayout; k_transposed as ops::paged_keys_transposed says for the device). Layer
// l's block b starts at element l * layer_stride + b * layout.block_stride of base.
// windowed: where the cache keeps the sliding-window layers (DecoderConfig::window(l) > 0) in a
// pool of their own (same layout but block_stride and n_blocks), that pool; layers are then
// numbered within their pool (the i-th windowed layer is layer i of *windowed, the i-th other
// layer layer i of this one) and rows address it through DecoderRows::window_tables. Null: every
// layer in this pool, numbered as in the model.
struct PagedKv {
  uint8_t* base = nullptr;
  int64_t layer_stride = 0, n_blocks = 0;
  ops::PagedKvLayout layout;
  const PagedKv* windowed = nullptr;
};

// Row r: token tokens[r] at position pos[r] of the sequence whose block table is tables[r]
// (blocks of the cache holding positions 0 .. pos[r]); want_logits[r] asks for its logits. Host
// arrays. window_tables (with PagedKv::windowed only): each row's table in the windowed layers'
// pool, indexed by position as tables[r] is; entries below the row's window (positions before
// pos[r] + 1 - sliding_window) are never read and may be -1 (blocks already freed).
struct DecoderRows {
  int64_t n = 0;
  const int32_t* tokens = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* const* tables = nullptr;
  const uint8_t* want_logits = nullptr;  // 0 or 1
  const int32_t* const* window_tables = nullptr;
};

class DecoderForward {
 public:
  // model's weights must be in ctx.device's memory (to_device), except the embedding tables,
  // which stay in host memory; its norm weights and biases must be f32 (the engine widens them
  // once); it must outlive this. Buffers are sized for chunks of up to max_rows rows; RoPE and
  // block tables for positions < max_ctx.
  DecoderForward(const DecoderModel& model, const ops::Context& ctx, int64_t max_rows,
                 int64_t max_ctx);

  // What forward() writes for each row with want_logits: its logits (V), or its last hidden
  // state (C: the final norm's output, which the head would read; for embeddings).
  enum class Output { logits, hidden };
  // Embeds and runs rows.n <= max_rows rows through every layer, appending their keys and
  // values to kv, then writes the logits (m, V) (or hidden states (m, C)) of the m rows with
  // want_logits, in row order, to host memory `out`. Returns m. Each stage runs in its
  // ops::Scope.
  int64_t forward(const DecoderRows& rows, const PagedKv& kv, float* out,
                  Output what = Output::logits);

  // The activation buffers' bytes for chunks of max_rows rows (what the first forward allocates).
  static int64_t activation_bytes(const DecoderConfig& c, int64_t max_rows);

 private:
  class PagedAttention;
  // The rows' token embeddings (+ learned positions for GPT-2), (n, C) into host memory
  // (x_host_).
  void embed(const DecoderRows& rows);
  // The chunk's row arrays, max_rows entries each, then the block tables (max_rows,
  // table_stride_); one block on the host (ints_) and, on a device, its copy (ints_device_).
  // The windowed pool's block tables (PagedKv::windowed) follow the tables, (max_rows,
  // table_stride_) again; kWindowSlot: each row's slot there.
  enum RowArray { kPos, kSlot, kWindowSlot, kNKeys, kFirstKey, kLogitRows, kTables };
  int32_t* host_ints(RowArray a) { return ints_.data() + a * max_rows_; }
  // Array a as the ops read it: the host block on the CPU, its copy on a device.
  const int32_t* ints(RowArray a) const {
    return (on_host_ ? ints_.data() : ints_device_.as<int32_t>()) + a * max_rows_;
  }
  // The windowed pool's tables, as the ops read them.
  const int32_t* window_tables() const { return ints(kTables) + max_rows_ * table_stride_; }
  float* buf(int i) const { return acts_[static_cast<size_t>(i)].as<float>(); }
  // Every layer over the n staged rows, then the final norm of the m rows with logits and the
  // head for the first head_rows of them into head_out: only ops on device memory and scalars,
  // so a graph can record it. max_keys bounds every row's key count.
  // head_rows = 0 stops after the final norm (hidden states in the kXn buffer).
  void run_layers(int64_t n, int64_t m, int64_t max_keys, int64_t head_rows, const PagedKv& kv,
                  float* head_out);
  // The attention's plans (ops::plan_paged_attention) by kind of layer: a layer of the full pool
  // without a window (kind 0) or with one (1), a layer of the windowed pool (2).
  static constexpr int kPlanKinds = 3;
  int plan_kind(int64_t layer, bool apart) const;
  // Where the device plans its attention: extends each row's block table to its sequence's last
  // position in the chunk (zero past it), then writes and stages each kind's plan of the n rows.
  void stage_plans(const DecoderRows& rows, const PagedKv& kv, int64_t n);
  // A recorded step's shape: rows, logit rows, key bound, cache, the attention's plans.
  struct GraphKey {
    int64_t n, m, max_keys;
    const uint8_t* cache;
    std::array<int64_t, kPlanKinds> plans;
    bool operator<(const GraphKey& o) const {
      return std::tie(n, m, max_keys, cache, plans) <
             std::tie(o.n, o.m, o.max_keys, o.cache, o.plans);
    }
  };

  const DecoderModel& model_;
  ops::Context ctx_;
  bool on_host_;  // ctx.device's memory is the host's
  int64_t max_rows_, max_ctx_;
  ops::RopeTable rope_, rope_local_;  // rope_local_: local layers' (DecoderConfig::local)
  ops::Buffer rope_device_;           // each table's cos then sin, where the device is not the CPU
  std::vector<float> x_host_, pos_row_;  // embeddings; one learned position row (GPT-2)
  // Activations on the device (allocated at the first forward): see acts_ indices in the .cc.
  std::vector<ops::Buffer> acts_;
  MoeRouting routing_;         // a mixture-of-experts layer's host scratch
  std::vector<int32_t> ints_;  // laid out as RowArray says
  // Each layer's number within its pool, where the cache keeps windowed layers apart.
  std::vector<int64_t> pool_layer_;
  int64_t table_stride_ = 0;
  ops::Buffer ints_device_, logits_device_;
  // Steps recorded on a device that records graphs; an empty graph: the shape was seen once.
  std::map<GraphKey, ops::Graph> graphs_;
  // Quantized activations (ops::QuantizedRows) where the device keeps them for a chunk's rows, by
  // the role of the rows: the attention norm's output (q/k/v read it), the MLP norm's (gate/up,
  // GPT-2's c_fc), the attention's output, the gated activation (down). One buffer per role,
  // sized at the first forward for the most rows the device takes; each layer's rows as its
  // products read them (data null: none), set for n rows by set_quantized_rows.
  enum QRole { kQAttnIn, kQMlpIn, kQAtt, kQAct, kQRoles };
  // The role's width and the weights' type that reads it in `layer`; f32 where none does.
  std::pair<int64_t, DType> quantized_role(int64_t layer, int role) const;
  void size_quantized_rows();
  void set_quantized_rows(int64_t n);
  const ops::QuantizedRows* quantized(int64_t layer, int role) const {
    const ops::QuantizedRows& q = q_rows_[static_cast<size_t>(layer)][static_cast<size_t>(role)];
    return q.data ? &q : nullptr;
  }
  std::array<ops::Buffer, kQRoles> q_buffers_;
  std::vector<std::array<ops::QuantizedRows, kQRoles>> q_rows_;
  int64_t q_rows_n_ = -1;
  // Each kind's plan of plan_bytes_ bytes (0: the device plans nothing), on the host and staged
  // on the device, and this chunk's keys (0 for a kind no layer has).
  int64_t plan_bytes_ = 0;
  std::vector<uint8_t> plans_host_;
  ops::Buffer plans_device_;
  std::array<int64_t, kPlanKinds> plan_keys_{};
};

// The model with its weights copied to ctx.device (the embedding tables stay where they are:
// DecoderForward looks their rows up on the host); the host model must outlive it. On the CPU
// the copy is the model itself.
struct DeviceModel {
  DecoderModel view;
  std::vector<ops::Buffer> buffers;
};
DeviceModel to_device(const DecoderModel& host, const ops::Context& ctx);

}  // namespace tessera::model
