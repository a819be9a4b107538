// The CUDA driver (libcuda) behind the vendor table of gpu_api.h. Versioned names are the ones
// cuda.h maps to; entries whose arguments differ from the table's are wrapped below.
#include <mutex>
#include <vector>

#include "runtime/dynlib.h"
#include "runtime/gpu_api.h"

namespace uccl_ep::runtime::cu {
namespace {

struct Raw {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DeviceCanAccessPeer)(int*, CUdevice, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemHostAlloc)(void**, size_t, unsigned);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*MemHostRegister)(void*, size_t, unsigned);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*EventCreate)(CUevent*, unsigned);
  CUresult (*ThreadExchangeStreamCaptureMode)(int*);
};
Raw g_raw{};
std::mutex g_ctx_mutex;
std::vector<CUcontext> g_primary;  // per device, retained once

template <typename Fn>
void raw(void* lib, const char* name, Fn& out, std::string* missing) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr && missing->empty()) *missing = name;
}

const char* error_name(CUresult r) {
  const char* s = nullptr;
  g_raw.GetErrorName(r, &s);
  return s != nullptr ? s : "CUDA_ERROR_?";
}

const char* error_string(CUresult r) {
  const char* s = nullptr;
  g_raw.GetErrorString(r, &s);
  return s != nullptr ? s : "";
}

CUresult device_attribute(int* v, int attr, int device) {
  CUdevice d;
  if (CUresult r = g_raw.DeviceGet(&d, device)) return r;
  return g_raw.DeviceGetAttribute(v, attr, d);
}

CUresult can_access_peer(int* v, int device, int peer) {
  CUdevice a, b;
  if (CUresult r = g_raw.DeviceGet(&a, device)) return r;
  if (CUresult r = g_raw.DeviceGet(&b, peer)) return r;
  return g_raw.DeviceCanAccessPeer(v, a, b);
}

// NOTES: the device's primary context is the one the CUDA runtime (and so torch) uses, so
// pointers and streams cross between torch and uccl_ep freely.
CUresult set_device(int device) {
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_ctx_mutex);
    if (device < 0) return 101;  // CUDA_ERROR_INVALID_DEVICE
    if (static_cast<size_t>(device) >= g_primary.size()) g_primary.resize(device + 1, nullptr);
    if (g_primary[device] == nullptr) {
      CUdevice d;
      if (CUresult r = g_raw.DeviceGet(&d, device)) return r;
      if (CUresult r = g_raw.DevicePrimaryCtxRetain(&g_primary[device], d)) return r;
    }
    ctx = g_primary[device];
  }
  return g_raw.CtxSetCurrent(ctx);
}

CUresult host_alloc_mapped(void** p, size_t bytes) {
  return g_raw.MemHostAlloc(p, bytes, kHostAllocPortable | kHostAllocDeviceMap);
}

CUresult ipc_open(CUdeviceptr* p, CUipcMemHandle h) { return g_raw.IpcOpenMemHandle(p, h, kIpcLazyEnablePeerAccess); }

CUresult set_max_dynamic_smem(CUfunction f, int bytes) {
  return g_raw.FuncSetAttribute(f, kFuncAttrMaxDynamicSharedBytes, bytes);
}

