/* Stand-in for libamdhip64 (core/tests/cpu/test_hip_runtime_loader.py): exports the hip* entry points
 * uccl_ep's HIP loader binds, records each call as one line in $STANDIN_LOG ("none": no log, for
 * host-path timings: tools/lab/host_path_standin.py), and keeps "device" memory in host memory so
 * the loader's copies and memsets act on something real. Behaviour:
 *   STANDIN_VERSION      hipRuntimeGetVersion's answer (default 60342134: ROCm 6.3)
 *   STANDIN_INIT_ERROR   hipInit's status (default 0)
 *   STANDIN_DEVICES      hipGetDeviceCount's answer (default 2)
 *   STANDIN_PARAM_BYTES  "kernel=bytes,...": how many bytes of a launch's parameter struct to log
 *   STANDIN_FAIL         "entry=status,...": those entry points return that status and do nothing
 *                        (hipExtMallocWithFlags, hipMemcpyHtoD, hipMemcpyDtoH, hipDeviceSynchronize,
 *                        hipModuleLaunchKernel, hipHostRegister), logged as "<entry> -> <status>"
 * Built with -DOMIT_<name> to leave one entry point out. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char reserved[64]; } ipc_handle;

/* STANDIN_LOG=none: no log at all (a host-path timing wants the calls at their own cost). */
static int log_off(void) {
  static int off = -1;
  if (off < 0) {
    const char* p = getenv("STANDIN_LOG");
    off = p && strcmp(p, "none") == 0;
  }
  return off;
}
static FILE* log_file(void) {
  static FILE* f;
  if (!f) {
    const char* p = getenv("STANDIN_LOG");
    f = fopen(p ? p : "/dev/null", "a");
    setvbuf(f, NULL, _IOLBF, 0);
  }
  return f;
}
#define LOG(...) (log_off() ? 0 : (fprintf(log_file(), __VA_ARGS__), fputc('\n', log_file()), fflush(log_file())))

static int env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  return v ? atoi(v) : dflt;
}

/* The status STANDIN_FAIL gives entry point `fn` (0: succeed). */
static int injected(const char* fn) {
  const char* spec = getenv("STANDIN_FAIL");
  char key[80];
  snprintf(key, sizeof key, "%s=", fn);
  const char* at = spec ? strstr(spec, key) : NULL;
  if (!at || (at != spec && at[-1] != ',')) return 0;
  const int status = atoi(at + strlen(key));
  LOG("%s -> %d", fn, status);
  return status;
}
#define FAIL_IF_ASKED(fn) do { int status_ = injected(fn); if (status_) return status_; } while (0)

static int current;
static char function_names[16][64];
static int num_functions;

