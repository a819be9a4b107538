#include "proxy/proxy.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "bootstrap/endpoint_info.h"
#include "fifo/backoff.h"
#include "proxy/proxy_thread.h"
#include "runtime/cuda_driver.h"
#include "transport/shm.h"
#include "uccl_ep/immediate.h"
#include "uccl_ep/protocol.h"

namespace uccl_ep {
namespace proxy {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

constexpr uint64_t kMinRegionBytes = 4096;

[[noreturn]] void invalid(const std::string& what) { throw_error(ErrorKind::kInvalidArgument, -1, -1, "", what); }

// Entry t % n of a comma-separated list ("" for an empty list); blanks around names are dropped.
std::string domain_for_thread(const std::string& list, int t) {
  std::vector<std::string> names;
  size_t at = 0;
  while (at <= list.size() && !list.empty()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(at, end - at);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    if (item.empty()) invalid("domains: empty entry in '" + list + "' (expected comma-separated NIC names)");
    names.push_back(item);
    at = end + 1;
  }
  return names.empty() ? "" : names[size_t(t) % names.size()];
}

std::vector<int> parse_cpus(const std::string& list) {
  std::vector<int> cpus;
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(at, end - at);
    const size_t dash = item.find('-');
    try {
      const int lo = std::stoi(item.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
      for (int c = lo; c <= hi && c < CPU_SETSIZE; ++c) cpus.push_back(c);
    } catch (const std::exception&) {
      invalid("cpus: expected a CPU list like '0-7,16', got '" + list + "'");
    }
    at = end + 1;
  }
  return cpus;
}

}  // namespace

Proxy::Proxy(const ProxyConfig& config) : config_(config) {
  const ProxyConfig& c = config_;
  if (c.num_ranks < 1 || uint64_t(c.num_ranks) > protocol::limits::kMaxRanks)
    invalid("num_ranks: expected 1.." + std::to_string(protocol::limits::kMaxRanks) + ", got " + std::to_string(c.num_ranks));
  if (c.rank < 0 || c.rank >= c.num_ranks) invalid("rank: expected 0.." + std::to_string(c.num_ranks - 1) + ", got " + std::to_string(c.rank));
  if (c.ranks_per_node < 1 || c.num_ranks % c.ranks_per_node != 0)
    invalid("ranks_per_node: expected a divisor of " + std::to_string(c.num_ranks) + ", got " + std::to_string(c.ranks_per_node));
  if (c.num_threads < 1 || c.num_threads > 64) invalid("num_threads: expected 1..64, got " + std::to_string(c.num_threads));
  if (c.fifos_per_thread < 1 || c.fifos_per_thread > 254)
    invalid("fifos_per_thread: expected 1..254, got " + std::to_string(c.fifos_per_thread));
  if (c.num_counters < 1 || c.num_counters > protocol::limits::kMaxCounters)
    invalid("num_counters: expected 1.." + std::to_string(protocol::limits::kMaxCounters) + ", got " + std::to_string(c.num_counters));
  if (c.region_bytes > protocol::limits::kMaxRegionBytes)
    invalid("region_bytes: expected <= " + std::to_string(protocol::limits::kMaxRegionBytes) + ", got " + std::to_string(c.region_bytes));
  if (c.max_inflight < 1) invalid("max_inflight: expected >= 1");
  if (!(c.timeout_s > 0)) invalid("timeout_s: expected a positive number of seconds");
  if (c.token_digest.size() < 16) invalid("token_digest: expected a hex digest of the job token (>= 16 chars)");
  const std::vector<int> cpus = parse_cpus(c.cpus);

  config_.region_bytes = std::max(c.region_bytes, kMinRegionBytes);
  heartbeat_s_ = c.heartbeat_s > 0 ? c.heartbeat_s : std::clamp(c.timeout_s / 20.0, 0.02, 0.5);
  // NOTES: a peer is declared dead after `grace` of silence: at most half the timeout (so the
  // survivors raise PeerFailure within it) and at least 5 heartbeats (so a loaded machine that
  // delays one heartbeat does not kill a live peer).
  grace_s_ = std::max(5 * heartbeat_s_, std::min(c.timeout_s * 0.5, 10.0));

  counters_bytes_ = size_t(c.num_ranks) * c.num_counters * sizeof(int64_t);
  void* mem = mmap(nullptr, counters_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) invalid("cannot allocate " + std::to_string(counters_bytes_) + " bytes of counters");
  counters_ = static_cast<int64_t*>(mem);

  // NOTES: only the loop and ipc transports need the region in named shared memory (peers map it);
  // elsewhere plain anonymous memory avoids /dev/shm limits (64 MiB in default containers).
  if (c.external_region != 0) {
    if (c.transport.find("loop") != std::string::npos)
      invalid("external_region: the loop transport needs a region it allocates in shared memory");
    if (c.region_bytes < kMinRegionBytes) invalid("region_bytes: an external region needs its real size (>= 4096)");
    region_ = reinterpret_cast<uint8_t*>(c.external_region);
  } else if (c.transport.find("loop") != std::string::npos || c.transport.find("ipc") != std::string::npos) {
    // (ipc: host regions are copied into by peers' proxies, so they live in shared memory too)
    try {
      region_shm_ = transport::ShmObject::create(
          transport::shm_name(c.token_digest, "r" + std::to_string(c.rank) + "_region"), config_.region_bytes);
    } catch (const transport::TransportError& e) {
      throw_error(ErrorKind::kUnsupported, c.rank, -1, "setup", std::string("region: ") + e.what());
    }
    region_ = static_cast<uint8_t*>(region_shm_->data());
  } else {
    void* r = mmap(nullptr, config_.region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) invalid("cannot allocate a region of " + std::to_string(config_.region_bytes) + " bytes");
    region_ = static_cast<uint8_t*>(r);
  }

  const int num_fifos = c.num_threads * c.fifos_per_thread;
  for (int j = 0; j < num_fifos; ++j) fifos_.push_back(std::make_unique<fifo::HostFifo>(c.fifo_capacity));
  last_heard_.reset(new std::atomic<int64_t>[size_t(c.num_ranks)]);
  departed_at_.reset(new std::atomic<int64_t>[size_t(c.num_ranks)]);
  excluded_.reset(new std::atomic<uint8_t>[size_t(c.num_ranks)]);
  dead_.reset(new std::atomic<uint8_t>[size_t(c.num_ranks)]);
  // relaxed: no thread runs yet; start() publishes everything through thread creation.
  for (int r = 0; r < c.num_ranks; ++r) {
    last_heard_[size_t(r)].store(0, std::memory_order_relaxed);
    departed_at_[size_t(r)].store(0, std::memory_order_relaxed);
    excluded_[size_t(r)].store(0, std::memory_order_relaxed);
    dead_[size_t(r)].store(0, std::memory_order_relaxed);
  }
  // NOTES: a NIC transport must know before it opens its endpoint whether the region is GPU memory
  // (fabric then asks the provider for FI_HMEM and registers the region as CUDA memory).
  int region_cuda_device = -1;
  if (c.external_region != 0 && runtime::cu::available(nullptr) &&
      runtime::cu::pointer_memory_type(c.external_region) == runtime::cu::kMemoryTypeDevice)
    region_cuda_device = runtime::cu::pointer_device(c.external_region);
  for (int t = 0; t < c.num_threads; ++t) {
    transport::Options o;
    o.rank = c.rank;
    o.num_ranks = c.num_ranks;
    o.thread_index = t;
    o.provider = c.provider;
    o.domain = domain_for_thread(c.domains, t);
    o.hmem_cuda_device = region_cuda_device;
    o.ranks_per_node = c.ranks_per_node;
    o.job_key = c.token_digest;
    o.region_name = region_shm_ ? region_shm_->name() : "";
    o.ipc_copy = c.ipc_copy;
    o.max_outstanding = std::min<uint32_t>(8192, c.max_inflight * uint32_t(c.num_ranks) + 64);
    o.fault_seed = c.fault_seed;
    o.fault_reorder = c.fault_reorder;
    o.fault_max_delay = c.fault_max_delay;
    o.fault_tear = c.fault_tear;
    o.fault_max_pieces = c.fault_max_pieces;
    std::unique_ptr<transport::Transport> tr;
    try {
      tr = transport::create(c.transport, o);
      tr->register_region(region_, config_.region_bytes);
    } catch (const transport::TransportError& e) {
      throw_error(ErrorKind::kUnsupported, c.rank, -1, "setup", std::string("transport '") + c.transport + "': " + e.what());
    }
    std::vector<fifo::HostFifo*> mine;
    for (int j = t; j < num_fifos; j += c.num_threads) mine.push_back(fifos_[size_t(j)].get());
    threads_.push_back(std::make_unique<ProxyThread>(*this, t, std::move(tr), std::move(mine)));
  }
  (void)cpus;
}

Proxy::~Proxy() {
  stop();
  threads_.clear();
  if (counters_ != nullptr) munmap(counters_, counters_bytes_);
  if (!region_shm_ && region_ != nullptr && config_.external_region == 0) munmap(region_, config_.region_bytes);
}

std::vector<std::string> Proxy::transport_devices() const {
  std::vector<std::string> out;
  for (const auto& t : threads_) out.push_back(t->transport().device());
  return out;
}

std::vector<std::vector<uint64_t>> Proxy::copy_rings() const {
  std::vector<std::vector<uint64_t>> out;
  for (const auto& t : threads_) out.push_back(t->transport().copy_ring());
  return out;
}

std::string Proxy::transport_name() const { return threads_.empty() ? config_.transport : threads_[0]->transport().name(); }

std::vector<uint8_t> Proxy::local_info() const {
  bootstrap::EndpointInfo info;
  info.protocol_version = UCCL_EP_PROTOCOL_VERSION;
  info.token_digest = config_.token_digest;
  info.rank = config_.rank;
  info.num_ranks = config_.num_ranks;
  info.ranks_per_node = config_.ranks_per_node;
  info.num_threads = config_.num_threads;
  info.num_counters = config_.num_counters;
  info.region_bytes = config_.region_bytes;
  info.transport = config_.transport;
  for (const auto& t : threads_) {
    info.addresses.push_back(t->transport().local_address());
    info.keys.push_back(t->transport().region_key());
  }
  return bootstrap::serialize(info);
}

void Proxy::connect(const std::vector<std::vector<uint8_t>>& infos) {
  const int R = config_.num_ranks;
  if (connected_) invalid("connect: expected one call (this proxy is already connected)");
  if (int(infos.size()) != R) invalid("connect: expected " + std::to_string(R) + " endpoint records, got " + std::to_string(infos.size()));
  const bootstrap::EndpointInfo mine = bootstrap::parse(local_info());
  std::vector<bootstrap::EndpointInfo> peers;
  for (int r = 0; r < R; ++r) {
    bootstrap::EndpointInfo p;
    try {
      p = bootstrap::parse(infos[size_t(r)]);
    } catch (const std::exception& e) {
      throw_error(ErrorKind::kPeerProtocolError, config_.rank, r, "bootstrap", e.what());
    }
    const std::string why = bootstrap::incompatibility(mine, p, r);
    if (!why.empty()) {
      const bool foreign = p.token_digest != mine.token_digest || p.protocol_version != mine.protocol_version;
      throw_error(foreign ? ErrorKind::kPeerProtocolError : ErrorKind::kInvalidArgument, config_.rank, r, "bootstrap", why);
    }
    peers.push_back(std::move(p));
  }
  peer_region_bytes_.clear();
  for (const auto& p : peers) peer_region_bytes_.push_back(p.region_bytes);
  for (int t = 0; t < config_.num_threads; ++t) {
    std::vector<transport::Bytes> addrs, keys;
    for (const auto& p : peers) {
      addrs.push_back(p.addresses[size_t(t)]);
      keys.push_back(p.keys[size_t(t)]);
    }
    try {
      threads_[size_t(t)]->transport().connect(addrs, keys, peer_region_bytes_);
    } catch (const transport::TransportError& e) {
      throw_error(ErrorKind::kPeerFailure, config_.rank, -1, "bootstrap", std::string("connecting endpoints: ") + e.what());
    }
  }
  connected_ = true;
}

void Proxy::finalize_setup() {
  for (auto& t : threads_) t->transport().finalize_setup();
  if (region_shm_) region_shm_->unlink();
}

void Proxy::start() {
  if (!connected_) invalid("Proxy.start() before connect()");
  if (stopped_) throw_error(ErrorKind::kAborted, config_.rank, -1, "start", "Proxy.start() after stop()");
  if (started_) return;
  const int64_t now = now_ns();
  // relaxed: the threads start after these stores (thread creation orders them).
  for (int r = 0; r < config_.num_ranks; ++r) last_heard_[size_t(r)].store(now, std::memory_order_relaxed);
  const std::vector<int> cpus = parse_cpus(config_.cpus);
  for (auto& t : threads_) t->start(cpus);
  started_ = true;
}

void Proxy::stop() {
  if (stopped_) return;
  stopped_ = true;
  // release: threads and waiters that acquire `stopping` see everything before it.
  stopping_.store(true, std::memory_order_release);
  for (auto& t : threads_) t->join();
  for (auto& t : threads_) t->transport().shutdown();
  if (!failed()) {
    std::lock_guard<std::mutex> lock(error_mu_);
    error_ = error_info(ErrorKind::kAborted, config_.rank, -1, "shutdown", "the proxy was stopped");
  }
  for (auto& f : fifos_)
    if (f->status() == fifo::kStatusRunning) f->set_status(fifo::kStatusStopped);
}

uint64_t Proxy::push(int fifo_index, const protocol::TransferCmd& cmd, double timeout_s) {
  if (fifo_index < 0 || fifo_index >= num_fifos())
    invalid("fifo: expected 0.." + std::to_string(num_fifos() - 1) + ", got " + std::to_string(fifo_index));
  // NOTES: fail() publishes the error before it marks the FIFOs failed, so a caller that has just
  // seen the failure (a wait raised it) must not get a command queued on a FIFO not yet marked.
  if (failed()) throw EpError(error());
  fifo::HostFifo& f = *fifos_[size_t(fifo_index)];
  uint64_t idx = 0;
  switch (f.push(cmd, timeout_s, &idx)) {
    case fifo::PushStatus::kOk:
      return idx;
    case fifo::PushStatus::kTimeout: {
      ErrorInfo e = error_info(ErrorKind::kTimeout, config_.rank, int(protocol::cmd_dst_rank(cmd)), "push", "");
      e.waited_s = timeout_s;
      e.outstanding = "fifo " + std::to_string(fifo_index) + " stayed full (" + std::to_string(f.capacity()) +
                      " commands not consumed by the proxy)";
      throw EpError(e);
    }
    default:
      throw_if_failed();
      throw_error(ErrorKind::kAborted, config_.rank, -1, "push", "the proxy was stopped");
  }
}

void Proxy::wait_completion(int fifo_index, uint64_t idx, double timeout_s, const std::string& phase) {
  if (fifo_index < 0 || fifo_index >= num_fifos())
    invalid("fifo: expected 0.." + std::to_string(num_fifos() - 1) + ", got " + std::to_string(fifo_index));
  fifo::HostFifo& f = *fifos_[size_t(fifo_index)];
  switch (f.wait_completion(idx, timeout_s)) {
    case fifo::PushStatus::kOk:
      return;
    case fifo::PushStatus::kTimeout: {
      ErrorInfo e = error_info(ErrorKind::kTimeout, config_.rank, -1, phase, "");
      e.waited_s = timeout_s;
      e.outstanding = "fifo " + std::to_string(fifo_index) + " completed up to index " + std::to_string(f.completed()) +
                      ", waiting for " + std::to_string(idx);
      throw EpError(e);
    }
    default:
      throw_if_failed();
      throw_error(ErrorKind::kAborted, config_.rank, -1, phase, "the proxy was stopped");
  }
}

int64_t Proxy::counter(int src, uint32_t c) const {
  // acquire: pairs with the receiver's release add.
  return __atomic_load_n(&counters_[size_t(src) * config_.num_counters + c], __ATOMIC_ACQUIRE);
}

int64_t Proxy::wait_counter(int src, uint32_t c, int64_t target, double timeout_s, const std::string& phase) {
  if (src < 0 || src >= config_.num_ranks || c >= config_.num_counters)
    invalid("wait_counter: (src " + std::to_string(src) + ", counter " + std::to_string(c) + ") out of range");
  Backoff backoff(timeout_s);
  for (;;) {
    const int64_t v = counter(src, c);
    if (v >= target) return v;
    if (failed() || stopping()) throw_if_failed();
    if (dead(src))
      throw_error(ErrorKind::kPeerFailure, config_.rank, src, phase, "the peer is excluded (masked) and stopped responding");
    // acquire: pairs with mark_departed's release.
    const int64_t gone = departed_at_[size_t(src)].load(std::memory_order_acquire);
    if (gone != 0 && now_ns() - gone > int64_t(2e9 * heartbeat_s_))
      throw_error(ErrorKind::kPeerFailure, config_.rank, src, phase,
                  "the peer closed its endpoint (destroyed its buffer) before sending what this rank waits for");
    if (backoff.expired()) {
      ErrorInfo e = error_info(ErrorKind::kTimeout, config_.rank, src, phase, "");
      e.waited_s = backoff.elapsed_s();
      e.outstanding = "counter " + std::to_string(c) + " from rank " + std::to_string(src) + " is " + std::to_string(v) +
                      ", waiting for >= " + std::to_string(target);
      throw EpError(e);
    }
    backoff.pause();
  }
}

void Proxy::reset_counters() { std::memset(counters_, 0, counters_bytes_); }

void Proxy::fail(const ErrorInfo& error) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    // relaxed: read under error_mu_, which every writer of failed_ holds.
    if (failed_.load(std::memory_order_relaxed)) return;
    error_ = error;
    // release: error_ is written before anyone can observe failed_ == true.
    failed_.store(true, std::memory_order_release);
  }
  for (auto& f : fifos_) f->set_status(fifo::kStatusFailed);
}