CUresult launch(CUfunction f, const unsigned* grid, const unsigned* block, unsigned smem, CUstream stream, void** args,
                bool cooperative, bool programmatic) {
  CUlaunchAttribute attrs[2] = {};
  CUlaunchConfig cfg{};
  cfg.gridDimX = grid[0];
  cfg.gridDimY = grid[1];
  cfg.gridDimZ = grid[2];
  cfg.blockDimX = block[0];
  cfg.blockDimY = block[1];
  cfg.blockDimZ = block[2];
  cfg.sharedMemBytes = smem;
  cfg.hStream = stream;
  unsigned n = 0;
  if (cooperative) {
    attrs[n].id = kLaunchAttrCooperative;
    attrs[n++].value.cooperative = 1;
  }
  if (programmatic) {
    // NOTES: programmatic dependent launch: this kernel may start before the previous kernel on the
    // stream has finished, once every block of that kernel called griddepcontrol.launch_dependents
    // (or exited). Only for kernels that synchronize with their predecessor through memory anyway.
    attrs[n].id = kLaunchAttrProgrammaticStreamSerialization;
    attrs[n++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (n > 0) {
    cfg.attrs = attrs;
    cfg.numAttrs = n;
  }
  return g_raw.LaunchKernelEx(&cfg, f, args, nullptr);
}

CUresult host_register(void* p, size_t bytes) {
  return g_raw.MemHostRegister(p, bytes, kHostRegisterPortable | kHostRegisterDeviceMap);
}

CUresult stream_create(CUstream* s) { return g_raw.StreamCreate(s, 1 /* CU_STREAM_NON_BLOCKING */); }
CUresult event_create(CUevent* e) { return g_raw.EventCreate(e, 2 /* CU_EVENT_DISABLE_TIMING */); }

CUresult relax_capture_mode() {
  int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
  return g_raw.ThreadExchangeStreamCaptureMode(&mode);
}

}  // namespace

bool load_cuda_api(Api* a, std::string* why) {
  std::string err, path;
  void* lib = open_library("cuda", &err, &path);
  if (lib == nullptr) {
    *why = "cannot load the CUDA driver (libcuda.so.1): " + err + "; install the NVIDIA driver";
    return false;
  }
  std::string missing;
  Raw& r = g_raw;
  raw(lib, "cuInit", r.Init, &missing);
  raw(lib, "cuDriverGetVersion", r.DriverGetVersion, &missing);
  raw(lib, "cuGetErrorName", r.GetErrorName, &missing);
  raw(lib, "cuGetErrorString", r.GetErrorString, &missing);
  raw(lib, "cuDeviceGet", r.DeviceGet, &missing);
  raw(lib, "cuDeviceGetAttribute", r.DeviceGetAttribute, &missing);
  raw(lib, "cuDeviceCanAccessPeer", r.DeviceCanAccessPeer, &missing);
  raw(lib, "cuDevicePrimaryCtxRetain", r.DevicePrimaryCtxRetain, &missing);
  raw(lib, "cuCtxSetCurrent", r.CtxSetCurrent, &missing);
  raw(lib, "cuMemHostAlloc", r.MemHostAlloc, &missing);
  raw(lib, "cuIpcOpenMemHandle_v2", r.IpcOpenMemHandle, &missing);
  raw(lib, "cuFuncSetAttribute", r.FuncSetAttribute, &missing);
  raw(lib, "cuLaunchKernelEx", r.LaunchKernelEx, &missing);
  raw(lib, "cuMemHostRegister_v2", r.MemHostRegister, &missing);
  raw(lib, "cuStreamCreate", r.StreamCreate, &missing);
  raw(lib, "cuEventCreate", r.EventCreate, &missing);
  raw(lib, "cuThreadExchangeStreamCaptureMode", r.ThreadExchangeStreamCaptureMode, &missing);

  a->vendor = "cuda";
  a->path = path;
  a->error_name = error_name;
  a->error_string = error_string;
  bind(lib, "cuDeviceGetCount", "cuDeviceGetCount", a->DeviceGetCount, &missing);
  bind(lib, "cuCtxSynchronize", "cuCtxSynchronize", a->Synchronize, &missing);
  bind(lib, "cuMemAlloc_v2", "cuMemAlloc", a->MemAlloc, &missing);
  bind(lib, "cuMemFree_v2", "cuMemFree", a->MemFree, &missing);
  bind(lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer", a->HostGetDevicePointer, &missing);
  bind(lib, "cuMemFreeHost", "cuMemFreeHost", a->HostFree, &missing);
  bind(lib, "cuMemsetD8Async", "cuMemsetD8Async", a->MemsetD8Async, &missing);
  bind(lib, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", a->MemcpyDtoH, &missing);
  bind(lib, "cuMemcpyHtoD_v2", "cuMemcpyHtoD", a->MemcpyHtoD, &missing);
  bind(lib, "cuIpcGetMemHandle", "cuIpcGetMemHandle", a->IpcGetMemHandle, &missing);
  bind(lib, "cuIpcCloseMemHandle", "cuIpcCloseMemHandle", a->IpcCloseMemHandle, &missing);
  bind(lib, "cuModuleLoadData", "cuModuleLoadData", a->ModuleLoadData, &missing);
  bind(lib, "cuModuleGetFunction", "cuModuleGetFunction", a->ModuleGetFunction, &missing);
  bind(lib, "cuMemHostUnregister", "cuMemHostUnregister", a->HostUnregister, &missing);
  bind(lib, "cuPointerGetAttribute", "cuPointerGetAttribute", a->PointerGetAttribute, &missing);
  bind(lib, "cuMemGetAddressRange_v2", "cuMemGetAddressRange", a->MemGetAddressRange, &missing);
  bind(lib, "cuStreamDestroy_v2", "cuStreamDestroy", a->StreamDestroy, &missing);
  bind(lib, "cuEventDestroy_v2", "cuEventDestroy", a->EventDestroy, &missing);
  bind(lib, "cuEventRecord", "cuEventRecord", a->EventRecord, &missing);
  bind(lib, "cuEventQuery", "cuEventQuery", a->EventQuery, &missing);
  bind(lib, "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync", a->MemcpyDtoDAsync, &missing);
  if (!missing.empty()) {
    *why = "libcuda (" + path + ") lacks entry point " + missing + " (driver too old? uccl_ep needs a CUDA 12.0+ driver)";
    return false;
  }
  a->DeviceGetAttribute = {device_attribute, "cuDeviceGetAttribute"};
  a->DeviceCanAccessPeer = {can_access_peer, "cuDeviceCanAccessPeer"};
  a->SetDevice = {set_device, "cuCtxSetCurrent(primary context)"};
  a->HostAllocMapped = {host_alloc_mapped, "cuMemHostAlloc"};
  a->IpcOpenMemHandle = {ipc_open, "cuIpcOpenMemHandle"};
  a->FuncSetMaxDynamicSmem = {set_max_dynamic_smem, "cuFuncSetAttribute"};
  a->Launch = {launch, "cuLaunchKernelEx"};
  a->HostRegister = {host_register, "cuMemHostRegister"};
  a->StreamCreateNonBlocking = {stream_create, "cuStreamCreate"};
  a->EventCreateNoTiming = {event_create, "cuEventCreate"};
  a->RelaxCaptureMode = {relax_capture_mode, "cuThreadExchangeStreamCaptureMode"};

  if (CUresult rc = r.Init(0)) {
    *why = std::string("cuInit failed: ") + error_name(rc) + " (no usable GPU or driver)";
    return false;
  }
  r.DriverGetVersion(&a->version);
  return true;
}

}  // namespace uccl_ep::runtime::cu
