#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "runtime/dynlib.h"

namespace uccl_ep::runtime::cu {
namespace {

// One table of entry points, filled once. Versioned names are the ones cuda.h maps to.
struct Api {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DeviceCanAccessPeer)(int*, CUdevice, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)();
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemHostAlloc)(void**, size_t, unsigned);
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*MemFreeHost)(void*);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*IpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*IpcCloseMemHandle)(CUdeviceptr);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*MemHostRegister)(void*, size_t, unsigned);
  CUresult (*MemHostUnregister)(void*);
  CUresult (*PointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*MemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*EventCreate)(CUevent*, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventQuery)(CUevent);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*ThreadExchangeStreamCaptureMode)(int*);
};

std::once_flag g_once;
Api g_api{};
std::string g_error;  // why the API is unusable ("" when usable)
std::mutex g_ctx_mutex;
std::vector<CUcontext> g_primary;  // per device, retained once

template <typename Fn>
void resolve(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr && g_error.empty()) g_error = std::string("libcuda lacks entry point ") + name;
}

void load() {
  std::string err, path;
  void* lib = open_library("cuda", &err, &path);
  if (lib == nullptr) {
    g_error = "cannot load the CUDA driver (libcuda.so.1): " + err +
              "; install the NVIDIA driver, or use backend='reference' / 'host'";
    return;
  }
  Api& a = g_api;
  resolve(lib, "cuInit", a.Init);
  resolve(lib, "cuDriverGetVersion", a.DriverGetVersion);
  resolve(lib, "cuGetErrorName", a.GetErrorName);
  resolve(lib, "cuGetErrorString", a.GetErrorString);
  resolve(lib, "cuDeviceGet", a.DeviceGet);
  resolve(lib, "cuDeviceGetCount", a.DeviceGetCount);
  resolve(lib, "cuDeviceGetAttribute", a.DeviceGetAttribute);
  resolve(lib, "cuDeviceCanAccessPeer", a.DeviceCanAccessPeer);
  resolve(lib, "cuDevicePrimaryCtxRetain", a.DevicePrimaryCtxRetain);
  resolve(lib, "cuCtxSetCurrent", a.CtxSetCurrent);
  resolve(lib, "cuCtxSynchronize", a.CtxSynchronize);
  resolve(lib, "cuMemAlloc_v2", a.MemAlloc);
  resolve(lib, "cuMemFree_v2", a.MemFree);
  resolve(lib, "cuMemHostAlloc", a.MemHostAlloc);
  resolve(lib, "cuMemHostGetDevicePointer_v2", a.MemHostGetDevicePointer);
  resolve(lib, "cuMemFreeHost", a.MemFreeHost);
  resolve(lib, "cuMemsetD8Async", a.MemsetD8Async);
  resolve(lib, "cuMemcpyDtoH_v2", a.MemcpyDtoH);
  resolve(lib, "cuMemcpyHtoD_v2", a.MemcpyHtoD);
  resolve(lib, "cuIpcGetMemHandle", a.IpcGetMemHandle);
  resolve(lib, "cuIpcOpenMemHandle_v2", a.IpcOpenMemHandle);
  resolve(lib, "cuIpcCloseMemHandle", a.IpcCloseMemHandle);
  resolve(lib, "cuModuleLoadData", a.ModuleLoadData);
  resolve(lib, "cuModuleGetFunction", a.ModuleGetFunction);
  resolve(lib, "cuFuncSetAttribute", a.FuncSetAttribute);
  resolve(lib, "cuLaunchKernelEx", a.LaunchKernelEx);
  resolve(lib, "cuMemHostRegister_v2", a.MemHostRegister);
  resolve(lib, "cuMemHostUnregister", a.MemHostUnregister);
  resolve(lib, "cuPointerGetAttribute", a.PointerGetAttribute);
  resolve(lib, "cuMemGetAddressRange_v2", a.MemGetAddressRange);
  resolve(lib, "cuStreamCreate", a.StreamCreate);
  resolve(lib, "cuStreamDestroy_v2", a.StreamDestroy);
  resolve(lib, "cuEventCreate", a.EventCreate);
  resolve(lib, "cuEventDestroy_v2", a.EventDestroy);
  resolve(lib, "cuEventRecord", a.EventRecord);
  resolve(lib, "cuEventQuery", a.EventQuery);
  resolve(lib, "cuMemcpyDtoDAsync_v2", a.MemcpyDtoDAsync);
  resolve(lib, "cuThreadExchangeStreamCaptureMode", a.ThreadExchangeStreamCaptureMode);
  if (!g_error.empty()) {
    g_error += " (driver too old? uccl_ep needs a CUDA 12.0+ driver)";
    return;
  }
  CUresult r = a.Init(0);
  if (r != 0) {
    const char* name = nullptr;
    a.GetErrorName(r, &name);
    g_error = std::string("cuInit failed: ") + (name ? name : "unknown error") + " (no usable GPU or driver)";
  }
}