ErrorInfo Proxy::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

void Proxy::throw_if_failed() const {
  if (failed()) throw EpError(error());
  if (stopping()) throw_error(ErrorKind::kAborted, config_.rank, -1, "wait", "the proxy was stopped");
}

void Proxy::heard_from(int peer) {
  // relaxed: a liveness timestamp; only its rough value matters.
  if (peer >= 0 && peer < config_.num_ranks) last_heard_[size_t(peer)].store(now_ns(), std::memory_order_relaxed);
}

void Proxy::mark_departed(int peer) {
  // release: pairs with the acquire in wait_counter / departed().
  if (peer >= 0 && peer < config_.num_ranks) departed_at_[size_t(peer)].store(now_ns(), std::memory_order_release);
}

void Proxy::set_excluded(int peer, bool on) {
  if (peer < 0 || peer >= config_.num_ranks) invalid("peer: expected 0.." + std::to_string(config_.num_ranks - 1));
  // release / acquire: a thread that sees the flag sees everything the caller did before it.
  excluded_[size_t(peer)].store(on ? 1 : 0, std::memory_order_release);
}

bool Proxy::excluded(int peer) const { return excluded_[size_t(peer)].load(std::memory_order_acquire) != 0; }

void Proxy::mark_dead(int peer) { dead_[size_t(peer)].store(1, std::memory_order_release); }

