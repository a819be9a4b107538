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
std::unique_ptr<Transport> make_nic_model(std::unique_ptr<Transport> inner, const std::string& spec, const Options&);
void check_nic_model(const std::string& spec);
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
  return s + " (or fault:<one of them>, nic:<model>:<one of them>, or <local>+<remote> such as ipc+fabric)";
}

const std::string kFault = "fault:";
const std::string kNic = "nic:";

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// "nic:<model>:<inner>" -> (model, inner); the model holds no ':'.
std::pair<std::string, std::string> split_nic(const std::string& name) {
  const size_t colon = name.find(':', kNic.size());
  if (colon == std::string::npos)
    throw TransportError("transport '" + name + "': expected nic:<model>:<inner transport>");
  return {name.substr(kNic.size(), colon - kNic.size()), name.substr(colon + 1)};
}

}  // namespace

std::unique_ptr<Transport> create(const std::string& name, const Options& options) {
  if (starts_with(name, kFault)) return make_fault(create(name.substr(kFault.size()), options), options);
  if (starts_with(name, kNic)) {
    const auto [model, inner] = split_nic(name);
    check_nic_model(model);  // a bad model fails before the inner endpoint is opened
    return make_nic_model(create(inner, options), model, options);
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
  if (starts_with(name, kFault)) return unavailable_reason(name.substr(kFault.size()));
  if (starts_with(name, kNic)) {
    try {
      const auto [model, inner] = split_nic(name);
      check_nic_model(model);
      return unavailable_reason(inner);
    } catch (const TransportError& e) {
      return e.what();
    }
  }
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
