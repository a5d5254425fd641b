#include "npusim/attrs.h"

#include <cmath>
#include <sstream>

#include "npusim/error.h"

namespace npusim {

namespace {

template <typename T>
std::string list_string(const std::vector<T>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

}  // namespace

std::string attr_value_string(const AttrValue& value) {
  struct Visitor {
    std::string operator()(const NoneValue&) const { return "null"; }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::ostringstream out;
      out << v;
      return out.str();
    }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const { return list_string(v); }
    std::string operator()(const std::vector<double>& v) const { return list_string(v); }
    std::string operator()(const std::vector<bool>& v) const { return list_string(v); }
  };
  return std::visit(Visitor{}, value);
}

bool Attrs::has(const std::string& name) const { return values_.count(name) != 0; }

bool Attrs::is_none(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() || std::holds_alternative<NoneValue>(it->second);
}

const AttrValue& Attrs::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail(owner_ + ": missing attribute '" + name + "'");
  return it->second;
}

void Attrs::type_error(const std::string& name, const char* expected) const {
  fail(owner_ + ": attribute '" + name + "' must be " + expected + ", got " + attr_value_string(get(name)));
}

int64_t Attrs::get_int(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  if (auto* d = std::get_if<double>(&v); d && std::floor(*d) == *d && std::abs(*d) < 9.0e18)
    return static_cast<int64_t>(*d);
  if (auto* l = std::get_if<std::vector<int64_t>>(&v); l && l->size() == 1) return (*l)[0];
  type_error(name, "an integer");
}

double Attrs::get_float(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  type_error(name, "a number");
}

bool Attrs::get_bool(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  if (auto* i = std::get_if<int64_t>(&v); i && (*i == 0 || *i == 1)) return *i == 1;
  type_error(name, "a boolean");
}

const std::string& Attrs::get_string(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  type_error(name, "a string");
}

std::vector<int64_t> Attrs::get_ints(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* l = std::get_if<std::vector<int64_t>>(&v)) return *l;
  if (auto* i = std::get_if<int64_t>(&v)) return {*i};
  if (auto* l = std::get_if<std::vector<double>>(&v); l && l->empty()) return {};
  if (auto* l = std::get_if<std::vector<bool>>(&v); l && l->empty()) return {};
  type_error(name, "a list of integers");
}

std::vector<double> Attrs::get_floats(const std::string& name) const {
  const AttrValue& v = get(name);
  if (auto* l = std::get_if<std::vector<double>>(&v)) return *l;
  if (auto* l = std::get_if<std::vector<int64_t>>(&v)) return {l->begin(), l->end()};
  if (std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v)) return {get_float(name)};
  type_error(name, "a list of numbers");
}

int64_t Attrs::get_int(const std::string& name, int64_t fallback) const {
  return is_none(name) ? fallback : get_int(name);
}
double Attrs::get_float(const std::string& name, double fallback) const {
  return is_none(name) ? fallback : get_float(name);
}
bool Attrs::get_bool(const std::string& name, bool fallback) const {
  return is_none(name) ? fallback : get_bool(name);
}
std::vector<int64_t> Attrs::get_ints(const std::string& name, std::vector<int64_t> fallback) const {
  return is_none(name) ? fallback : get_ints(name);
}

bool Attrs::is_integer(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && (std::holds_alternative<int64_t>(it->second) || std::holds_alternative<bool>(it->second));
}

}  // namespace npusim
