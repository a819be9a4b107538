// The copy engines of the `ipc` transport (see ipc.h): memcpy on a worker thread for host
// regions, cuMemcpyDtoDAsync on proxy-owned streams for device regions, or descriptors in a host
// ring that a GPU kernel copies (dma_ring.h); and the process-wide
// table of peers' device memory opened through CUDA IPC handles.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/cuda_driver.h"
#include "transport/ipc.h"
#include "transport/transport.h"
#include "uccl_ep/dma_ring.h"

namespace uccl_ep {
namespace transport {
namespace ipc {

namespace cu = runtime::cu;

namespace {

// ---- host: one worker thread, jobs in submission order ---------------------------------------------
class HostEngine final : public CopyEngine {
 public:
  explicit HostEngine(int num_peers) : done_(new std::atomic<int64_t>[size_t(num_peers)]) {
    for (int p = 0; p < num_peers; ++p) done_[size_t(p)].store(0, std::memory_order_relaxed);
    worker_ = std::thread([this] { run(); });
  }
  ~HostEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  const char* kind() const override { return "host"; }

  bool submit(int peer, uint64_t dst, uint64_t src, uint64_t len, std::string*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({peer, dst, src, len});
    }
    cv_.notify_one();
    return true;
  }

  int64_t completed(int peer, std::string*) override {
    // acquire: pairs with the worker's release; the copied bytes are visible to whoever we
    // hand the immediate to (they acquire the inbox record we release after this).
    return done_[size_t(peer)].load(std::memory_order_acquire);
  }

 private:
  struct Job {
    int peer;
    uint64_t dst, src, len;
  };
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        // NOTES: on stop, finish the queued copies: the transport is being destroyed, and a copy
        // left half done would land later in memory the peer may have reused.
        if (jobs_.empty()) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      memcpy(reinterpret_cast<void*>(job.dst), reinterpret_cast<const void*>(job.src), job.len);
      // release: the bytes above happen-before a completed() that observes this count.
      done_[size_t(job.peer)].fetch_add(1, std::memory_order_release);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::unique_ptr<std::atomic<int64_t>[]> done_;
  std::thread worker_;
};

// ---- CUDA: one non-blocking stream per peer, one event per batch of copies ------------------------
class CudaEngine final : public CopyEngine {
 public:
  CudaEngine(int device, int num_peers) : device_(device), peers_(size_t(num_peers)) {
    std::string why;
    if (!cu::available(&why)) throw TransportError("ipc: device regions need the CUDA driver: " + why);
    // NOTES: streams and a pool of events are made here, at set-up, not on the first copy: the
    // first op runs while a kernel waits on this proxy, and a CUDA call that has to wait for the
    // device there (the host thread may hold the context in cudaMalloc or a module load) would
    // stall the proxy behind the very kernel that waits for it.
    cu::use_device(device_);
    for (PeerQueue& q : peers_) q.stream = cu::stream_create_nonblocking(device_);
    for (int i = 0; i < kSpareEvents; ++i) spare_.push_back(cu::event_create(device_));
  }

  ~CudaEngine() override {
    try {
      cu::use_device(device_);
      // Bounded drain: copies still in flight target peers' memory, which is closed after us.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (PeerQueue& q : peers_) {
        if (q.stream == nullptr) continue;
        cu::CUevent last = cu::event_create(device_);
        cu::event_record(last, q.stream);
        while (!cu::event_done(last) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        cu::event_destroy(device_, last);
        for (auto& ev : q.events) cu::event_destroy(device_, ev.first);
        cu::stream_destroy(device_, q.stream);
      }
      for (cu::CUevent e : spare_) cu::event_destroy(device_, e);
    } catch (const std::exception&) {
      // NOTES: a failed context (e.g. a peer died mid-copy) cannot be cleaned; the process's
      // driver teardown reclaims it.
    }
  }

  const char* kind() const override { return "cuda"; }

  void bind_thread() override {
    cu::use_device(device_);
    // NOTES: the proxy thread issues copies and event queries while the application may be
    // capturing a CUDA graph in global mode on another thread; relaxed mode keeps those calls
    // legal (they touch only our own streams, never the captured one).
    cu::relax_capture_mode_on_this_thread();
  }

