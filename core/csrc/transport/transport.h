// The one narrow interface between a proxy thread and the network (or the peer copy engine).
//
// One Transport instance = one endpoint owned by one proxy thread (no locking inside). The
// application always addresses memory by offsets into the one registered region of a rank; the
// backend turns an offset into whatever the provider wants (virtual address, offset, key).
//
// Lifecycle: create -> register_region -> local_address / region_key (bootstrap blob)
//            -> connect(every rank's address + key) -> write / poll ... -> destroy.
//
// Adding a backend: implement this interface in transport/<name>.cc and add one line to the table
// in transport/registry.cc.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace uccl_ep {
namespace transport {

using Bytes = std::vector<uint8_t>;

// What a poll returns.
struct Completion {
  enum Kind : uint32_t {
    kLocalDone = 1,    // a write this endpoint posted finished locally (source reusable)
    kLocalError = 2,   // a write this endpoint posted failed
    kRemoteImm = 3,    // a peer's write-with-immediate landed in our region
    kRemoteError = 4,  // a peer's write was refused here (out of bounds, unknown source)
  };
  Kind kind;
  int peer;            // kRemoteImm: source rank; local kinds: destination rank
  uint32_t imm;        // kRemoteImm only
  uint64_t ctx;        // local kinds: the ctx passed to write()
  int error;           // error kinds: errno-style code
  std::string detail;  // error kinds: what went wrong
};

enum class PostResult { kOk, kAgain, kError };

struct Caps {
  bool ordered = false;        // writes to one peer land in posting order (tcp/rxm: yes; efa: no)
  bool remote_bounds_checked = false;  // the receiver side validates offsets (loop does)
  uint64_t max_write_bytes = 0;
  uint32_t max_outstanding = 0;  // posted-but-not-completed writes the endpoint accepts
};

// Everything a backend needs to know at creation.
struct Options {
  int rank = 0;
  int num_ranks = 1;
  int thread_index = 0;         // proxy thread this endpoint belongs to
  std::string provider;         // fabric: libfabric provider name ("" = first that works)
  std::string domain;           // fabric: libfabric domain (NIC) this endpoint opens ("" = the provider's first)
  int ranks_per_node = 1;       // split transports (`<local>+<remote>`): node of rank r = r / ranks_per_node
  int hmem_cuda_device = -1;    // fabric: the region is device memory of this CUDA ordinal (registered with
                                // FI_HMEM, GPUDirect RDMA); -1 = host memory
  std::string job_key;          // hex digest of the job token: names shared objects, MR keys
  std::string region_name;      // shared-memory object holding the region ("" = not shared)
  std::string ipc_copy;         // ipc: "kernel" = descriptors in a copy ring executed by a GPU kernel of
                                // the sender (dma_ring.h); "" = the CUDA copy engine / host memcpy
  uint32_t max_outstanding = 1024;
  uint64_t fault_seed = 0;      // fault decorator
  double fault_reorder = 0.0;   // probability an op or completion is held back and reordered
  uint32_t fault_max_delay = 0; // polls an op may be held
  double fault_tear = 0.0;      // probability a write is torn into pieces
  uint32_t fault_max_pieces = 4;
};

// The error a backend throws from setup calls (bad provider, failed registration, bad blob).
struct TransportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // Which device the endpoint uses (fabric: the libfabric domain, i.e. the NIC); "" when not applicable.
  virtual std::string device() const { return ""; }
  virtual Caps caps() const = 0;

  // Registers [base, base + bytes) as this rank's region: local source and remote target.
  virtual void register_region(void* base, uint64_t bytes) = 0;
  // Opaque blobs to publish at bootstrap.
  virtual Bytes local_address() = 0;
  virtual Bytes region_key() = 0;
  // Every rank's (address, key, region bytes), index = rank (includes ourselves). An empty address
  // and key mark a rank this endpoint does not serve (a split transport's other half): writes to it
  // are refused.
  virtual void connect(const std::vector<Bytes>& addresses, const std::vector<Bytes>& keys,
                       const std::vector<uint64_t>& region_bytes) = 0;

