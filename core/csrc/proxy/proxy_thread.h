// One proxy thread: the loop that reads like the protocol.
//
//   poll the endpoint  -> local completions advance FIFO watermarks; remote immediates go to the
//                         Receiver (data, atomics) or to the barrier / liveness logic (control)
//   post from FIFOs    -> Write / Atomic become writes with immediates (bounded in flight per peer),
//                         Quiet / Barrier complete when what they wait for is done
//   housekeeping       -> pending control messages, heartbeats and liveness (thread 0)
//   idle               -> back off (spin, yield, short sleeps) so small machines stay responsive
#pragma once

#include <stdint.h>

#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "fifo/fifo_host.h"
#include "proxy/receiver.h"
#include "transport/transport.h"

namespace uccl_ep {
namespace proxy {

class Proxy;

class ProxyThread {
 public:
  ProxyThread(Proxy& owner, int index, std::unique_ptr<transport::Transport> transport,
              std::vector<fifo::HostFifo*> fifos);
  ~ProxyThread();

  transport::Transport& transport() { return *transport_; }
  const transport::Transport& transport() const { return *transport_; }
  void start(const std::vector<int>& cpus);
  void join();
  uint64_t commands_posted() const { return commands_.load(std::memory_order_relaxed); }

 private:
  struct FifoState {
    fifo::HostFifo* fifo = nullptr;
    std::vector<uint8_t> done;  // [capacity]: command at idx completed (cleared as the watermark passes)
    uint64_t watermark = 0;     // every index below completed
    bool blocked = false;       // a Barrier holds the FIFO
  };
  struct WholeQuiet {
    int fifo;
    uint64_t idx;
    std::vector<uint64_t> snapshot;  // consumer index of every FIFO of this thread at pop time
  };
  struct Barrier {
    bool active = false;
    int fifo = 0;
    uint64_t idx = 0;
    bool rail = false;
    uint32_t epoch = 0;
    int stage = 0;
  };

  void run(std::vector<int> cpus);
  bool step();
  bool fifos_hold_commands() const;  // a command is queued in one of this thread's FIFOs
  uint32_t inflight_total() const;   // transfers posted and not completed, all peers
  bool post_from(int f);
  // Returns false when the command must wait (back-pressure); fails the proxy on bad commands.
  bool post_command(int f, const protocol::TransferCmd& cmd, uint64_t idx);
  // A Write to `dst` that is not posted (the peer failed or left): the transport still accounts
  // for its bytes where a copy consumer counts them (Transport::discard). false: retry later, or
  // the proxy failed.
  bool drop_write(int dst, uint64_t len);
  void complete(int f, uint64_t idx);
  void complete_ctx(uint64_t ctx);
  void on_completion(const transport::Completion& c);
  void send_control(int peer, uint32_t imm);
  bool flush_control();
  void on_control(int src, uint32_t imm);
  bool advance_barrier();
  bool check_whole_quiets();
  void housekeeping();
  void protocol_error(int peer, const std::string& detail);

  Proxy& owner_;
  const int index_;
  const int rank_;
  const int num_ranks_;
  std::unique_ptr<transport::Transport> transport_;
  std::vector<FifoState> fifos_;
  Receiver receiver_;
  std::vector<uint32_t> inflight_;                  // per peer
  std::vector<std::vector<uint16_t>> next_seq_;     // per peer, per ordered counter (lazy)
  // Control messages waiting to go out, per peer: a peer whose endpoint stalls (dead, or full)
  // must not hold back heartbeats and barrier messages to the others.
  std::vector<std::deque<uint32_t>> control_out_;
  size_t control_pending_ = 0;
  std::vector<WholeQuiet> whole_quiets_;
  Barrier barrier_;
  uint32_t epoch_all_ = 0, epoch_rail_ = 0;
  std::vector<uint32_t> seen_[8];                   // latest epoch per control op per source
  std::vector<transport::Completion> events_;
  int64_t next_heartbeat_ns_ = 0;
  std::thread thread_;
  std::atomic<uint64_t> commands_{0};
};

}  // namespace proxy
}  // namespace uccl_ep
