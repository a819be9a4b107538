// Lazy GPU runtime: the few entry points uccl_ep uses, resolved with dlsym from libcuda (the CUDA
// driver) or libamdhip64 (the HIP runtime) the first time one is needed (see dynlib.h, gpu_api.h).
// No cuda.h or hip headers at build time: the handful of types and constants below are the CUDA
// driver ABI's, written out once here; the HIP loader (hip_api.cc) maps them onto HIP's.
//
// NOTES: everything that launches or allocates first makes the device current on the calling
// thread: its primary context on CUDA, hipSetDevice on HIP; either is the one torch uses, so
// pointers and streams cross between torch and uccl_ep freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace uccl_ep::runtime::cu {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

struct CUipcMemHandle {
  char reserved[64];
};

// cuLaunchKernelEx's configuration (driver ABI, CUDA >= 12.0).
union CUlaunchAttributeValue {
  char pad[64];
  int cooperative;
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  CUlaunchAttributeValue value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute ABI");

constexpr int kLaunchAttrCooperative = 2;
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;
constexpr int kFuncAttrMaxDynamicSharedBytes = 8;
constexpr int kDevAttrMultiprocessorCount = 16;
constexpr int kDevAttrCcMajor = 75;
constexpr int kDevAttrCcMinor = 76;
constexpr int kDevAttrMaxSharedPerBlockOptin = 97;
constexpr unsigned kHostAllocPortable = 0x01;
constexpr unsigned kHostAllocDeviceMap = 0x02;
constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;
constexpr unsigned kHostRegisterPortable = 0x01;
constexpr unsigned kHostRegisterDeviceMap = 0x02;
constexpr int kPointerAttrMemoryType = 2;
constexpr int kPointerAttrDeviceOrdinal = 9;
constexpr int kMemoryTypeHost = 1;
constexpr int kMemoryTypeDevice = 2;
constexpr int kErrorNotReady = 600;

// Raised for any failing runtime call: "<call>: <CUDA_ERROR_NAME or hipErrorName> (<description>)";
// the parts are kept apart for the bindings (uccl_ep.errors.DeviceError).
class DriverError : public std::runtime_error {
 public:
  DriverError(const std::string& call, int code, const std::string& name, const std::string& description)
      : std::runtime_error(call + ": " + name + " (" + description + ")"),
        code(code),
        call(call),
        name(name),
        description(description) {}
  int code;                 // the runtime's status (CUresult / hipError_t)
  std::string call;         // the entry point that failed (cuMemAlloc_v2, hipMemcpyHtoD, ...)
  std::string name;         // the runtime's name for the status (CUDA_ERROR_OUT_OF_MEMORY, ...)
  std::string description;  // the runtime's text for it
};
// Raised when the GPU runtime cannot be loaded, lacks a needed entry point or finds no device.
class DriverMissing : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Picks the runtime behind every function below: "cuda", "hip", or "auto" (CUDA when libcuda
// loads and initialises, else HIP). Returns whether it is usable, with `why` otherwise. The choice
// is made once per process: naming the other runtime after one was chosen by name, or after one
// is in use, throws std::logic_error; a named runtime that fails stays failed (nothing falls back
// to the other one). After "auto" found neither usable, naming one reports that one's reason.
bool select_runtime(const std::string& which, std::string* why = nullptr);
// The runtime in use ("cuda" / "hip"), or "" while none is chosen or usable.
std::string runtime_name();

// What loading one runtime found, independent of the choice above (for `uccl-ep doctor`).
struct RuntimeProbe {
  bool loadable = false;  // the library dlopen'ed
  bool usable = false;    // ... had every entry point, initialised and found a device
  std::string path;       // the soname or path that loaded
  std::string why;        // why it is not usable
  int version = 0;        // driver (CUDA) / runtime (HIP) version as the library reports it
};
RuntimeProbe probe_runtime(const std::string& which);

// True when the chosen runtime (auto-chosen if none was) is usable; `why` says what failed otherwise.
bool available(std::string* why = nullptr);
int driver_version();
int device_count();
int device_attribute(int device, int attr);
bool can_access_peer(int device, int peer);

// Make `device`'s primary context current on this thread.
void use_device(int device);

CUdeviceptr mem_alloc(int device, size_t bytes);
void mem_free(int device, CUdeviceptr ptr);
// Pinned host memory mapped into the device's address space; returns the host pointer.
void* host_alloc_mapped(int device, size_t bytes, CUdeviceptr* device_ptr);
void host_free(int device, void* host_ptr);
void memset_d8(int device, CUdeviceptr ptr, unsigned char value, size_t bytes, CUstream stream);
void memcpy_dtoh(int device, void* dst, CUdeviceptr src, size_t bytes);
void memcpy_htod(int device, CUdeviceptr dst, const void* src, size_t bytes);
void synchronize(int device);

CUipcMemHandle ipc_get_handle(int device, CUdeviceptr ptr);
CUdeviceptr ipc_open_handle(int device, const CUipcMemHandle& handle);
void ipc_close_handle(int device, CUdeviceptr ptr);

// ---- for the proxy path (ipc transport, GPU-visible FIFOs and counters) ------------------------
// Page-locks existing host memory [p, p + bytes) and maps it for the device; returns the device
// address of p. host_device_pointer gives the device address of any byte of such a range.
CUdeviceptr host_register(int device, void* p, size_t bytes);
void host_unregister(int device, void* p);
CUdeviceptr host_device_pointer(int device, void* p);
// Memory type of a pointer (kMemoryTypeDevice, kMemoryTypeHost, ...) and its device ordinal; 0 and
// -1 when the driver does not know the pointer (plain malloc'ed / mmap'ed memory).
int pointer_memory_type(CUdeviceptr p);
int pointer_device(CUdeviceptr p);
// Base and size of the allocation that contains p.
void mem_address_range(CUdeviceptr p, CUdeviceptr* base, size_t* bytes);
CUstream stream_create_nonblocking(int device);
void stream_destroy(int device, CUstream s);
CUevent event_create(int device);  // without timing
void event_destroy(int device, CUevent e);
void event_record(CUevent e, CUstream s);
// True once everything recorded before the event completed; throws DriverError on a failed copy.
bool event_done(CUevent e);
void memcpy_dtod_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
// Lets this thread issue CUDA calls while another thread captures a CUDA graph in global mode
// (cuThreadExchangeStreamCaptureMode RELAXED); the proxy's threads call it once.
void relax_capture_mode_on_this_thread();

CUmodule module_load(int device, const void* image);
CUfunction module_function(CUmodule module, const std::string& name);
void function_set_max_dynamic_smem(CUfunction f, int bytes);

// Launch `f(params)` where the kernel takes one by-value struct of `params_size` bytes.
void launch(int device, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned smem,
            CUstream stream, const void* params, size_t params_size, bool cooperative, bool programmatic = false);

}  // namespace uccl_ep::runtime::cu