bool Proxy::dead(int peer) const { return dead_[size_t(peer)].load(std::memory_order_acquire) != 0; }

void Proxy::peer_failed(const ErrorInfo& error) {
  if (error.peer >= 0 && error.peer < config_.num_ranks && excluded(error.peer)) {
    mark_dead(error.peer);
    return;
  }
  fail(error);
}

bool Proxy::departed(int peer) const { return departed_at_[size_t(peer)].load(std::memory_order_acquire) != 0; }

int64_t Proxy::last_heard_ns(int peer) const { return last_heard_[size_t(peer)].load(std::memory_order_relaxed); }

std::vector<std::pair<std::string, uint64_t>> Proxy::transport_counters() const {
  std::vector<std::pair<std::string, uint64_t>> sum;
  for (const auto& t : threads_)
    for (const auto& [name, value] : t->transport().counters()) {
      auto it = std::find_if(sum.begin(), sum.end(), [&](const auto& kv) { return kv.first == name; });
      if (it == sum.end()) sum.emplace_back(name, value);
      else it->second += value;
    }
  return sum;
}

std::vector<int64_t> Proxy::transport_trace() const {
  constexpr int kFields = transport::Transport::kTraceFields;
  std::vector<int64_t> out;
  for (size_t t = 0; t < threads_.size(); ++t) {
    const std::vector<int64_t> events = threads_[t]->transport().trace();
    for (size_t e = 0; e + kFields <= events.size(); e += kFields) {
      out.push_back(int64_t(t));
      out.insert(out.end(), events.begin() + int64_t(e), events.begin() + int64_t(e + kFields));
    }
  }
  return out;
}

uint64_t Proxy::stat_commands() const {
  uint64_t n = 0;
  for (const auto& t : threads_) n += t->commands_posted();
  return n;
}

}  // namespace proxy
}  // namespace uccl_ep
