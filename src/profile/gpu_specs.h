// GPU roofs from NVIDIA's public datasheets, for planning a run on a GPU this machine does not
// have (a plan for an H100 from a laptop), and a user's own spec file for any other card. Datasheet
// figures are peaks the card reaches only in the best case: a probe on the device replaces them
// with measured ones (datasheet = false).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::profile {

struct GpuSpec {
  std::string name;          // the lookup name: "h100", "h200", "a100", "l4", "rtx4090"
  int64_t memory_bytes = 0;  // device memory
  double hbm_gbs = 0;        // memory bandwidth, GB/s = 1e9 bytes/s (GDDR on L4 and RTX 4090)
  // Dense tensor-core peaks (NVIDIA's "with sparsity" figures are twice these), TFLOP/s and
  // TOP/s; 0 where the card has no such unit (fp8 before Ada and Hopper).
  double bf16_dense_tflops = 0;
  double fp16_dense_tflops = 0;
  double fp8_dense_tflops = 0;
  double int8_dense_tops = 0;
  double tdp_watts = 0;   // the board's maximum power
  bool datasheet = true;  // true: published figures; false: measured on the device
};

// The table entry for `name` (case-insensitive), or null if unknown.
const GpuSpec* find_gpu_spec(std::string_view name);
// The table's names, in table order (for "unknown device; known: ..." messages).
std::vector<std::string> gpu_spec_names();
// A GpuSpec from a user's spec.json: one object with every field of GpuSpec (name a string,
// datasheet a bool, the rest numbers >= 0, memory_bytes and hbm_gbs > 0). Throws Error naming
// `file` and the missing or ill-typed field.
GpuSpec gpu_spec_from_json(const std::string& text, const std::string& file);

}  // namespace tessera::profile
