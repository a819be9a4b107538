// Domain discovery for the `fabric` transport: which NICs (libfabric domains) a provider offers
// for its endpoint, and their PCI addresses, so the proxy can spread its threads over the NICs
// next to each GPU (Options::domain) and `uccl-ep doctor` can list them. Opens no endpoint.
#include <stdio.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "transport/fabric_internal.h"
#include "transport/transport.h"

namespace uccl_ep {
namespace transport {

#if defined(UCCL_EP_HAVE_FABRIC_HEADERS)

using fabric_detail::api;

std::vector<std::string> fabric_domains(const std::string& provider) {
  std::vector<std::string> names;
  for (const auto& [name, pci] : fabric_domain_pci(provider)) names.push_back(name);
  return names;
}

std::vector<std::pair<std::string, std::string>> fabric_domain_pci(const std::string& provider) {
  std::vector<std::pair<std::string, std::string>> out;
  if (api().getinfo == nullptr) return out;
  std::vector<std::string> providers;
  if (!provider.empty()) providers.push_back(provider);
  else
    for (const char* p : fabric_detail::kDefaultProviders) providers.push_back(p);
  for (const std::string& prov : providers) {
    // NOTES: the same hints as the endpoint (fabric.cc), so every domain listed is one the
    // transport can open.
    fi_info* hints = fabric_detail::rma_hints(prov);
    fi_info* info = nullptr;
    const int rc = api().getinfo(fabric_detail::api_version(), nullptr, nullptr, 0, hints, &info);
    api().freeinfo(hints);
    if (rc != 0 || info == nullptr) continue;
    for (fi_info* i = info; i != nullptr; i = i->next) {
      if (i->domain_attr == nullptr || i->domain_attr->name == nullptr) continue;
      const std::string name = i->domain_attr->name;
      if (std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == name; }) != out.end()) continue;
      std::string pci;  // "dddd:bb:dd.f" when the provider reports the NIC's PCI address
      if (i->nic != nullptr && i->nic->bus_attr != nullptr && i->nic->bus_attr->bus_type == FI_BUS_PCI) {
        const fi_pci_attr& a = i->nic->bus_attr->attr.pci;
        char buf[32];
        snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", unsigned(a.domain_id), unsigned(a.bus_id), unsigned(a.device_id),
                 unsigned(a.function_id));
        pci = buf;
      }
      out.emplace_back(name, pci);
    }
    api().freeinfo(info);
    if (!out.empty()) break;  // the provider the transport would use
  }
  return out;
}

#else  // no libfabric headers at build time

std::vector<std::string> fabric_domains(const std::string&) { return {}; }
std::vector<std::pair<std::string, std::string>> fabric_domain_pci(const std::string&) { return {}; }

#endif

}  // namespace transport
}  // namespace uccl_ep
