#pragma once
// Symbols of libraries opened at run time (dlopen), for the CUDA libraries npusim loads only where present.
#include <dlfcn.h>

#include <string>

namespace npusim {

// `symbol` of a library opened with dlopen, as `function`; false when the library lacks it.
template <typename Fn>
bool resolve_symbol(void* library, const char* symbol, Fn& function) {
  function = reinterpret_cast<Fn>(dlsym(library, symbol));
  return function != nullptr;
}

// The same, adding the symbol to `missing` (a comma-separated list for the error message) when the library lacks it.
template <typename Fn>
bool resolve_symbol(void* library, const char* symbol, Fn& function, std::string& missing) {
  if (resolve_symbol(library, symbol, function)) return true;
  missing += std::string(missing.empty() ? "" : ", ") + symbol;
  return false;
}

}  // namespace npusim
