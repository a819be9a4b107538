// The HIP runtime (libamdhip64, ROCm 6.0 or newer) behind the vendor table of gpu_api.h.
//
// NOTES: the constants below are HIP's ABI (hip_runtime_api.h of ROCm 6 and 7), written out once
// so that no HIP header is needed at build time. Where HIP's entry point takes the same arguments
// as the CUDA driver's, the table binds it directly; the others are wrapped here.
#include <string>

#include "runtime/dynlib.h"
#include "runtime/gpu_api.h"

namespace uccl_ep::runtime::cu {
namespace {

// hipDeviceAttribute_t (unchanged from ROCm 5 through 7)
constexpr int kHipAttrComputeCapabilityMajor = 23;
constexpr int kHipAttrComputeCapabilityMinor = 61;
constexpr int kHipAttrMultiprocessorCount = 63;
constexpr int kHipAttrMaxSharedMemoryPerBlock = 74;
constexpr unsigned kHipDeviceMallocUncached = 0x3;
constexpr unsigned kHipHostMallocPortable = 0x1;
constexpr unsigned kHipHostMallocMapped = 0x2;
constexpr unsigned kHipHostMallocCoherent = 0x40000000;
constexpr unsigned kHipHostRegisterPortable = 0x1;
constexpr unsigned kHipHostRegisterMapped = 0x2;
constexpr unsigned kHipIpcMemLazyEnablePeerAccess = 0x1;  // 0 before ROCm 6
constexpr unsigned kHipStreamNonBlocking = 0x1;
constexpr unsigned kHipEventDisableTiming = 0x2;
constexpr int kHipStreamCaptureModeRelaxed = 2;
constexpr int kHipErrorInvalidValue = 1;
constexpr int kHipMinVersion = 60000000;  // HIP_VERSION of ROCm 6.0: major * 1e7 + minor * 1e5 + patch

struct Raw {
  CUresult (*Init)(unsigned);
  CUresult (*RuntimeGetVersion)(int*);
  const char* (*GetErrorName)(CUresult);
  const char* (*GetErrorString)(CUresult);
  CUresult (*GetDevice)(int*);
  CUresult (*DeviceGetAttribute)(int*, int, int);
  CUresult (*ExtMallocWithFlags)(CUdeviceptr*, size_t, unsigned);
  CUresult (*HostMalloc)(void**, size_t, unsigned);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*ModuleLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 CUstream, void**, void**);
  CUresult (*ModuleLaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, CUstream, void**);
  CUresult (*HostRegister)(void*, size_t, unsigned);
  CUresult (*StreamCreateWithFlags)(CUstream*, unsigned);
  CUresult (*EventCreateWithFlags)(CUevent*, unsigned);
  CUresult (*ThreadExchangeStreamCaptureMode)(int*);
};
Raw g_raw{};

template <typename Fn>
void raw(void* lib, const char* name, Fn& out, std::string* missing) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr && missing->empty()) *missing = name;
}

const char* error_name(CUresult r) {
  const char* s = g_raw.GetErrorName(r);
  return s != nullptr ? s : "hipError?";
}

const char* error_string(CUresult r) {
  const char* s = g_raw.GetErrorString(r);
  return s != nullptr ? s : "";
}

// uccl_ep's attribute ids are the CUDA driver's (cuda_driver.h); HIP numbers them otherwise.
CUresult device_attribute(int* v, int attr, int device) {
  int hip_attr = -1;
  switch (attr) {
    case kDevAttrMultiprocessorCount: hip_attr = kHipAttrMultiprocessorCount; break;
    case kDevAttrCcMajor: hip_attr = kHipAttrComputeCapabilityMajor; break;
    case kDevAttrCcMinor: hip_attr = kHipAttrComputeCapabilityMinor; break;
    // NOTES: AMD has no opt-in for larger dynamic LDS: the per-block maximum is the opt-in maximum.
    case kDevAttrMaxSharedPerBlockOptin: hip_attr = kHipAttrMaxSharedMemoryPerBlock; break;
    default: return kHipErrorInvalidValue;
  }
  return g_raw.DeviceGetAttribute(v, hip_attr, device);
}

// NOTES: uncached fine-grained device memory. Peers store into it over xGMI and poll flags in it
// while kernels run; coarse-grained memory (hipMalloc) is coherent only at kernel boundaries.
CUresult mem_alloc(CUdeviceptr* p, size_t bytes) { return g_raw.ExtMallocWithFlags(p, bytes, kHipDeviceMallocUncached); }

// NOTES: coherent (fine-grained) host memory: the proxy's FIFOs and counters are read by one side
// while the other writes them, within one kernel's lifetime.
CUresult host_alloc_mapped(void** p, size_t bytes) {
  return g_raw.HostMalloc(p, bytes, kHipHostMallocPortable | kHipHostMallocMapped | kHipHostMallocCoherent);
}

