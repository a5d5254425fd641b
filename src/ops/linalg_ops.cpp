#include "ops/op_util.h"

namespace npusim {

void register_linalg_ops(OpRegistry&) {}

}  // namespace npusim
