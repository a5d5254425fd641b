#pragma once
// Activations over float arrays with AVX2 and FMA where the CPU has them: exp (a Cephes-style polynomial after
// reduction by ln 2, within 3e-7 of the exact value relatively), and from it sigmoid, SiLU and tanh-approximated
// GELU; erf (Eigen's rational approximation, within 2e-7 absolutely) and from it GELU;
// ReLU, clamp, hardswish and hardsigmoid with the same operations as the scalar loops, so bit for bit the same.
// Infinities, NaN and results in the denormal range behave as in the scalar loops.
#include <cstdint>

#include "backends/cpu/elementwise.h"

namespace npusim::cpu {

// out[i] = step(in[i]) for i < n (`out` may be `in`) for the steps above (a clamp with bounds p0, p1, neither NaN).
// False, with nothing written, for any other step or when the CPU lacks AVX2 and FMA: the caller keeps its scalar
// loop.
bool vector_unary(const UnaryStep& step, const float* in, float* out, int64_t n);

// out[i] = silu(gate[i]) * up[i]: the gated MLP's activation.
bool vector_silu_mul(const float* gate, const float* up, float* out, int64_t n);

// x[i] = e^(x[i] - shift) for i < n (exp as above), their sum in double into `sum`: softmax's exponentials. False,
// with nothing written, when the CPU lacks AVX2 and FMA.
bool vector_exp_shifted(float* x, int64_t n, float shift, double& sum);

// out[i] = in[i] * scale + shift for i < n (`out` may be `in`), a multiply then an add as a scalar loop rounds them.
// Every CPU (vectors with AVX2).
void affine(const float* in, float* out, int64_t n, float scale, float shift);

// The sum of x[0, n) in double, in several independent partial sums (with AVX2, of four lanes each): a long sum is
// not one chain of dependent additions. Every CPU.
double sum_in_double(const float* x, int64_t n);

// The sum of (x[i] - center)^2 over [0, n) in double, in independent partial sums as sum_in_double. Every CPU.
double sum_squared_deviations(const float* x, int64_t n, double center);

}  // namespace npusim::cpu
