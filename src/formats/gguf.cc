// GGUF shared pieces: value type names and equality, the ggml type table, and conversion of
// tensors to f32, including the k-quant (Q4_K, Q6_K) dequantizers.
#include "formats/gguf.h"

#include "core/error.h"

namespace tessera::formats {

// The variant's alternative index is the file's value type id.
static_assert(std::is_same_v<std::variant_alternative_t<7, GgufStorage>, bool>);
static_assert(std::is_same_v<std::variant_alternative_t<8, GgufStorage>, std::string>);
static_assert(std::is_same_v<std::variant_alternative_t<9, GgufStorage>, GgufArray>);
static_assert(std::is_same_v<std::variant_alternative_t<12, GgufStorage>, double>);

namespace {

constexpr std::string_view kValueTypeNames[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

// Block sizes are part of the file format (ggml's type traits); dtype is set where our block
// struct has the identical layout.
const GgmlTypeInfo kGgmlTypes[] = {
    {GgmlType::f32, "F32", 1, 4, DType::f32},
    {GgmlType::f16, "F16", 1, 2, DType::f16},
    {GgmlType::q4_0, "Q4_0", kQK4_0, sizeof(BlockQ4_0), DType::q4_0},
    {GgmlType::q4_1, "Q4_1", kQK4_1, sizeof(BlockQ4_1), DType::q4_1},
    {GgmlType::q5_0, "Q5_0", kQK5_0, sizeof(BlockQ5_0), DType::q5_0},
    {GgmlType::q5_1, "Q5_1", kQK5_1, sizeof(BlockQ5_1), DType::q5_1},
    {GgmlType::q8_0, "Q8_0", kQK8_0, sizeof(BlockQ8_0), DType::q8_0},
    {GgmlType::q2_k, "Q2_K", kQK_K, sizeof(BlockQ2K), DType::q2_k},
    {GgmlType::q3_k, "Q3_K", kQK_K, sizeof(BlockQ3K), DType::q3_k},
    {GgmlType::q4_k, "Q4_K", kQK_K, sizeof(BlockQ4K), DType::q4_k},
    {GgmlType::q5_k, "Q5_K", kQK_K, sizeof(BlockQ5K), DType::q5_k},
    {GgmlType::q6_k, "Q6_K", kQK_K, sizeof(BlockQ6K), DType::q6_k},
    {GgmlType::bf16, "BF16", 1, 2, DType::bf16},
};

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kValueTypeNames) ? kValueTypeNames[i] : std::string_view("?");
}

bool operator==(const GgufArray& a, const GgufArray& b) {
  return a.elem_type == b.elem_type && a.items == b.items;
}
bool operator==(const GgufValue& a, const GgufValue& b) {
  return a.v == b.v;
}

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (static_cast<uint32_t>(t.id) == id) return &t;
  return nullptr;
}

GgmlType ggml_type_of(DType t) {
  for (const auto& g : kGgmlTypes)
    if (g.dtype == t) return g.id;
  fail("[gguf] dtype ", dtype_name(t), " has no GGUF tensor type");
}

// Q4_K: 8 sub-blocks of 32 elements; sub-block j has a 6-bit scale sc_j and min m_j, and
// x = d * sc_j * q - dmin * m_j with q a 4-bit quant. The 12 scale bytes pack them as:
// bytes 0-3 hold sc_0..3 in bits 0-5, bytes 4-7 hold m_0..3 in bits 0-5; bytes 8-11 hold
// sc_4..7 (low nibble) and m_4..7 (high nibble) whose top 2 bits are the spare bits 6-7 of
// bytes 0-3 (scales) and 4-7 (mins).
static void q4_k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequantize_q4_k(const BlockQ4K* src, float* dst, int64_t n) {
  TS_CHECK(n % kQK_K == 0, "[gguf] Q4_K element count ", n, " is not a multiple of ", kQK_K);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ4K& blk = src[b];
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    float* y = dst + b * kQK_K;
    // Each 32 quant bytes hold 64 elements: sub-block 2c in the low nibbles, 2c+1 in the high.
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = blk.qs + 32 * c;
      int sc0, m0, sc1, m1;
      q4_k_scale_min(blk.scales, 2 * c, &sc0, &m0);
      q4_k_scale_min(blk.scales, 2 * c + 1, &sc1, &m1);
      const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
      for (int l = 0; l < 32; ++l) {
        y[64 * c + l] = d0 * static_cast<float>(q[l] & 0x0f) - o0;
        y[64 * c + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - o1;
      }
    }
  }
}

// Q6_K: x = d * scales[i / 16] * (q - 32) with q a 6-bit quant. Each half of 128 elements
// uses 64 bytes of ql and 32 of qh: element l + 32 r (r = 0..3, l = 0..31) takes its low 4 bits
// from ql[l + 32 (r & 1)] (low nibble for r < 2, high for r >= 2) and its high 2 bits from
// bits 2r..2r+1 of qh[l].
void dequantize_q6_k(const BlockQ6K* src, float* dst, int64_t n) {
  TS_CHECK(n % kQK_K == 0, "[gguf] Q6_K element count ", n, " is not a multiple of ", kQK_K);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockQ6K& blk = src[b];
    const float d = f16_to_f32(blk.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk.ql + 64 * half;
      const uint8_t* qh = blk.qh + 32 * half;
      float* y = dst + b * kQK_K + 128 * half;
      for (int r = 0; r < 4; ++r) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo_byte = ql[l + 32 * (r & 1)];
          const int lo = r < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
          const int hi = (qh[l] >> (2 * r)) & 3;
          const int i = 32 * r + l;  // element index within the half
          y[i] = d * static_cast<float>(blk.scales[8 * half + i / 16]) *
                 static_cast<float>((lo | (hi << 4)) - 32);
        }
      }
    }
  }
}

void gguf_tensor_to_f32(const GgufTensorInfo& t, float* dst) {
  if (t.dtype) {
    to_f32(*t.dtype, t.data, dst, t.n_elements);
    return;
  }
  switch (t.ggml_type) {
    case GgmlType::q4_k:
      dequantize_q4_k(reinterpret_cast<const BlockQ4K*>(t.data), dst, t.n_elements);
      return;
    case GgmlType::q6_k:
      dequantize_q6_k(reinterpret_cast<const BlockQ6K*>(t.data), dst, t.n_elements);
      return;
    default:
      break;
  }
  fail("[gguf] tensor '", t.name, "': conversion of ", t.type_name, " to f32 is not supported");
}

}  // namespace tessera::formats
