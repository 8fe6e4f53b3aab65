// The least-squares scale searches the k-quant quantizers share (dtype_kquant.cc defines them;
// dtype_kquant.cc and dtype_kquant_low.cc use them).
#pragma once

namespace tessera::kquant_fit {

// round(v) clamped to [lo, hi].
int round_clamp(float v, int lo, int hi);

// Fits x (n <= 256 values) as s * q - m with q in [0, qmax], s >= 0, m >= 0 (the formats store
// a non-negative min that is subtracted). Tries several step sizes around the range / qmax, and
// for each refits (s, -m) by least squares to the chosen quants; keeps the smallest error.
void fit_scale_min(const float* x, int n, int qmax, float* scale, float* min_out);

// Fits x (n <= 16 values) as s * q with q in [qmin, -qmin - 1] (s of either sign). The value of
// largest magnitude maps near qmin, where the range reaches furthest; least squares refits s.
float fit_scale_signed(const float* x, int n, int qmin);

}  // namespace tessera::kquant_fit
