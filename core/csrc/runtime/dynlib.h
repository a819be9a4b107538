// Run-time loading of vendor libraries (CUDA driver, HIP, libfabric, ibverbs).
//
// NOTES: uccl_ep links none of these at build time, so one wheel installs on any machine; a
// library is looked up the first time a feature needs it, and a missing one becomes a clear,
// typed error naming what to install instead of an ImportError at `import uccl_ep`.
#pragma once

#include <string>
#include <vector>

namespace uccl_ep::runtime {

// What a probe of one library found.
struct LibraryProbe {
  std::string name;          // short name: "cuda", "hip", "fabric", "ibverbs"
  bool loadable = false;     // dlopen succeeded for one of the candidate sonames
  std::string path;          // the soname that loaded, or "" when none did
  std::string error;         // dlerror() of the last candidate when none loaded
  std::string version;       // library-reported version where it has an API for it, else ""
};

// Candidate sonames tried in order for each short name.
const std::vector<std::string>& candidate_sonames(const std::string& name);

// dlopen (RTLD_NOW | RTLD_LOCAL) the first loadable candidate (for "hip", a libamdhip64 already in
// the process first); returns the handle or nullptr, with every candidate's dlerror() in *error_out.
// The handle is cached for the life of the process; callers never dlclose it.
void* open_library(const std::string& name, std::string* error_out = nullptr,
                   std::string* path_out = nullptr);

// Probe one library: loadable, path, and its version when it exposes one.
LibraryProbe probe_library(const std::string& name);

}  // namespace uccl_ep::runtime
