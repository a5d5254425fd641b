#pragma once
#include <stdexcept>
#include <string>

namespace npusim {

// Every user-facing failure: the message names the file, node or field at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

inline void check(bool condition, const std::string& message) {
  if (!condition) fail(message);
}

}  // namespace npusim