  bool submit(int peer, uint64_t dst, uint64_t src, uint64_t len, std::string* error) override {
    PeerQueue& q = peers_[size_t(peer)];
    try {
      if (q.stream == nullptr) q.stream = cu::stream_create_nonblocking(device_);
      cu::memcpy_dtod_async(dst, src, len, q.stream);
    } catch (const std::exception& e) {
      if (error) *error = std::string("ipc copy to rank ") + std::to_string(peer) + ": " + e.what();
      return false;
    }
    ++q.submitted;
    return true;
  }

  int64_t completed(int peer, std::string* error) override {
    PeerQueue& q = peers_[size_t(peer)];
    try {
      // NOTES: one event per poll round covers every copy submitted since the last one, so a
      // burst of small writes costs one cuEventRecord, not one per write.
      if (q.submitted > q.recorded) {
        cu::CUevent e = spare_.empty() ? cu::event_create(device_) : spare_.back();
        if (!spare_.empty()) spare_.pop_back();
        cu::event_record(e, q.stream);
        q.events.emplace_back(e, q.submitted);
        q.recorded = q.submitted;
      }
      while (!q.events.empty() && cu::event_done(q.events.front().first)) {
        q.completed = q.events.front().second;
        spare_.push_back(q.events.front().first);
        q.events.pop_front();
      }
    } catch (const std::exception& e) {
      if (error) *error = std::string("ipc copy to rank ") + std::to_string(peer) + " failed: " + e.what();
      return -1;
    }
    return q.completed;
  }

 private:
  struct PeerQueue {
    cu::CUstream stream = nullptr;
    int64_t submitted = 0, recorded = 0, completed = 0;
    std::deque<std::pair<cu::CUevent, int64_t>> events;  // (event, copies covered), in order
  };
  static constexpr int kSpareEvents = 64;
  int device_;
  std::vector<PeerQueue> peers_;
  std::vector<cu::CUevent> spare_;
};

// ---- kernel: descriptors in a host ring, copied by a GPU kernel (or a test's emulator) --------
// NOTES: the proxy thread makes no CUDA call here: a descriptor is four host stores (dma_ring.h).
// Completion is one ring-wide count, in ring order; per peer we keep the ring indices of its copies
// to answer completed(peer).
class KernelEngine final : public CopyEngine {
 public:
  explicit KernelEngine(int num_peers) : peers_(size_t(num_peers)) {
    void* mem = nullptr;
    if (posix_memalign(&mem, kPage, bytes_) != 0 || mem == nullptr)
      throw TransportError("ipc: cannot allocate the copy ring (" + std::to_string(bytes_) + " bytes)");
    memset(mem, 0, bytes_);
    ring_ = static_cast<uint8_t*>(mem);
  }
  ~KernelEngine() override { free(ring_); }

  const char* kind() const override { return "kernel"; }
  std::vector<uint64_t> ring() const override {
    return {reinterpret_cast<uint64_t>(ring_), bytes_, kDmaRingCapacity};
  }

  bool submit(int peer, uint64_t dst, uint64_t src, uint64_t len, std::string* error) override {
    if (dst == kDmaSkipDst) {  // a device or host region is never at address 0
      if (error) *error = "ipc: copy to address 0";
      return false;
    }
    return post(peer, dst, src, len, error);
  }

  bool skip(int peer, uint64_t len, std::string* error) override {
    if (!post(peer, kDmaSkipDst, 0, len, error)) return false;
    skipped_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
    return true;
  }

  int64_t completed(int peer, std::string*) override {
    PeerCopies& q = peers_[size_t(peer)];
    const uint64_t done_now = done();
    if (done_now != seen_done_) {
      seen_done_ = done_now;
      note_publish_delay();
    }
    while (!q.indices.empty() && q.indices.front() < done_now) {
      q.indices.pop_front();
      ++q.completed;
    }
    return q.completed;
  }