const Api& api() {
  std::call_once(g_once, load);
  if (!g_error.empty()) throw DriverMissing(g_error);
  return g_api;
}

void check(CUresult r, const char* what) {
  if (r == 0) return;
  const char* name = nullptr;
  const char* desc = nullptr;
  g_api.GetErrorName(r, &name);
  g_api.GetErrorString(r, &desc);
  throw DriverError(std::string(what) + ": " + (name ? name : "CUDA_ERROR_?") + " (" + (desc ? desc : "") + ")", r);
}

}  // namespace

bool available(std::string* why) {
  std::call_once(g_once, load);
  if (why != nullptr) *why = g_error;
  return g_error.empty();
}

int driver_version() {
  int v = 0;
  check(api().DriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

int device_count() {
  int n = 0;
  check(api().DeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

int device_attribute(int device, int attr) {
  CUdevice d;
  check(api().DeviceGet(&d, device), "cuDeviceGet");
  int v = 0;
  check(api().DeviceGetAttribute(&v, attr, d), "cuDeviceGetAttribute");
  return v;
}

bool can_access_peer(int device, int peer) {
  CUdevice a, b;
  check(api().DeviceGet(&a, device), "cuDeviceGet");
  check(api().DeviceGet(&b, peer), "cuDeviceGet");
  int v = 0;
  check(api().DeviceCanAccessPeer(&v, a, b), "cuDeviceCanAccessPeer");
  return v != 0;
}

void use_device(int device) {
  const Api& a = api();
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_ctx_mutex);
    if (device < 0) throw DriverError("use_device: negative device index", 101);
    if (static_cast<size_t>(device) >= g_primary.size()) g_primary.resize(device + 1, nullptr);
    if (g_primary[device] == nullptr) {
      CUdevice d;
      check(a.DeviceGet(&d, device), "cuDeviceGet");
      check(a.DevicePrimaryCtxRetain(&g_primary[device], d), "cuDevicePrimaryCtxRetain");
    }
    ctx = g_primary[device];
  }
  check(a.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

CUdeviceptr mem_alloc(int device, size_t bytes) {
  use_device(device);
  CUdeviceptr p = 0;
  check(api().MemAlloc(&p, bytes), "cuMemAlloc");
  return p;
}

void mem_free(int device, CUdeviceptr ptr) {
  use_device(device);
  check(api().MemFree(ptr), "cuMemFree");
}

void* host_alloc_mapped(int device, size_t bytes, CUdeviceptr* device_ptr) {
  use_device(device);
  void* h = nullptr;
  check(api().MemHostAlloc(&h, bytes, kHostAllocPortable | kHostAllocDeviceMap), "cuMemHostAlloc");
  check(api().MemHostGetDevicePointer(device_ptr, h, 0), "cuMemHostGetDevicePointer");
  return h;
}

void host_free(int device, void* host_ptr) {
  use_device(device);
  check(api().MemFreeHost(host_ptr), "cuMemFreeHost");
}

void memset_d8(int device, CUdeviceptr ptr, unsigned char value, size_t bytes, CUstream stream) {
  use_device(device);
  check(api().MemsetD8Async(ptr, value, bytes, stream), "cuMemsetD8Async");
}

void memcpy_dtoh(int device, void* dst, CUdeviceptr src, size_t bytes) {
  use_device(device);
  check(api().MemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}

void memcpy_htod(int device, CUdeviceptr dst, const void* src, size_t bytes) {
  use_device(device);
  check(api().MemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}

void synchronize(int device) {
  use_device(device);
  check(api().CtxSynchronize(), "cuCtxSynchronize");
}

CUipcMemHandle ipc_get_handle(int device, CUdeviceptr ptr) {
  use_device(device);
  CUipcMemHandle h{};
  check(api().IpcGetMemHandle(&h, ptr), "cuIpcGetMemHandle");
  return h;
}

CUdeviceptr ipc_open_handle(int device, const CUipcMemHandle& handle) {
  use_device(device);
  CUdeviceptr p = 0;
  check(api().IpcOpenMemHandle(&p, handle, kIpcLazyEnablePeerAccess), "cuIpcOpenMemHandle");
  return p;
}

void ipc_close_handle(int device, CUdeviceptr ptr) {
  use_device(device);
  check(api().IpcCloseMemHandle(ptr), "cuIpcCloseMemHandle");
}

CUdeviceptr host_register(int device, void* p, size_t bytes) {
  use_device(device);
  check(api().MemHostRegister(p, bytes, kHostRegisterPortable | kHostRegisterDeviceMap), "cuMemHostRegister");
  return host_device_pointer(device, p);
}

void host_unregister(int device, void* p) {
  use_device(device);
  check(api().MemHostUnregister(p), "cuMemHostUnregister");
}

CUdeviceptr host_device_pointer(int device, void* p) {
  use_device(device);
  CUdeviceptr d = 0;
  check(api().MemHostGetDevicePointer(&d, p, 0), "cuMemHostGetDevicePointer");
  return d;
}

int pointer_memory_type(CUdeviceptr p) {
  unsigned type = 0;
  // NOTES: memory the driver never saw (malloc, mmap) answers CUDA_ERROR_INVALID_VALUE: "not ours".
  if (api().PointerGetAttribute(&type, kPointerAttrMemoryType, p) != 0) return 0;
  return int(type);
}

int pointer_device(CUdeviceptr p) {
  int ordinal = -1;
  if (api().PointerGetAttribute(&ordinal, kPointerAttrDeviceOrdinal, p) != 0) return -1;
  return ordinal;
}

void mem_address_range(CUdeviceptr p, CUdeviceptr* base, size_t* bytes) {
  check(api().MemGetAddressRange(base, bytes, p), "cuMemGetAddressRange");
}

CUstream stream_create_nonblocking(int device) {
  use_device(device);
  CUstream s = nullptr;
  check(api().StreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  return s;
}

void stream_destroy(int device, CUstream s) {
  use_device(device);
  check(api().StreamDestroy(s), "cuStreamDestroy");
}

CUevent event_create(int device) {
  use_device(device);
  CUevent e = nullptr;
  check(api().EventCreate(&e, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
  return e;
}

void event_destroy(int device, CUevent e) {
  use_device(device);
  check(api().EventDestroy(e), "cuEventDestroy");
}

void event_record(CUevent e, CUstream s) { check(api().EventRecord(e, s), "cuEventRecord"); }

bool event_done(CUevent e) {
  const CUresult r = api().EventQuery(e);
  if (r == kErrorNotReady) return false;
  check(r, "cuEventQuery");
  return true;
}

void memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  check(api().MemcpyDtoDAsync(dst, src, bytes, s), "cuMemcpyDtoDAsync");
}

void relax_capture_mode_on_this_thread() {
  int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
  check(api().ThreadExchangeStreamCaptureMode(&mode), "cuThreadExchangeStreamCaptureMode");
}

CUmodule module_load(int device, const void* image) {
  use_device(device);
  CUmodule m = nullptr;
  check(api().ModuleLoadData(&m, image), "cuModuleLoadData");
  return m;
}

CUfunction module_function(CUmodule module, const std::string& name) {
  CUfunction f = nullptr;
  check(api().ModuleGetFunction(&f, module, name.c_str()), ("cuModuleGetFunction(" + name + ")").c_str());
  return f;
}

void function_set_max_dynamic_smem(CUfunction f, int bytes) {
  check(api().FuncSetAttribute(f, kFuncAttrMaxDynamicSharedBytes, bytes), "cuFuncSetAttribute");
}

void launch(int device, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned smem,
            CUstream stream, const void* params, size_t params_size, bool cooperative, bool programmatic) {
  (void)params_size;
  use_device(device);
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
  // NOTES: every kernel takes exactly one by-value parameter struct, so one pointer suffices.
  void* args[1] = {const_cast<void*>(params)};
  check(api().LaunchKernelEx(&cfg, f, args, nullptr), "cuLaunchKernelEx");
}

}  // namespace uccl_ep::runtime::cu
