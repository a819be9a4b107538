// Named POSIX shared-memory objects: the region of a rank and the endpoints of the loop
// transport live in them so that ranks in other processes of the host can map them.
#pragma once

#include <stddef.h>

#include <memory>
#include <string>

namespace uccl_ep {
namespace transport {

class ShmObject {
 public:
  // Creates (exclusively) and maps a zero-filled object; throws TransportError.
  static std::unique_ptr<ShmObject> create(const std::string& name, size_t bytes);
  // Maps an existing object of at least `bytes`; throws TransportError naming the object.
  static std::unique_ptr<ShmObject> open(const std::string& name, size_t bytes);
  ~ShmObject();
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Removes the name (the mapping stays valid); idempotent.
  void unlink();

 private:
  ShmObject(std::string name, void* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), owner_(owner) {}
  std::string name_;
  void* data_;
  size_t bytes_;
  bool owner_;
  bool unlinked_ = false;
};

// "/uccl_ep_<job key prefix>_<pid>_<n>_<what>": unique per job, process and call; short enough
// for NAME_MAX.
std::string shm_name(const std::string& job_key, const std::string& what);

}  // namespace transport
}  // namespace uccl_ep