 private:
  struct PeerCopies {
    std::deque<uint64_t> indices;  // ring indices of copies not yet seen complete, in order
    int64_t completed = 0;
  };
  // One descriptor (dst kDmaSkipDst: a skip, dma_ring.h), in ring order.
  bool post(int peer, uint64_t dst, uint64_t src, uint64_t len, std::string* error) {
    if (head_ - done() >= kDmaRingCapacity) {  // cannot happen under the outstanding bound (dma_ring.h)
      if (error) *error = "ipc: the copy ring is full (" + std::to_string(kDmaRingCapacity) + " descriptors not done)";
      return false;
    }
    if (((dst | src | len) & ~kDmaFieldMask) != 0) {
      if (error) *error = "ipc: copy of " + std::to_string(len) + " bytes to " + std::to_string(dst) +
                          " does not fit a descriptor (addresses and lengths below 2^57)";
      return false;
    }
    DmaDesc& d = slots()[head_ & (kDmaRingCapacity - 1)];
    const uint64_t tag = dma_tag(head_);  // every word names its lap (dma_ring.h)
    d.dst = dst | tag;
    d.src = src | tag;
    d.len = len | tag;
    // release: dst, src and len are visible to the consumer before seq says the slot is valid.
    __atomic_store_n(&d.seq, head_ + 1, __ATOMIC_RELEASE);
    posted_rt_[head_ & (kDmaRingCapacity - 1)] = realtime_ns();  // diagnostics: note_publish_delay
    peers_[size_t(peer)].indices.push_back(head_);
    ++head_;
    return true;
  }

  std::vector<std::pair<std::string, uint64_t>> counters() const override {
    return {{"ipc_ring_skipped", skipped_.load(std::memory_order_relaxed)},
            {"ipc_ring_done_seen", seen_.load(std::memory_order_relaxed)},
            {"ipc_ring_done_seen_ns", seen_ns_.load(std::memory_order_relaxed)},
            {"ipc_ring_clock_mismatch", mismatch_.load(std::memory_order_relaxed)},
            {"ipc_ring_taken", taken_.load(std::memory_order_relaxed)},
            {"ipc_ring_push_post_ns", push_post_ns_.load(std::memory_order_relaxed)},
            {"ipc_ring_pushes", pushes_.load(std::memory_order_relaxed)},
            {"ipc_ring_post_seen_ns", post_seen_ns_.load(std::memory_order_relaxed)}};
  }

