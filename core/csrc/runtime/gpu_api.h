// The vendor table behind cuda_driver.h: one set of entry points, filled either from libcuda
// (cuda_api.cc) or from libamdhip64 (hip_api.cc). Internal to csrc/runtime.
//
// NOTES: every entry keeps the CUDA driver's calling convention (CUresult status, CUdeviceptr
// addresses, the attribute ids of cuda_driver.h); the HIP loader binds the HIP entry points whose
// C ABI is the same (hipDeviceptr_t and CUdeviceptr are both one 64-bit integer-class argument)
// and wraps the rest. Each entry carries the vendor's own name for error messages.
#pragma once

#include <dlfcn.h>

#include <string>

#include "runtime/cuda_driver.h"

namespace uccl_ep::runtime::cu {

template <typename... Args>
struct Entry {
  CUresult (*fn)(Args...) = nullptr;
  const char* name = "";
};

struct Api {
  const char* vendor = "";  // "cuda" or "hip"
  std::string path;         // the soname that loaded
  int version = 0;          // driver (CUDA) or runtime (HIP) version as the library reports it
  const char* (*error_name)(CUresult) = nullptr;    // never null, "?" when unknown
  const char* (*error_string)(CUresult) = nullptr;  // never null
  Entry<int*> DeviceGetCount;
  Entry<int*, int, int> DeviceGetAttribute;  // (value, attribute id of cuda_driver.h, device)
  Entry<int*, int, int> DeviceCanAccessPeer;
  Entry<int> SetDevice;  // make the device (its primary context) current on this thread
  Entry<> Synchronize;   // the current device
  Entry<CUdeviceptr*, size_t> MemAlloc;
  Entry<CUdeviceptr> MemFree;
  Entry<void**, size_t> HostAllocMapped;  // pinned, portable, mapped, coherent with the device
  Entry<CUdeviceptr*, void*, unsigned> HostGetDevicePointer;
  Entry<void*> HostFree;
  Entry<CUdeviceptr, unsigned char, size_t, CUstream> MemsetD8Async;
  Entry<void*, CUdeviceptr, size_t> MemcpyDtoH;
  Entry<CUdeviceptr, const void*, size_t> MemcpyHtoD;
  Entry<CUipcMemHandle*, CUdeviceptr> IpcGetMemHandle;
  Entry<CUdeviceptr*, CUipcMemHandle> IpcOpenMemHandle;  // lazily enabling peer access
  Entry<CUdeviceptr> IpcCloseMemHandle;
  Entry<CUmodule*, const void*> ModuleLoadData;
  Entry<CUfunction*, CUmodule, const char*> ModuleGetFunction;
  Entry<CUfunction, int> FuncSetMaxDynamicSmem;  // (function, bytes) on the current device
  // (function, grid, block, dynamic smem, stream, kernel params, cooperative, programmatic)
  Entry<CUfunction, const unsigned*, const unsigned*, unsigned, CUstream, void**, bool, bool> Launch;
  Entry<void*, size_t> HostRegister;  // portable and mapped
  Entry<void*> HostUnregister;
  Entry<void*, int, CUdeviceptr> PointerGetAttribute;
  Entry<CUdeviceptr*, size_t*, CUdeviceptr> MemGetAddressRange;
  Entry<CUstream*> StreamCreateNonBlocking;
  Entry<CUstream> StreamDestroy;
  Entry<CUevent*> EventCreateNoTiming;
  Entry<CUevent> EventDestroy;
  Entry<CUevent, CUstream> EventRecord;
  Entry<CUevent> EventQuery;  // kErrorNotReady while pending
  Entry<CUdeviceptr, CUdeviceptr, size_t, CUstream> MemcpyDtoDAsync;
  Entry<> RelaxCaptureMode;  // this thread's stream-capture interaction mode := relaxed
};

// Fill `api` from the vendor's library and initialise it; false with `why` set when the library
// is missing, lacks an entry point, is too old, or finds no usable device.
bool load_cuda_api(Api* api, std::string* why);
bool load_hip_api(Api* api, std::string* why);

// dlsym `symbol` into `entry` (named `name` in errors); records the first missing symbol in *missing.
template <typename... Args>
void bind(void* lib, const char* symbol, const char* name, Entry<Args...>& entry, std::string* missing) {
  entry.fn = reinterpret_cast<CUresult (*)(Args...)>(dlsym(lib, symbol));
  entry.name = name;
  if (entry.fn == nullptr && missing->empty()) *missing = symbol;
}

}  // namespace uccl_ep::runtime::cu
