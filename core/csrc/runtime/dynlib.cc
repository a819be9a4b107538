#include "runtime/dynlib.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace uccl_ep::runtime {

const std::vector<std::string>& candidate_sonames(const std::string& name) {
  static const std::map<std::string, std::vector<std::string>> kCandidates = {
      {"cuda", {"libcuda.so.1", "libcuda.so"}},
      {"hip", {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"}},
      {"fabric", {"libfabric.so.1", "libfabric.so"}},
      {"ibverbs", {"libibverbs.so.1", "libibverbs.so"}},
  };
  auto it = kCandidates.find(name);
  if (it == kCandidates.end()) throw std::invalid_argument("unknown library short name: " + name);
  return it->second;
}

namespace {
struct Cached {
  void* handle = nullptr;
  std::string path;
  std::string error;
  bool tried = false;
};
std::mutex g_mutex;
std::map<std::string, Cached> g_cache;

// The path of a loaded object whose file name starts with `prefix`, or "".
std::string loaded_object(const std::string& prefix) {
  struct Search {
    const std::string* prefix;
    std::string found;
  } s{&prefix, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* arg) -> int {
        auto* s = static_cast<Search*>(arg);
        const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const std::string base = path.substr(path.find_last_of('/') + 1);
        if (base.compare(0, s->prefix->size(), *s->prefix) != 0) return 0;
        s->found = path;
        return 1;
      },
      &s);
  return s.found;
}
}  // namespace

void* open_library(const std::string& name, std::string* error_out, std::string* path_out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Cached& c = g_cache[name];
  if (!c.tried) {
    c.tried = true;
    if (name == "hip") {
      // NOTES: HIP is a user-space runtime with per-process state (devices, streams, IPC maps):
      // use the copy already in the process (a ROCm torch loads its own libamdhip64) rather than
      // a second one, whose streams and pointers would not be torch's.
      const std::string path = loaded_object("libamdhip64.so");
      if (!path.empty()) c.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (c.handle != nullptr) c.path = path;
    }
    std::vector<std::string> candidates = candidate_sonames(name);
    if (name == "hip") {
      // NOTES: ROCm installs outside the loader's default path; its standard location last.
      const char* rocm = std::getenv("ROCM_PATH");
      candidates.push_back(std::string(rocm != nullptr && *rocm != '\0' ? rocm : "/opt/rocm") + "/lib/libamdhip64.so");
    }
    for (const auto& soname : candidates) {
      if (c.handle != nullptr) break;
      // NOTES: RTLD_LOCAL keeps our copy's symbols from interposing on a framework's own
      // libfabric/libcuda; RTLD_NOW surfaces missing symbols here, not mid-transfer.
      void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) {
        c.handle = h;
        c.path = soname;
        c.error.clear();
        break;
      }
      const char* e = dlerror();
      std::string why = e != nullptr ? e : "cannot load";
      if (why.compare(0, soname.size(), soname) != 0) why = soname + ": " + why;  // name the candidate once
      c.error += (c.error.empty() ? "" : "; ") + why;
    }
  }
  if (error_out != nullptr) *error_out = c.error;
  if (path_out != nullptr) *path_out = c.path;
  return c.handle;
}

LibraryProbe probe_library(const std::string& name) {
  LibraryProbe p;
  p.name = name;
  void* h = open_library(name, &p.error, &p.path);
  p.loadable = h != nullptr;
  if (!p.loadable) return p;
  if (name == "fabric") {
    using fi_version_fn = uint32_t (*)();
    if (auto fn = reinterpret_cast<fi_version_fn>(dlsym(h, "fi_version"))) {
      uint32_t v = fn();
      p.version = std::to_string(v >> 16) + "." + std::to_string(v & 0xffff);
    }
  } else if (name == "cuda") {
    using init_fn = int (*)(unsigned);
    using ver_fn = int (*)(int*);
    auto cu_init = reinterpret_cast<init_fn>(dlsym(h, "cuInit"));
    auto cu_ver = reinterpret_cast<ver_fn>(dlsym(h, "cuDriverGetVersion"));
    int v = 0;
    if (cu_ver != nullptr && cu_ver(&v) == 0) {
      p.version = std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
    }
    (void)cu_init;  // NOTES: probing never initialises the driver; that is the runtime's job.
  } else if (name == "hip") {
    using ver_fn = int (*)(int*);
    auto hip_ver = reinterpret_cast<ver_fn>(dlsym(h, "hipRuntimeGetVersion"));
    int v = 0;
    if (hip_ver != nullptr && hip_ver(&v) == 0) {
      p.version = std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100);
    }
  }
  return p;
}

}  // namespace uccl_ep::runtime
