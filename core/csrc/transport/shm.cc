#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>

#include "transport/transport.h"

namespace uccl_ep {
namespace transport {

namespace {

std::string errno_text(const std::string& what, const std::string& name) {
  return what + " of shared memory '" + name + "' failed: " + strerror(errno);
}

void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string msg = errno_text("mmap", name);
    close(fd);
    throw TransportError(msg);
  }
  close(fd);
  return p;
}

}  // namespace

std::unique_ptr<ShmObject> ShmObject::create(const std::string& name, size_t bytes) {
  // NOTES: tmpfs allocates pages when they are touched; a region larger than what /dev/shm has
  // left would die of SIGBUS mid-transfer, so refuse it here with a clear error instead.
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0 && uint64_t(vfs.f_bavail) * vfs.f_frsize < bytes)
    throw TransportError("/dev/shm has " + std::to_string(uint64_t(vfs.f_bavail) * vfs.f_frsize) +
                         " bytes free, shared memory '" + name + "' needs " + std::to_string(bytes) +
                         " (enlarge /dev/shm, e.g. docker --shm-size, or use smaller buffers)");
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw TransportError(errno_text("shm_open(create)", name));
  if (ftruncate(fd, off_t(bytes)) != 0) {
    const std::string msg = errno_text("ftruncate to " + std::to_string(bytes) + " bytes", name);
    close(fd);
    shm_unlink(name.c_str());
    throw TransportError(msg + " (is /dev/shm large enough?)");
  }
  // NOTES: the free-space check above sees only pages already touched: two regions that each fit
  // would both pass it and the second would SIGBUS once written. Reserving the pages now makes
  // every object count against /dev/shm at creation, so the one that does not fit fails here.
  if (bytes > 0) {
    const int rc = posix_fallocate(fd, 0, off_t(bytes));
    if (rc == ENOSPC || rc == EFBIG) {
      struct statvfs now {};
      const uint64_t free_now = statvfs("/dev/shm", &now) == 0 ? uint64_t(now.f_bavail) * now.f_frsize : 0;
      close(fd);
      shm_unlink(name.c_str());
      throw TransportError("/dev/shm cannot hold shared memory '" + name + "' of " + std::to_string(bytes) +
                           " bytes: " + std::to_string(free_now) + " bytes are free once the regions already "
                           "created on this host are counted (enlarge /dev/shm, e.g. docker --shm-size, or use "
                           "smaller buffers)");
    }
  }
  void* p = nullptr;
  try {
    p = map_fd(fd, bytes, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  return std::unique_ptr<ShmObject>(new ShmObject(name, p, bytes, true));
}

std::unique_ptr<ShmObject> ShmObject::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw TransportError(errno_text("shm_open", name) + " (is the peer on this host and alive?)");
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) < bytes) {
    close(fd);
    throw TransportError("shared memory '" + name + "' is smaller than the " + std::to_string(bytes) +
                         " bytes its owner announced");
  }
  return std::unique_ptr<ShmObject>(new ShmObject(name, map_fd(fd, bytes, name), bytes, false));
}

ShmObject::~ShmObject() {
  if (owner_) unlink();
  munmap(data_, bytes_);
}

void ShmObject::unlink() {
  if (owner_ && !unlinked_) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

std::string shm_name(const std::string& job_key, const std::string& what) {
  // NOTES: the per-process sequence number keeps two proxies of one process (two Buffers, or
  // every rank of an in-process test) from colliding.
  static std::atomic<uint64_t> sequence{0};
  const uint64_t n = sequence.fetch_add(1, std::memory_order_relaxed);  // relaxed: only uniqueness matters
  return "/uccl_ep_" + job_key.substr(0, 16) + "_" + std::to_string(getpid()) + "_" + std::to_string(n) + "_" + what;
}

}  // namespace transport
}  // namespace uccl_ep
