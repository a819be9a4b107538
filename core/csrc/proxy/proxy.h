// The CPU proxy of one rank: P threads, each owning F FIFOs and one transport endpoint; thread i
// talks only to thread i of every peer. Producers (GPU warps, host threads) push TransferCmds;
// threads post them as writes with 32-bit immediates; receiving threads turn immediates into
// counters in `counters()` that consumers wait on.
//
// Lifecycle: Proxy(config) -> local_info() published at bootstrap -> connect(all infos)
//            -> finalize_setup() once every rank connected -> start() -> ... -> stop().
#pragma once

#include <stdint.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fifo/fifo_host.h"
#include "proxy/errors.h"
#include "transport/transport.h"

namespace uccl_ep {
namespace transport {
class ShmObject;
}
namespace proxy {

class ProxyThread;

struct ProxyConfig {
  int rank = 0;
  int num_ranks = 1;
  int ranks_per_node = 1;        // node = rank / ranks_per_node (barrier leaders, rail scope)
  int num_threads = 4;           // P
  int fifos_per_thread = 2;      // F; FIFO j belongs to thread j % P
  uint32_t fifo_capacity = fifo::kDefaultCapacity;
  uint32_t num_counters = 256;   // counters per source rank
  uint64_t region_bytes = 0;     // this rank's registered region
  uint64_t external_region = 0;  // address of caller-owned memory to register instead of allocating
                                 // (e.g. a GPU runtime's buffer); must outlive the proxy
  std::string transport = "loop";
  std::string ipc_copy;          // ipc only: "kernel" = copies by a GPU kernel from a descriptor ring
                                 // (transport/ipc.h); "" = the driver's copy engine / host memcpy
  std::string provider;          // fabric provider ("" = first usable)
  std::string domains;           // fabric NICs (libfabric domains), comma-separated: thread i uses
                                 // entry i % n ("" = the provider's first domain for every thread)
  std::string token_digest;      // job token digest (hex); also names shared objects
  uint32_t max_inflight = 256;   // posted-not-completed writes per peer per thread
  double timeout_s = 100.0;      // default bound of waits
  double heartbeat_s = 0.0;      // 0 = derive from timeout_s
  int64_t idle_sleep_ns = 50000; // longest sleep of an idle thread; 0 = spin and yield, never sleep; < 0 = spin only
  bool check_remote_bounds = true;  // sender-side bounds check (tests turn it off to exercise the receiver's)
  std::string cpus;              // CPU list for the threads ("" = no pinning), e.g. "0-7,16"
  uint64_t fault_seed = 0;
  double fault_reorder = 0.0;
  uint32_t fault_max_delay = 0;
  double fault_tear = 0.0;
  uint32_t fault_max_pieces = 4;
};

class Proxy {
 public:
  explicit Proxy(const ProxyConfig& config);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // ---- setup -------------------------------------------------------------------------------------
  std::vector<uint8_t> local_info() const;
  // Checks every rank's record (index = rank) and connects the endpoints; throws EpError
  // (kPeerProtocolError for another job's token, kInvalidArgument for mismatched settings).
  void connect(const std::vector<std::vector<uint8_t>>& infos);
  void finalize_setup();
  void start();
  // Stops the threads (after telling peers goodbye); waiters and producers get kAborted.
  void stop();

  // ---- producers ---------------------------------------------------------------------------------
  int num_fifos() const { return int(fifos_.size()); }
  fifo::HostFifo& fifo(int index) { return *fifos_.at(size_t(index)); }
  uint64_t push(int fifo, const protocol::TransferCmd& cmd, double timeout_s);
  void wait_completion(int fifo, uint64_t idx, double timeout_s, const std::string& phase);

  // ---- receivers ---------------------------------------------------------------------------------
  int64_t* counters() const { return counters_; }
  int64_t counter(int src, uint32_t c) const;
  // Waits until counters[src][c] >= target; returns the value. Timeout / PeerFailure / protocol
  // errors are thrown as EpError naming this rank, `src` and `phase`.
  int64_t wait_counter(int src, uint32_t c, int64_t target, double timeout_s, const std::string& phase);
  // Zeroes every counter (only while no transfer is in flight, e.g. between phases).
  void reset_counters();

  uint8_t* region() const { return region_; }
  uint64_t region_bytes() const { return config_.region_bytes; }
  const ProxyConfig& config() const { return config_; }
  std::string transport_name() const;
  std::vector<std::string> transport_devices() const;  // per thread: its transport's device (NIC)
  // Per thread: its transport's copy ring {host address, bytes, capacity} (dma_ring.h), or empty.
  std::vector<std::vector<uint64_t>> copy_rings() const;
  uint64_t peer_region_bytes(int peer) const { return peer_region_bytes_.at(size_t(peer)); }

  // ---- state shared with the threads --------------------------------------------------------------
  // Records the first error, flips every FIFO to failed; later errors are dropped.
  void fail(const ErrorInfo& error);
  // acquire: pairs with fail()'s release; error() is then complete.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  ErrorInfo error() const;
  void throw_if_failed() const;
  void heard_from(int peer);
  void mark_departed(int peer);
  bool departed(int peer) const;
  // Shrink mode: an excluded peer's death does not fail this proxy; it is recorded (dead()),
  // commands to it are dropped, and waits on it raise PeerFailure.
  void set_excluded(int peer, bool excluded);
  bool excluded(int peer) const;
  void mark_dead(int peer);
  bool dead(int peer) const;
  // A peer failed: fails the proxy, or only marks the peer dead when it is excluded.
  void peer_failed(const ErrorInfo& error);
  int64_t last_heard_ns(int peer) const;
  // acquire: pairs with stop()'s release.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  double heartbeat_interval_s() const { return heartbeat_s_; }
  double failure_grace_s() const { return grace_s_; }
  uint64_t stat_commands() const;
  // Every thread's transport counters, summed by name.
  std::vector<std::pair<std::string, uint64_t>> transport_counters() const;
  // Every thread's transport trace (Transport::trace), each event prefixed with the thread index.
  std::vector<int64_t> transport_trace() const;

 private:
  ProxyConfig config_;
  double heartbeat_s_ = 0.5;
  double grace_s_ = 5.0;
  std::unique_ptr<transport::ShmObject> region_shm_;
  uint8_t* region_ = nullptr;
  int64_t* counters_ = nullptr;
  size_t counters_bytes_ = 0;
  std::vector<std::unique_ptr<fifo::HostFifo>> fifos_;
  std::vector<std::unique_ptr<ProxyThread>> threads_;
  std::vector<uint64_t> peer_region_bytes_;
  std::unique_ptr<std::atomic<int64_t>[]> last_heard_;
  std::unique_ptr<std::atomic<int64_t>[]> departed_at_;
  std::unique_ptr<std::atomic<uint8_t>[]> excluded_;
  std::unique_ptr<std::atomic<uint8_t>[]> dead_;
  mutable std::mutex error_mu_;
  ErrorInfo error_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> stopping_{false};
  bool connected_ = false;
  bool started_ = false;
  bool stopped_ = false;
};

int64_t now_ns();

}  // namespace proxy
}  // namespace uccl_ep