CUresult ipc_open(CUdeviceptr* p, CUipcMemHandle h) {
  return g_raw.IpcOpenMemHandle(p, h, kHipIpcMemLazyEnablePeerAccess);
}

// NOTES: a HIP module's function takes any dynamic LDS up to the device's per-block maximum
// without an opt-in (hipFuncSetAttribute applies to registered host stubs only), so this checks
// the request against that maximum instead of setting anything.
CUresult set_max_dynamic_smem(CUfunction, int bytes) {
  int device = 0, max_bytes = 0;
  if (CUresult r = g_raw.GetDevice(&device)) return r;
  if (CUresult r = g_raw.DeviceGetAttribute(&max_bytes, kHipAttrMaxSharedMemoryPerBlock, device)) return r;
  return bytes <= max_bytes ? 0 : kHipErrorInvalidValue;
}

// NOTES: HIP has no programmatic dependent launch: such a kernel starts after its predecessor on
// the stream finished (plain stream order, which the overlap only relaxes); arch.cuh makes the
// kernels' griddepcontrol points no-ops on HIP.
CUresult launch(CUfunction f, const unsigned* grid, const unsigned* block, unsigned smem, CUstream stream, void** args,
                bool cooperative, bool /*programmatic*/) {
  if (cooperative)
    return g_raw.ModuleLaunchCooperativeKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                                               stream, args);
  return g_raw.ModuleLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, args,
                                  nullptr);
}

// NOTES: registered host memory is fine-grained (coherent) unless hipExtHostRegisterCoarseGrained.
CUresult host_register(void* p, size_t bytes) {
  return g_raw.HostRegister(p, bytes, kHipHostRegisterPortable | kHipHostRegisterMapped);
}

CUresult stream_create(CUstream* s) { return g_raw.StreamCreateWithFlags(s, kHipStreamNonBlocking); }
CUresult event_create(CUevent* e) { return g_raw.EventCreateWithFlags(e, kHipEventDisableTiming); }

CUresult relax_capture_mode() {
  int mode = kHipStreamCaptureModeRelaxed;
  return g_raw.ThreadExchangeStreamCaptureMode(&mode);
}

std::string version_text(int v) { return std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100); }

}  // namespace

