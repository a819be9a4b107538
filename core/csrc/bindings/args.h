// Argument checks shared by every binding: a value that does not fit what the native side takes
// is refused with uccl_ep.errors.InvalidArgument / LimitExceeded naming the argument and the
// accepted range, before any native code sees it.
//
// NOTES: scalar integers cross as Python objects (nb::handle) and are converted here, not by
// nanobind's uint32_t / int casters: those either refuse with a TypeError that names no limit or
// (for fixed-width fields) let the encoder truncate silently. Callers hold the GIL.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdint.h>

#include <string>

namespace uccl_ep::proxy {
class Proxy;
}

namespace uccl_ep::bindings {

namespace nb = nanobind;

// A named argument that passes any Python object, None included, to the binding's own checks
// (nanobind would refuse None for a handle parameter with an untyped TypeError).
inline auto any_arg(const char* name) { return nb::arg(name).none(); }

// A uccl_ep._C.Proxy (InvalidArgument naming `name` otherwise).
proxy::Proxy& proxy_arg(nb::handle v, const char* name = "proxy");

// Raise uccl_ep.errors.InvalidArgument(argument, expected, got).
[[noreturn]] void raise_invalid(const std::string& argument, const std::string& expected, const std::string& got);
// Raise uccl_ep.errors.LimitExceeded(argument, what, needed, limit); `needed` is the caller's
// Python object (an int of any size).
[[noreturn]] void raise_limit(const std::string& argument, const std::string& what, nb::handle needed, uint64_t limit);

// A Python int (or anything with __index__, not bool) in [lo, hi]. Values above hi raise
// LimitExceeded with `what` ("bytes of one write (24-bit len field)"); below lo InvalidArgument.
int64_t int_arg(nb::handle v, const char* name, int64_t lo, int64_t hi, const char* what = "");
// The same for unsigned 64-bit words (hi up to UINT64_MAX).
uint64_t u64_arg(nb::handle v, const char* name, uint64_t hi, const char* what = "");
// A byte offset carried in 16-byte units in a 31-bit field: aligned and < 32 GiB.
uint64_t offset_arg(nb::handle v, const char* name);
// A finite number of seconds in (0, 1e7] (every wait is bounded: NaN, inf and <= 0 are refused).
double timeout_arg(nb::handle v, const char* name);
// A Python bool (or 0 / 1).
bool bool_arg(nb::handle v, const char* name);
// A str.
std::string str_arg(nb::handle v, const char* name);

// A 1-D C-contiguous CPU array of T (numpy or anything nanobind takes for it); InvalidArgument
// naming the argument otherwise.
template <typename T>
using Vec = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

const char* dtype_name_of(int code, int bits);
// str(v) (repr for non-str objects whose str fails).
std::string text_of(nb::handle v);

template <typename T>
Vec<T> vec_arg(nb::handle v, const char* name) {
  Vec<T> out;
  if (!nb::try_cast(v, out, false)) {
    std::string got = Py_TYPE(v.ptr())->tp_name;
    if (nb::hasattr(v, "dtype") && nb::hasattr(v, "shape"))
      got = "an array of dtype " + text_of(v.attr("dtype")) + " and shape " + text_of(v.attr("shape"));
    raise_invalid(name, std::string("a 1-D C-contiguous CPU array of ") + dtype_name_of(int(nb::dtype<T>().code),
                                                                                         int(nb::dtype<T>().bits)),
                  got);
  }
  return out;
}

}  // namespace uccl_ep::bindings
