#include "runtime/cuda_driver.h"

#include <atomic>
#include <mutex>
#include <utility>

#include "runtime/gpu_api.h"

namespace uccl_ep::runtime::cu {
namespace {

// One loader result per vendor, each tried at most once per process.
struct Loaded {
  bool tried = false;
  bool ok = false;
  std::string why;
  Api api;
};
Loaded g_cuda, g_hip;
std::mutex g_mutex;                      // guards the Loaded records and the choice
std::string g_requested;                 // "" until a runtime is chosen (by name or by auto)
std::string g_error;                     // why the chosen runtime is unusable
std::atomic<const Api*> g_active{nullptr};  // set once a usable runtime is chosen

Loaded& load_locked(const std::string& which) {
  Loaded& l = which == "hip" ? g_hip : g_cuda;
  if (!l.tried) {
    l.tried = true;
    l.ok = which == "hip" ? load_hip_api(&l.api, &l.why) : load_cuda_api(&l.api, &l.why);
  }
  return l;
}

void choose_locked(const std::string& which) {
  if (which == "auto") {
    Loaded& c = load_locked("cuda");
    if (c.ok) return choose_locked("cuda");
    Loaded& h = load_locked("hip");
    if (h.ok) return choose_locked("hip");
    g_requested = "auto";
    g_error = "no usable GPU runtime: CUDA: " + c.why + "; HIP: " + h.why;
    return;
  }
  Loaded& l = load_locked(which);
  g_requested = which;
  g_error = l.ok ? "" : l.why;
  if (l.ok) g_active.store(&l.api, std::memory_order_release);
}

const Api& api() {
  if (const Api* a = g_active.load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_requested.empty()) choose_locked("auto");
  if (const Api* a = g_active.load(std::memory_order_acquire)) return *a;
  throw DriverMissing(g_error);
}

void check(const Api& a, CUresult r, const char* what) {
  if (r == 0) return;
  throw DriverError(what, r, a.error_name(r), a.error_string(r));
}

// Calls one entry of the table and throws DriverError, named by the vendor's entry point, on failure.
template <typename... Params, typename... Args>
void call(const Entry<Params...> Api::*entry, Args&&... args) {
  const Api& a = api();
  const Entry<Params...>& e = a.*entry;
  check(a, e.fn(std::forward<Args>(args)...), e.name);
}

}  // namespace

bool select_runtime(const std::string& which, std::string* why) {
  if (which != "cuda" && which != "hip" && which != "auto")
    throw std::invalid_argument("select_runtime: expected 'cuda', 'hip' or 'auto', got '" + which + "'");
  std::lock_guard<std::mutex> lock(g_mutex);
  const Api* active = g_active.load(std::memory_order_acquire);
  if (g_requested.empty()) {
    choose_locked(which);
  } else if (which != "auto" && active != nullptr && which != active->vendor) {
    throw std::logic_error("the GPU runtime of this process is already '" + std::string(active->vendor) +
                           "'; cannot switch to '" + which + "'");
  } else if (which != "auto" && active == nullptr && g_requested != "auto" && which != g_requested) {
    throw std::logic_error("this process chose the GPU runtime '" + g_requested + "' (unusable: " + g_error +
                           "); cannot switch to '" + which + "'");
  } else if (active == nullptr && g_requested == "auto" && which != "auto") {
    choose_locked(which);  // auto found neither usable: report the named one's own reason
  }
  if (why != nullptr) *why = g_error;
  return g_active.load(std::memory_order_acquire) != nullptr;
}

std::string runtime_name() {
  const Api* a = g_active.load(std::memory_order_acquire);
  return a != nullptr ? a->vendor : "";
}

RuntimeProbe probe_runtime(const std::string& which) {
  if (which != "cuda" && which != "hip") throw std::invalid_argument("probe_runtime: expected 'cuda' or 'hip'");
  std::lock_guard<std::mutex> lock(g_mutex);
  const Loaded& l = load_locked(which);
  RuntimeProbe p;
  p.loadable = !l.api.path.empty();
  p.usable = l.ok;
  p.path = l.api.path;
  p.why = l.why;
  p.version = l.api.version;
  return p;
}

bool available(std::string* why) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_requested.empty()) choose_locked("auto");
  if (why != nullptr) *why = g_error;
  return g_active.load(std::memory_order_acquire) != nullptr;
}

int driver_version() { return api().version; }

int device_count() {
  int n = 0;
  call(&Api::DeviceGetCount, &n);
  return n;
}

int device_attribute(int device, int attr) {
  int v = 0;
  call(&Api::DeviceGetAttribute, &v, attr, device);
  return v;
}

bool can_access_peer(int device, int peer) {
  int v = 0;
  call(&Api::DeviceCanAccessPeer, &v, device, peer);
  return v != 0;
}

void use_device(int device) {
  if (device < 0) throw DriverError("use_device", 101, "CUDA_ERROR_INVALID_DEVICE", "negative device index");
  call(&Api::SetDevice, device);
}

CUdeviceptr mem_alloc(int device, size_t bytes) {
  use_device(device);
  CUdeviceptr p = 0;
  call(&Api::MemAlloc, &p, bytes);
  return p;
}