  DmaDesc* slots() { return reinterpret_cast<DmaDesc*>(ring_ + sizeof(DmaRingHeader)); }
  static int64_t realtime_ns() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return int64_t(ts.tv_sec) * 1000000000ll + ts.tv_nsec;
  }
  // Diagnostics: how much later than at best this thread saw the consumer's `done` (its done_ns),
  // by CLOCK_REALTIME. NOTES: a GPU's %globaltimer and the host's real-time clock differ by an offset
  // (0.6-4 ms between runs on 2 x H200), so one raw difference says nothing; measured from the
  // smallest difference seen so far the offset cancels (the first samples may count a little high).
  // A difference beyond +-1 s, or no stamp, is counted as a clock mismatch instead.
  // That smallest difference is also the offset plus the fastest GPU -> host notice, so GPU stamps
  // shifted by it read on the host clock, late by that fastest notice (< 1 us): with it the
  // consumer's last taken descriptor splits the send kernel's push -> descriptor seen into push ->
  // this thread posted it (the proxy picking the command up) and posted -> seen (the fetch).
  void note_publish_delay() {
    const auto* h = reinterpret_cast<const DmaRingHeader*>(ring_);
    const uint64_t stamp = __atomic_load_n(&h->done_ns, __ATOMIC_RELAXED);
    const int64_t delay = realtime_ns() - int64_t(stamp);
    if (stamp == 0 || delay >= 1000000000ll || delay <= -1000000000ll) {
      mismatch_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (seen_.load(std::memory_order_relaxed) == 0 || delay < min_delay_) min_delay_ = delay;
    seen_ns_.fetch_add(uint64_t(delay - min_delay_), std::memory_order_relaxed);
    seen_.fetch_add(1, std::memory_order_relaxed);
    // relaxed: plain diagnostics the consumer stored before its release of done
    const uint64_t idx = __atomic_load_n(&h->seen_idx, __ATOMIC_RELAXED);
    const int64_t seen_at = int64_t(__atomic_load_n(&h->seen_ns, __ATOMIC_RELAXED)) + min_delay_;
    const int64_t push_at = int64_t(__atomic_load_n(&h->push_ns, __ATOMIC_RELAXED)) + min_delay_;
    if (idx >= head_ || idx + kDmaRingCapacity < head_ || idx == last_taken_ || seen_at == min_delay_) return;
    last_taken_ = idx;
    const int64_t posted = posted_rt_[idx & (kDmaRingCapacity - 1)];
    const int64_t post_seen = seen_at - posted;
    if (post_seen < -1000000000ll || post_seen > 1000000000ll) return;
    // signed sums kept in unsigned words (two's complement): early samples may be slightly negative
    post_seen_ns_.fetch_add(uint64_t(post_seen), std::memory_order_relaxed);
    taken_.fetch_add(1, std::memory_order_relaxed);
    // the LL send kernels stamp their pushes (DmaConsumer::push_ns); the normal-mode copy role does not
    const int64_t push_post = posted - push_at;
    if (push_at == min_delay_ || push_post < -1000000000ll || push_post > 1000000000ll) return;
    push_post_ns_.fetch_add(uint64_t(push_post), std::memory_order_relaxed);
    pushes_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t done() const {
    // acquire: pairs with the consumer's release of done (after its copies): the bytes of every
    // descriptor below it are in the receiver's memory before we deliver the immediates.
    return __atomic_load_n(&reinterpret_cast<DmaRingHeader*>(ring_)->done, __ATOMIC_ACQUIRE);
  }
  // NOTES: whole pages: the GPU runtime registers the ring's pages with the driver, and a page
  // shared with other heap objects would leave them partly registered (a later cudaMemcpy into such
  // a pageable buffer fails with "invalid argument"; seen on 2 x H200).
  static constexpr uint64_t kPage = 4096;
  const uint64_t bytes_ = (dma_ring_bytes() + kPage - 1) / kPage * kPage;
  uint8_t* ring_ = nullptr;
  uint64_t head_ = 0;       // next descriptor index
  uint64_t seen_done_ = 0;  // last done value this thread read
  std::vector<PeerCopies> peers_;
  std::atomic<uint64_t> seen_{0}, seen_ns_{0}, mismatch_{0}, taken_{0}, pushes_{0}, push_post_ns_{0}, post_seen_ns_{0},
      skipped_{0};
  int64_t min_delay_ = 0;  // smallest realtime - done_ns seen (this thread only)
  uint64_t last_taken_ = ~0ull;  // seen_idx of the last sample
  std::vector<int64_t> posted_rt_ = std::vector<int64_t>(kDmaRingCapacity, 0);  // CLOCK_REALTIME per slot at submit
};

// ---- peers' device memory, opened once per process -------------------------------------------------
std::mutex g_open_mu;
std::map<std::string, std::pair<uint64_t, int>> g_open;  // (device:handle) -> (address, users)

std::string open_key(int device, const std::string& handle) { return std::to_string(device) + ":" + handle; }

}  // namespace

std::unique_ptr<CopyEngine> make_host_engine(int num_peers) { return std::make_unique<HostEngine>(num_peers); }

std::unique_ptr<CopyEngine> make_kernel_engine(int num_peers) { return std::make_unique<KernelEngine>(num_peers); }

std::unique_ptr<CopyEngine> make_cuda_engine(int device, int num_peers) {
  return std::make_unique<CudaEngine>(device, num_peers);
}

uint64_t open_peer_memory(int device, const std::string& handle, std::string* error) {
  std::lock_guard<std::mutex> lock(g_open_mu);
  auto it = g_open.find(open_key(device, handle));
  if (it != g_open.end()) {
    ++it->second.second;
    return it->second.first;
  }
  if (handle.size() != sizeof(cu::CUipcMemHandle)) {
    if (error) *error = "malformed CUDA IPC handle (" + std::to_string(handle.size()) + " bytes)";
    return 0;
  }
  cu::CUipcMemHandle h;
  memcpy(h.reserved, handle.data(), sizeof h.reserved);
  uint64_t p = 0;
  try {
    p = cu::ipc_open_handle(device, h);
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return 0;
  }
  g_open[open_key(device, handle)] = {p, 1};
  return p;
}

void close_peer_memory(int device, const std::string& handle) {
  std::lock_guard<std::mutex> lock(g_open_mu);
  auto it = g_open.find(open_key(device, handle));
  if (it == g_open.end() || --it->second.second > 0) return;
  try {
    cu::ipc_close_handle(device, it->second.first);
  } catch (const std::exception&) {
    // the peer's process may be gone; nothing else to release
  }
  g_open.erase(it);
}

}  // namespace ipc
}  // namespace transport
}  // namespace uccl_ep
