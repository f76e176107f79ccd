// What every library's C ABI entry shares: nothing throws across the boundary; a failure returns 1 and
// leaves its message for bs_last_error() (one message per thread, per library).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#ifndef BLOCHSIM_VERSION
#define BLOCHSIM_VERSION "unknown"
#endif

namespace bs {

inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

// Runs f(); returns 0, or 1 with the exception's message kept for bs_last_error().
template <class F>
int32_t guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
  } catch (...) {
    last_error() = "unknown C++ exception";
  }
  return 1;
}

}  // namespace bs
