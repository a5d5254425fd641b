#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace npusim {

struct NoneValue {
  bool operator==(const NoneValue&) const = default;
};

// One attribute value as torch_ir writes it: JSON null, bool, int64, double, string, or a list of them.
using AttrValue = std::variant<NoneValue, bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<bool>>;

std::string attr_value_string(const AttrValue& value);

// Typed attribute access. Errors name the node and the attribute.
class Attrs {
 public:
  Attrs() = default;
  explicit Attrs(std::string owner) : owner_(std::move(owner)) {}

  bool has(const std::string& name) const;
  bool is_none(const std::string& name) const;  // absent or null
  const AttrValue& get(const std::string& name) const;
  void set(const std::string& name, AttrValue value) { values_[name] = std::move(value); }
  void erase(const std::string& name) { values_.erase(name); }

  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;  // ints are accepted
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  std::vector<int64_t> get_ints(const std::string& name) const;  // a single int becomes a one-element list
  std::vector<double> get_floats(const std::string& name) const;

  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_float(const std::string& name, double fallback) const;
  bool get_bool(const std::string& name, bool fallback) const;
  std::vector<int64_t> get_ints(const std::string& name, std::vector<int64_t> fallback) const;
  // The scalar kept as written: int64 stays integral (matters for integer tensors).
  bool is_integer(const std::string& name) const;

  const std::map<std::string, AttrValue>& values() const { return values_; }
  const std::string& owner() const { return owner_; }
  void set_owner(std::string owner) { owner_ = std::move(owner); }

 private:
  [[noreturn]] void type_error(const std::string& name, const char* expected) const;
  std::string owner_;
  std::map<std::string, AttrValue> values_;
};

}  // namespace npusim