void mem_free(int device, CUdeviceptr ptr) {
  use_device(device);
  call(&Api::MemFree, ptr);
}

void* host_alloc_mapped(int device, size_t bytes, CUdeviceptr* device_ptr) {
  use_device(device);
  void* h = nullptr;
  call(&Api::HostAllocMapped, &h, bytes);
  call(&Api::HostGetDevicePointer, device_ptr, h, 0u);
  return h;
}

void host_free(int device, void* host_ptr) {
  use_device(device);
  call(&Api::HostFree, host_ptr);
}

void memset_d8(int device, CUdeviceptr ptr, unsigned char value, size_t bytes, CUstream stream) {
  use_device(device);
  call(&Api::MemsetD8Async, ptr, value, bytes, stream);
}

void memcpy_dtoh(int device, void* dst, CUdeviceptr src, size_t bytes) {
  use_device(device);
  call(&Api::MemcpyDtoH, dst, src, bytes);
}

void memcpy_htod(int device, CUdeviceptr dst, const void* src, size_t bytes) {
  use_device(device);
  call(&Api::MemcpyHtoD, dst, src, bytes);
}

void synchronize(int device) {
  use_device(device);
  call(&Api::Synchronize);
}

CUipcMemHandle ipc_get_handle(int device, CUdeviceptr ptr) {
  use_device(device);
  CUipcMemHandle h{};
  call(&Api::IpcGetMemHandle, &h, ptr);
  return h;
}

CUdeviceptr ipc_open_handle(int device, const CUipcMemHandle& handle) {
  use_device(device);
  CUdeviceptr p = 0;
  call(&Api::IpcOpenMemHandle, &p, handle);
  return p;
}

void ipc_close_handle(int device, CUdeviceptr ptr) {
  use_device(device);
  call(&Api::IpcCloseMemHandle, ptr);
}

CUdeviceptr host_register(int device, void* p, size_t bytes) {
  use_device(device);
  call(&Api::HostRegister, p, bytes);
  return host_device_pointer(device, p);
}

void host_unregister(int device, void* p) {
  use_device(device);
  call(&Api::HostUnregister, p);
}

CUdeviceptr host_device_pointer(int device, void* p) {
  use_device(device);
  CUdeviceptr d = 0;
  call(&Api::HostGetDevicePointer, &d, p, 0u);
  return d;
}

int pointer_memory_type(CUdeviceptr p) {
  unsigned type = 0;
  // NOTES: memory the runtime never saw (malloc, mmap) answers an invalid-value error: "not ours".
  if (api().PointerGetAttribute.fn(&type, kPointerAttrMemoryType, p) != 0) return 0;
  return int(type);
}

int pointer_device(CUdeviceptr p) {
  int ordinal = -1;
  if (api().PointerGetAttribute.fn(&ordinal, kPointerAttrDeviceOrdinal, p) != 0) return -1;
  return ordinal;
}

void mem_address_range(CUdeviceptr p, CUdeviceptr* base, size_t* bytes) {
  call(&Api::MemGetAddressRange, base, bytes, p);
}

CUstream stream_create_nonblocking(int device) {
  use_device(device);
  CUstream s = nullptr;
  call(&Api::StreamCreateNonBlocking, &s);
  return s;
}

void stream_destroy(int device, CUstream s) {
  use_device(device);
  call(&Api::StreamDestroy, s);
}

CUevent event_create(int device) {
  use_device(device);
  CUevent e = nullptr;
  call(&Api::EventCreateNoTiming, &e);
  return e;
}

void event_destroy(int device, CUevent e) {
  use_device(device);
  call(&Api::EventDestroy, e);
}

void event_record(CUevent e, CUstream s) { call(&Api::EventRecord, e, s); }

bool event_done(CUevent e) {
  const Api& a = api();
  const CUresult r = a.EventQuery.fn(e);
  if (r == kErrorNotReady) return false;  // the same code (600) on CUDA and HIP
  check(a, r, a.EventQuery.name);
  return true;
}

void memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  call(&Api::MemcpyDtoDAsync, dst, src, bytes, s);
}

void relax_capture_mode_on_this_thread() { call(&Api::RelaxCaptureMode); }

CUmodule module_load(int device, const void* image) {
  use_device(device);
  CUmodule m = nullptr;
  call(&Api::ModuleLoadData, &m, image);
  return m;
}

CUfunction module_function(CUmodule module, const std::string& name) {
  const Api& a = api();
  CUfunction f = nullptr;
  check(a, a.ModuleGetFunction.fn(&f, module, name.c_str()), (std::string(a.ModuleGetFunction.name) + "(" + name + ")").c_str());
  return f;
}

void function_set_max_dynamic_smem(CUfunction f, int bytes) { call(&Api::FuncSetMaxDynamicSmem, f, bytes); }

void launch(int device, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned smem,
            CUstream stream, const void* params, size_t params_size, bool cooperative, bool programmatic) {
  (void)params_size;
  use_device(device);
  // NOTES: every kernel takes exactly one by-value parameter struct, so one pointer suffices.
  void* args[1] = {const_cast<void*>(params)};
  call(&Api::Launch, f, grid, block, smem, stream, args, cooperative, programmatic);
}

}  // namespace uccl_ep::runtime::cu
