// The table of transport backends. One line per backend; each backend lives in its own file.
//
// NOTES: an explicit table instead of self-registering static objects: the core is a static
// library, and the linker drops object files nothing references, so self-registration would
// silently lose backends.
#include <stdexcept>

#include "transport/transport.h"

namespace uccl_ep {
namespace transport {

// Defined by the backends.
std::unique_ptr<Transport> make_loop(const Options&);
std::string loop_unavailable_reason();
std::unique_ptr<Transport> make_fabric(const Options&);
std::string fabric_unavailable_reason();
std::unique_ptr<Transport> make_ipc(const Options&);
std::string ipc_unavailable_reason();
std::unique_ptr<Transport> make_fault(std::unique_ptr<Transport> inner, const Options&);
std::unique_ptr<Transport> make_split(std::unique_ptr<Transport> local, std::unique_ptr<Transport> remote,
                                      const Options&);

namespace {

struct Entry {
  const char* name;
  std::unique_ptr<Transport> (*make)(const Options&);
  std::string (*unavailable)();
};

const Entry kBackends[] = {
    {"loop", &make_loop, &loop_unavailable_reason},
    {"fabric", &make_fabric, &fabric_unavailable_reason},
    {"ipc", &make_ipc, &ipc_unavailable_reason},
};

const Entry* find(const std::string& name) {
  for (const Entry& e : kBackends)
    if (name == e.name) return &e;
  return nullptr;
}

std::string known() {
  std::string s;
  for (const Entry& e : kBackends) s += std::string(s.empty() ? "" : ", ") + e.name;
  return s + " (or fault:<one of them>, or <local>+<remote> such as ipc+fabric)";
}

}  // namespace

std::unique_ptr<Transport> create(const std::string& name, const Options& options) {
  const std::string fault_prefix = "fault:";
  if (name.compare(0, fault_prefix.size(), fault_prefix) == 0) {
    return make_fault(create(name.substr(fault_prefix.size()), options), options);
  }
  const size_t plus = name.find('+');
  if (plus != std::string::npos)
    return make_split(create(name.substr(0, plus), options), create(name.substr(plus + 1), options), options);
  const Entry* e = find(name);
  if (e == nullptr) throw TransportError("unknown transport '" + name + "'; known: " + known());
  return e->make(options);
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Entry& e : kBackends) names.push_back(e.name);
  return names;
}

std::string unavailable_reason(const std::string& name) {
  const std::string fault_prefix = "fault:";
  if (name.compare(0, fault_prefix.size(), fault_prefix) == 0) return unavailable_reason(name.substr(6));
  const size_t plus = name.find('+');
  if (plus != std::string::npos) {
    const std::string a = unavailable_reason(name.substr(0, plus));
    return a.empty() ? unavailable_reason(name.substr(plus + 1)) : a;
  }
  const Entry* e = find(name);
  if (e == nullptr) return "unknown transport '" + name + "'; known: " + known();
  return e->unavailable();
}

}  // namespace transport
}  // namespace uccl_ep