int hipInit(unsigned flags) { LOG("hipInit %u", flags); return env_int("STANDIN_INIT_ERROR", 0); }
int hipRuntimeGetVersion(int* v) { *v = env_int("STANDIN_VERSION", 60342134); LOG("hipRuntimeGetVersion"); return 0; }
const char* hipGetErrorName(int e) {
  switch (e) {
    case 100: return "hipErrorNoDevice";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 700: return "hipErrorIllegalAddress";
    default: return "hipErrorUnknown";
  }
}
const char* hipGetErrorString(int e) {
  switch (e) {
    case 2: return "out of memory";
    case 700: return "an illegal memory access was encountered";
    default: return "stand-in error";
  }
}
int hipGetDeviceCount(int* n) { *n = env_int("STANDIN_DEVICES", 2); LOG("hipGetDeviceCount"); return 0; }
int hipGetDevice(int* d) { *d = current; return 0; }
int hipSetDevice(int d) { current = d; LOG("hipSetDevice %d", d); return 0; }
int hipDeviceGetAttribute(int* v, int attr, int d) {
  LOG("hipDeviceGetAttribute %d %d", attr, d);
  switch (attr) {
    case 63: *v = 304; return 0;    /* multiprocessor count (MI300X: 304 CUs) */
    case 74: *v = 65536; return 0;  /* max shared memory per block */
    case 23: *v = 9; return 0;
    case 61: *v = 4; return 0;
    default: return 1;
  }
}
int hipDeviceCanAccessPeer(int* v, int a, int b) { LOG("hipDeviceCanAccessPeer %d %d", a, b); *v = 1; return 0; }
int hipDeviceSynchronize(void) { FAIL_IF_ASKED("hipDeviceSynchronize"); LOG("hipDeviceSynchronize"); return 0; }
int hipExtMallocWithFlags(void** p, size_t n, unsigned flags) {
  FAIL_IF_ASKED("hipExtMallocWithFlags");
  *p = calloc(1, n);
  LOG("hipExtMallocWithFlags %zu 0x%x %p", n, flags, *p);
  return 0;
}
int hipFree(void* p) { LOG("hipFree %p", p); free(p); return 0; }
int hipHostMalloc(void** p, size_t n, unsigned flags) {
  *p = calloc(1, n);
  LOG("hipHostMalloc %zu 0x%x %p", n, flags, *p);
  return 0;
}
int hipHostGetDevicePointer(void** d, void* h, unsigned flags) { *d = h; LOG("hipHostGetDevicePointer %p %u", h, flags); return 0; }
int hipHostFree(void* p) { LOG("hipHostFree %p", p); free(p); return 0; }
int hipMemsetD8Async(void* p, unsigned char v, size_t n, void* s) {
  memset(p, v, n);
  LOG("hipMemsetD8Async %p %u %zu %p", p, v, n, s);
  return 0;
}
int hipMemcpyDtoH(void* dst, void* src, size_t n) {
  FAIL_IF_ASKED("hipMemcpyDtoH");
  memcpy(dst, src, n);
  LOG("hipMemcpyDtoH %p %zu", src, n);
  return 0;
}
int hipMemcpyHtoD(void* dst, const void* src, size_t n) {
  FAIL_IF_ASKED("hipMemcpyHtoD");
  memcpy(dst, src, n);
  LOG("hipMemcpyHtoD %p %zu", dst, n);
  return 0;
}
int hipIpcGetMemHandle(ipc_handle* h, void* p) {
  memset(h, 0, sizeof(*h));
  memcpy(h->reserved, &p, sizeof(p));
  LOG("hipIpcGetMemHandle %p", p);
  return 0;
}
int hipIpcOpenMemHandle(void** p, ipc_handle h, unsigned flags) {
  memcpy(p, h.reserved, sizeof(*p));
  LOG("hipIpcOpenMemHandle %p 0x%x", *p, flags);
  return 0;
}
int hipIpcCloseMemHandle(void* p) { LOG("hipIpcCloseMemHandle %p", p); return 0; }
int hipModuleLoadData(void** m, const void* image) {
  const unsigned char* b = image;
  uint32_t e_flags = 0;
  if (memcmp(b, "\x7f" "ELF", 4) == 0) memcpy(&e_flags, b + 48, 4); /* Elf64_Ehdr.e_flags */
  LOG("hipModuleLoadData elf=%d mach=0x%x", memcmp(b, "\x7f" "ELF", 4) == 0, e_flags & 0xff);
  *m = (void*)0x1000;
  return 0;
}
int hipModuleGetFunction(void** f, void* m, const char* name) {
  (void)m;
  LOG("hipModuleGetFunction %s", name);
  snprintf(function_names[num_functions], 64, "%s", name);
  *f = function_names[num_functions++];
  return 0;
}
static void log_launch(const char* what, void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned smem, void* stream, void** params) {
  if (log_off()) return;
  const char* name = f;
  char key[80], hex[4096] = "";
  size_t n = 0;
  const char* spec = getenv("STANDIN_PARAM_BYTES");
  snprintf(key, sizeof key, "%s=", name);
  const char* at = spec ? strstr(spec, key) : NULL;
  if (at) n = (size_t)atoi(at + strlen(key));
  for (size_t i = 0; i < n && 2 * i + 2 < sizeof hex; ++i) sprintf(hex + 2 * i, "%02x", ((unsigned char*)params[0])[i]);
  LOG("%s %s %u %u %u %u %u %u %u %p %s", what, name, gx, gy, gz, bx, by, bz, smem, stream, hex);
}
int hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned smem, void* stream, void** params, void** extra) {
  (void)extra;
  FAIL_IF_ASKED("hipModuleLaunchKernel");
  log_launch("hipModuleLaunchKernel", f, gx, gy, gz, bx, by, bz, smem, stream, params);
  return 0;
}
#ifndef OMIT_hipModuleLaunchCooperativeKernel
int hipModuleLaunchCooperativeKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned smem, void* stream, void** params) {
  log_launch("hipModuleLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, smem, stream, params);
  return 0;
}
#endif
int hipHostRegister(void* p, size_t n, unsigned flags) { FAIL_IF_ASKED("hipHostRegister"); LOG("hipHostRegister %p %zu 0x%x", p, n, flags); return 0; }
int hipHostUnregister(void* p) { LOG("hipHostUnregister %p", p); return 0; }
int hipPointerGetAttribute(void* data, int attr, void* p) { (void)data; LOG("hipPointerGetAttribute %d %p", attr, p); return 1; }
int hipMemGetAddressRange(void** base, size_t* n, void* p) { *base = p; *n = 0; LOG("hipMemGetAddressRange %p", p); return 0; }
int hipStreamCreateWithFlags(void** s, unsigned flags) { *s = (void*)0x5151; LOG("hipStreamCreateWithFlags 0x%x", flags); return 0; }
int hipStreamDestroy(void* s) { LOG("hipStreamDestroy %p", s); return 0; }
int hipEventCreateWithFlags(void** e, unsigned flags) { *e = (void*)0xe7e7; LOG("hipEventCreateWithFlags 0x%x", flags); return 0; }
int hipEventDestroy(void* e) { LOG("hipEventDestroy %p", e); return 0; }
int hipEventRecord(void* e, void* s) { LOG("hipEventRecord %p %p", e, s); return 0; }
int hipEventQuery(void* e) { LOG("hipEventQuery %p", e); return 0; }
int hipMemcpyDtoDAsync(void* d, void* s, size_t n, void* st) { memcpy(d, s, n); LOG("hipMemcpyDtoDAsync %zu %p", n, st); return 0; }
int hipThreadExchangeStreamCaptureMode(int* m) { LOG("hipThreadExchangeStreamCaptureMode %d", *m); *m = 0; return 0; }