  // Copies [local_off, +len) of our region to [remote_off, +len) of peer's region, then delivers
  // `imm` to the peer (when has_imm). Never blocks: kAgain means "poll, then retry".
  virtual PostResult write(int peer, uint64_t local_off, uint64_t remote_off, uint64_t len, bool has_imm,
                           uint32_t imm, uint64_t ctx, std::string* error) = 0;
  // A write without bytes (an atomic, a credit, a heartbeat) that may overtake this endpoint's
  // earlier writes to `peer`, as on an unordered NIC (EFA's SRD). The NIC model posts its control
  // messages this way when it reorders; a transport that keeps order per peer may still deliver
  // this one before copies in flight (ipc does). The proxy protocol allows it: a fenced atomic
  // counts the writes it follows. Default: write(), in order.
  virtual PostResult write_control(int peer, uint64_t remote_off, bool has_imm, uint32_t imm, uint64_t ctx,
                                   std::string* error) {
    return write(peer, 0, remote_off, 0, has_imm, imm, ctx, error);
  }
  // A write of `len` bytes to `peer` that the proxy drops instead of posting (the peer failed or
  // left). Where an outside consumer counts the bytes of every pushed write against the copies it
  // executes (ipc with ipc_copy "kernel": the copy kernels, dma_ring.h), the endpoint queues a skip
  // descriptor that the consumer counts without copying; elsewhere nothing happens. No completion
  // is reported for it. kAgain: poll, then retry.
  virtual PostResult discard(int peer, uint64_t len, std::string* error) {
    (void)peer, (void)len, (void)error;
    return PostResult::kOk;
  }
  // Appends up to max completions to out; returns how many.
  virtual size_t poll(std::vector<Completion>& out, size_t max) = 0;
  // Called once after every rank connected (e.g. to drop names used only for setup).
  virtual void finalize_setup() {}
  // Called once after the owning proxy thread stopped for good: release helper threads and finish
  // work in flight. Nothing else is called afterwards except counters() and the destructor.
  virtual void shutdown() {}
  // Named event counts for diagnostics and tests (safe to call from any thread).
  virtual std::vector<std::pair<std::string, uint64_t>> counters() const { return {}; }
  // Recorded events, kTraceFields int64 each (the NIC model's `trace=N`: its last N posts, refusals,
  // releases, completions and deliveries, for tools/lab/trace_nic.py; decorators hand on their inner
  // transport's); empty unless asked for (safe to call from any thread).
  static constexpr int kTraceFields = 7;
  virtual std::vector<int64_t> trace() const { return {}; }
  // The copy ring this endpoint's writes wait on (ipc with ipc_copy "kernel"): {host address, bytes,
  // capacity} (dma_ring.h); empty for every other backend.
  virtual std::vector<uint64_t> copy_ring() const { return {}; }
};

using Factory = std::function<std::unique_ptr<Transport>(const Options&)>;

// Creates a backend by name: "loop", "fabric", "ipc", "fault:<inner>", "nic:<model>:<inner>" (a NIC's
// line rate, latency and reordering around <inner>; nic_model.cc), or "<local>+<remote>" (peers of
// this node through <local>, the others through <remote>, e.g. "ipc+fabric"; split.cc). Throws
// TransportError with the list of known names when `name` is unknown.
std::unique_ptr<Transport> create(const std::string& name, const Options& options);
// Names in the table (without the decorated forms).
std::vector<std::string> backend_names();
// Whether a backend can work on this machine; "" when yes, else why not.
std::string unavailable_reason(const std::string& name);
// The domains (NICs) of a libfabric provider usable for the fabric transport ("" = the provider it
// would pick), in the provider's order; empty when libfabric or the provider is missing.
std::vector<std::string> fabric_domains(const std::string& provider);
// The same, each with its NIC's PCI address ("dddd:bb:dd.f", "" when the provider does not say).
std::vector<std::pair<std::string, std::string>> fabric_domain_pci(const std::string& provider);
// The fabric transport endpoint this machine would open with `provider` ("" = the default order) on
// `domain` ("" = the provider's first), for a region in host memory or (hmem_cuda_device >= 0) in
// that GPU's memory: "fabric:<provider>" when it opens, else "" and *why says what every provider
// answered. Nothing is registered or connected.
std::string fabric_probe(const std::string& provider, const std::string& domain, int hmem_cuda_device, std::string* why);

}  // namespace transport
}  // namespace uccl_ep
