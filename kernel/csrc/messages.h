// Error messages for the torch binding, built without streaming numbers through an ostream.
//
// On the H200 box, a TORCH_CHECK message that streamed a number through c10::str crashed the
// process with SIGSEGV inside the extension, while messages streaming only strings were fine
// (kernel/NOTES.md, "bad-input crash"). Here numbers become text through std::to_string and
// snprintf, and the pieces are concatenated. Header-only and CUDA-free, so a CPU build of torch
// can compile and test it (tests/test_binding_messages.py).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace va_messages {

inline std::string text(const std::string& s) { return s; }
inline std::string text(const char* s) { return s; }
inline std::string text(double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}
inline std::string text(const c10::Device& d) { return d.str(); }
inline std::string text(c10::ScalarType t) { return c10::toString(t); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string text(T x) {
  return std::to_string(x);
}
inline std::string text(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

template <class... A>
std::string fmt(const A&... parts) {
  std::string s;
  ((s += text(parts)), ...);
  return s;
}

}  // namespace va_messages

// TORCH_CHECK with a message made by fmt(): the arguments are only formatted on failure.
#define VA_CHECK(cond, ...) TORCH_CHECK(cond, ::va_messages::fmt(__VA_ARGS__))
