#pragma once
// Symbols of libraries opened at run time (dlopen), for the CUDA libraries npusim loads only where present.
#include <dlfcn.h>

namespace npusim {

// `symbol` of a library opened with dlopen, as `function`; false when the library lacks it.
template <typename Fn>
bool resolve_symbol(void* library, const char* symbol, Fn& function) {
  function = reinterpret_cast<Fn>(dlsym(library, symbol));
  return function != nullptr;
}

}  // namespace npusim
