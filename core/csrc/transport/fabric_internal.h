// What the fabric transport (fabric.cc) and its domain discovery (fabric_domains.cc) share: the
// dlopen'ed libfabric entry points, the default provider order and the endpoint hints. Private to
// the transport folder; nothing outside it includes this header.
#pragma once

#if defined(UCCL_EP_HAVE_FABRIC_HEADERS)
#include <stdint.h>

#include <string>

#include <rdma/fabric.h>

namespace uccl_ep {
namespace transport {
namespace fabric_detail {

// The few exported libfabric functions, resolved at run time.
struct Api {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**) = nullptr;
  void (*freeinfo)(fi_info*) = nullptr;
  fi_info* (*dupinfo)(const fi_info*) = nullptr;
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*) = nullptr;
  const char* (*strerror)(int) = nullptr;
  uint32_t (*version)() = nullptr;
  std::string error;
};

// Loaded once per process; getinfo == nullptr means unusable and `error` says why.
const Api& api();

// NOTES: efa first (production), then verbs through rxm (IB/RoCE), then tcp (anything with IP).
inline constexpr const char* kDefaultProviders[] = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm"};

// Hints for an RDM endpoint with RMA writes carrying remote CQ data, for one provider; with `hmem`
// the provider must also register GPU memory (FI_HMEM; GPUDirect RDMA on efa / verbs). The caller
// frees them with api().freeinfo.
fi_info* rma_hints(const std::string& provider, bool hmem = false);

// The libfabric API version to ask fi_getinfo for.
uint32_t api_version();

}  // namespace fabric_detail
}  // namespace transport
}  // namespace uccl_ep

#endif  // UCCL_EP_HAVE_FABRIC_HEADERS