bool load_hip_api(Api* a, std::string* why) {
  std::string err, path;
  void* lib = open_library("hip", &err, &path);
  if (lib == nullptr) {
    *why = "cannot load the HIP runtime (libamdhip64.so): " + err +
           "; install ROCm 6.0+ (or a ROCm torch, which ships it) and put its lib directory on the loader path";
    return false;
  }
  std::string missing;
  Raw& r = g_raw;
  raw(lib, "hipInit", r.Init, &missing);
  raw(lib, "hipRuntimeGetVersion", r.RuntimeGetVersion, &missing);
  raw(lib, "hipGetErrorName", r.GetErrorName, &missing);
  raw(lib, "hipGetErrorString", r.GetErrorString, &missing);
  raw(lib, "hipGetDevice", r.GetDevice, &missing);
  raw(lib, "hipDeviceGetAttribute", r.DeviceGetAttribute, &missing);
  raw(lib, "hipExtMallocWithFlags", r.ExtMallocWithFlags, &missing);
  raw(lib, "hipHostMalloc", r.HostMalloc, &missing);
  raw(lib, "hipIpcOpenMemHandle", r.IpcOpenMemHandle, &missing);
  raw(lib, "hipModuleLaunchKernel", r.ModuleLaunchKernel, &missing);
  raw(lib, "hipModuleLaunchCooperativeKernel", r.ModuleLaunchCooperativeKernel, &missing);
  raw(lib, "hipHostRegister", r.HostRegister, &missing);
  raw(lib, "hipStreamCreateWithFlags", r.StreamCreateWithFlags, &missing);
  raw(lib, "hipEventCreateWithFlags", r.EventCreateWithFlags, &missing);
  raw(lib, "hipThreadExchangeStreamCaptureMode", r.ThreadExchangeStreamCaptureMode, &missing);

  a->vendor = "hip";
  a->path = path;
  a->error_name = error_name;
  a->error_string = error_string;
  bind(lib, "hipGetDeviceCount", "hipGetDeviceCount", a->DeviceGetCount, &missing);
  bind(lib, "hipDeviceCanAccessPeer", "hipDeviceCanAccessPeer", a->DeviceCanAccessPeer, &missing);
  bind(lib, "hipSetDevice", "hipSetDevice", a->SetDevice, &missing);
  bind(lib, "hipDeviceSynchronize", "hipDeviceSynchronize", a->Synchronize, &missing);
  bind(lib, "hipFree", "hipFree", a->MemFree, &missing);
  bind(lib, "hipHostGetDevicePointer", "hipHostGetDevicePointer", a->HostGetDevicePointer, &missing);
  bind(lib, "hipHostFree", "hipHostFree", a->HostFree, &missing);
  bind(lib, "hipMemsetD8Async", "hipMemsetD8Async", a->MemsetD8Async, &missing);
  bind(lib, "hipMemcpyDtoH", "hipMemcpyDtoH", a->MemcpyDtoH, &missing);
  bind(lib, "hipMemcpyHtoD", "hipMemcpyHtoD", a->MemcpyHtoD, &missing);
  bind(lib, "hipIpcGetMemHandle", "hipIpcGetMemHandle", a->IpcGetMemHandle, &missing);
  bind(lib, "hipIpcCloseMemHandle", "hipIpcCloseMemHandle", a->IpcCloseMemHandle, &missing);
  bind(lib, "hipModuleLoadData", "hipModuleLoadData", a->ModuleLoadData, &missing);
  bind(lib, "hipModuleGetFunction", "hipModuleGetFunction", a->ModuleGetFunction, &missing);
  bind(lib, "hipHostUnregister", "hipHostUnregister", a->HostUnregister, &missing);
  bind(lib, "hipPointerGetAttribute", "hipPointerGetAttribute", a->PointerGetAttribute, &missing);
  bind(lib, "hipMemGetAddressRange", "hipMemGetAddressRange", a->MemGetAddressRange, &missing);
  bind(lib, "hipStreamDestroy", "hipStreamDestroy", a->StreamDestroy, &missing);
  bind(lib, "hipEventDestroy", "hipEventDestroy", a->EventDestroy, &missing);
  bind(lib, "hipEventRecord", "hipEventRecord", a->EventRecord, &missing);
  bind(lib, "hipEventQuery", "hipEventQuery", a->EventQuery, &missing);
  bind(lib, "hipMemcpyDtoDAsync", "hipMemcpyDtoDAsync", a->MemcpyDtoDAsync, &missing);
  // NOTES: the version first: an old ROCm also lacks entry points, and its version says why.
  const bool have_version = r.RuntimeGetVersion != nullptr && r.RuntimeGetVersion(&a->version) == 0;
  if (have_version && a->version < kHipMinVersion) {
    *why = "the HIP runtime " + path + " is version " + version_text(a->version) + "; uccl_ep needs ROCm 6.0 or newer";
    return false;
  }
  if (!missing.empty()) {
    *why = "libamdhip64 (" + path + ") lacks entry point " + missing + " (uccl_ep needs ROCm 6.0 or newer)";
    return false;
  }
  a->DeviceGetAttribute = {device_attribute, "hipDeviceGetAttribute"};
  a->MemAlloc = {mem_alloc, "hipExtMallocWithFlags(uncached)"};
  a->HostAllocMapped = {host_alloc_mapped, "hipHostMalloc"};
  a->IpcOpenMemHandle = {ipc_open, "hipIpcOpenMemHandle"};
  a->FuncSetMaxDynamicSmem = {set_max_dynamic_smem, "dynamic LDS above the device's per-block maximum"};
  a->Launch = {launch, "hipModuleLaunchKernel"};
  a->HostRegister = {host_register, "hipHostRegister"};
  a->StreamCreateNonBlocking = {stream_create, "hipStreamCreateWithFlags"};
  a->EventCreateNoTiming = {event_create, "hipEventCreateWithFlags"};
  a->RelaxCaptureMode = {relax_capture_mode, "hipThreadExchangeStreamCaptureMode"};

  if (CUresult rc = r.Init(0)) {
    *why = std::string("hipInit failed: ") + error_name(rc) + " (no usable AMD GPU, or /dev/kfd not accessible)";
    return false;
  }
  if (CUresult rc = have_version ? 0 : r.RuntimeGetVersion(&a->version)) {
    *why = std::string("hipRuntimeGetVersion failed: ") + error_name(rc);
    return false;
  }
  if (a->version < kHipMinVersion) {
    *why = "the HIP runtime " + path + " is version " + version_text(a->version) + "; uccl_ep needs ROCm 6.0 or newer";
    return false;
  }
  int n = 0;
  if (CUresult rc = a->DeviceGetCount.fn(&n); rc != 0 || n == 0) {
    *why = rc != 0 ? std::string("hipGetDeviceCount failed: ") + error_name(rc)
                   : std::string("the HIP runtime sees no AMD GPU (check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES)");
    return false;
  }
  return true;
}

}  // namespace uccl_ep::runtime::cu
