#pragma once
// NumPy .npy files (format versions 1.0, 2.0 and 3.0), little-endian, C order.
#include <string>

#include "npusim/tensor.h"

namespace npusim {

// Supported dtypes: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1. Errors name the path and the problem.
Tensor read_npy(const std::string& path);
// Writes version 1.0 (2.0 when the header needs it). bfloat16 has no npy spelling and is refused.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace npusim
