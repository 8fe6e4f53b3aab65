// Per-op totals of the calls an OpTally observed.
#include "ops/op_tally.h"

#include <algorithm>

namespace tessera::ops {

void OpTally::on_op(const OpRecord& r) {
  const std::lock_guard<std::mutex> lock(mu_);
  auto it =
      std::find_if(by_op_.begin(), by_op_.end(), [&](const OpTotal& t) { return t.op == r.op; });
  if (it == by_op_.end()) {
    by_op_.push_back(OpTotal{std::string(r.op)});
    it = by_op_.end() - 1;
  }
  ++it->calls;
  it->seconds += r.seconds;
  it->flops += r.cost.flops;
  it->bytes += r.cost.bytes;
}

std::vector<OpTotal> OpTally::totals() const {
  std::vector<OpTotal> out;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    out = by_op_;
  }
  std::sort(out.begin(), out.end(), [](const OpTotal& a, const OpTotal& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  return out;
}

void OpTally::reset() {
  const std::lock_guard<std::mutex> lock(mu_);
  by_op_.clear();
}

}  // namespace tessera::ops
