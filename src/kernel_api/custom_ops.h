#pragma once
// Ops registered while the program runs (user kernels, see kernels::register_custom_op). OpRegistry::instance()
// consults this table for the names and spellings it does not know itself. Entries are never removed, so the
// OpDef pointers that graphs keep stay valid.
#include <string>
#include <utility>
#include <vector>

#include "npusim/op_registry.h"

namespace npusim {

const OpDef* find_custom_op(const std::string& name);
std::pair<const OpDef*, const AtenSpelling*> find_custom_spelling(const std::string& op_type);
std::vector<const OpDef*> custom_ops();
// Fails when the name or one of the spellings is already known (built in or custom).
void add_custom_op(OpDef def);

}  // namespace npusim
