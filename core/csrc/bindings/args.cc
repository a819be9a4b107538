#include "bindings/args.h"

#include <math.h>

#include "proxy/proxy.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep::bindings {

namespace {

nb::object errors() { return nb::module_::import_("uccl_ep.errors"); }

[[noreturn]] void raise_object(nb::object exc) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}


// v as a Python int (a new reference), or an InvalidArgument naming `name`.
nb::object as_int(nb::handle v, const char* name, const std::string& expected) {
  if (v.ptr() == nullptr || PyBool_Check(v.ptr()) || PyFloat_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    raise_invalid(name, expected, std::string(Py_TYPE(v.ptr())->tp_name) + " " + text_of(v));
  PyObject* i = PyNumber_Index(v.ptr());
  if (i == nullptr) {
    PyErr_Clear();
    raise_invalid(name, expected, text_of(v));
  }
  return nb::steal(i);
}

std::string range_text(int64_t lo, int64_t hi) {
  return "an int in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

}  // namespace

std::string text_of(nb::handle v) {
  PyObject* r = PyObject_Repr(v.ptr());
  if (r == nullptr) {
    PyErr_Clear();
    return Py_TYPE(v.ptr())->tp_name;
  }
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(r, &n);
  std::string out = c != nullptr ? std::string(c, size_t(n)) : std::string(Py_TYPE(v.ptr())->tp_name);
  if (c == nullptr) PyErr_Clear();
  Py_DECREF(r);
  return out.size() > 200 ? out.substr(0, 200) + "..." : out;
}

void raise_invalid(const std::string& argument, const std::string& expected, const std::string& got) {
  raise_object(errors().attr("InvalidArgument")(argument, expected, got));
}

void raise_limit(const std::string& argument, const std::string& what, nb::handle needed, uint64_t limit) {
  raise_object(errors().attr("LimitExceeded")(argument, what, needed, limit));
}

int64_t int_arg(nb::handle v, const char* name, int64_t lo, int64_t hi, const char* what) {
  const std::string expected = range_text(lo, hi);
  nb::object i = as_int(v, name, expected);
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow > 0 || (overflow == 0 && x > hi)) {
    if (what != nullptr && *what) raise_limit(name, what, i, uint64_t(hi));
    raise_invalid(name, expected, text_of(i));
  }
  if (overflow < 0 || x < lo) raise_invalid(name, expected, text_of(i));
  return int64_t(x);
}

uint64_t u64_arg(nb::handle v, const char* name, uint64_t hi, const char* what) {
  const std::string expected = "an int in [0, " + std::to_string(hi) + "]";
  nb::object i = as_int(v, name, expected);
  if (PyObject_RichCompareBool(i.ptr(), nb::int_(0).ptr(), Py_LT) == 1) raise_invalid(name, expected, text_of(i));
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  const bool over = x == (unsigned long long)-1 && PyErr_Occurred();
  if (over) PyErr_Clear();
  if (over || x > hi) {
    if (what != nullptr && *what) raise_limit(name, what, i, hi);
    raise_invalid(name, expected, text_of(i));
  }
  return uint64_t(x);
}

uint64_t offset_arg(nb::handle v, const char* name) {
  constexpr uint64_t kUnit = protocol::kOffsetUnitBytes, kMax = protocol::limits::kMaxRegionBytes - kUnit;
  const uint64_t off = u64_arg(v, name, kMax, "bytes of offset (31-bit TransferCmd field in 16-byte units)");
  if (off % kUnit)
    raise_invalid(name, "multiples of " + std::to_string(kUnit) + " bytes (offsets travel in 16-byte units)",
                  std::to_string(off));
  return off;
}

double timeout_arg(nb::handle v, const char* name) {
  const char* expected = "a finite number of seconds in (0, 1e7]";
  if (v.ptr() == nullptr || PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr())))
    raise_invalid(name, expected, std::string(Py_TYPE(v.ptr())->tp_name) + " " + text_of(v));
  const double t = PyFloat_AsDouble(v.ptr());
  if (t == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_invalid(name, expected, text_of(v));
  }
  if (!isfinite(t) || t <= 0 || t > 1e7) raise_invalid(name, expected, text_of(v));
  return t;
}

bool bool_arg(nb::handle v, const char* name) {
  if (v.ptr() == Py_True) return true;
  if (v.ptr() == Py_False) return false;
  if (v.ptr() != nullptr && PyLong_Check(v.ptr())) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (!overflow && (x == 0 || x == 1)) return x == 1;
  }
  raise_invalid(name, "a bool", text_of(v));
}

std::string str_arg(nb::handle v, const char* name) {
  if (v.ptr() == nullptr || !PyUnicode_Check(v.ptr())) raise_invalid(name, "a str", text_of(v));
  return nb::cast<std::string>(v);
}

proxy::Proxy& proxy_arg(nb::handle v, const char* name) {
  proxy::Proxy* p = nullptr;
  if (v.ptr() == nullptr || !nb::try_cast(v, p, false) || p == nullptr)
    raise_invalid(name, "a uccl_ep._C.Proxy", text_of(v));
  return *p;
}

const char* dtype_name_of(int code, int bits) {
  switch (code) {
    case int(nb::dlpack::dtype_code::Int):
      return bits == 8 ? "int8" : bits == 16 ? "int16" : bits == 32 ? "int32" : "int64";
    case int(nb::dlpack::dtype_code::UInt):
      return bits == 8 ? "uint8" : bits == 16 ? "uint16" : bits == 32 ? "uint32" : "uint64";
    case int(nb::dlpack::dtype_code::Float):
      return bits == 32 ? "float32" : "float64";
    default:
      return "the expected dtype";
  }
}

}  // namespace uccl_ep::bindings
