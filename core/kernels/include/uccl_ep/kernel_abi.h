// The host <-> kernel ABI of uccl_ep's GPU kernels: parameter structs and the error word.
//
// Every kernel takes exactly one of these structs by value. All fields are 64-bit (pointers are
// uint64_t device addresses) so the layout is an array of 8-byte words with no padding, and the
// Python side (uccl_ep/cuda/runtime.py, pack_params) packs it from the field names in the same order; a CPU test
// parses this header and checks the two lists agree.
#pragma once

#include <stdint.h>

namespace uccl_ep {

// Lives in pinned host memory mapped for the device; read by the host after (or during) kernels.
struct ErrorWord {
  int code;      // 0 = fine, kErr*; -1 while a kernel is filling the fields
  int phase;     // kPhase*
  int rank;      // the rank that waited
  int peer;      // the rank it waited for
  int expert;    // expert (or channel) it waited on, -1 if none
  int waited_us; // how long it waited
  int pad[2];
};

// kErrProxy: the CPU proxy a kernel pushes to (or waits on) stopped or failed; the host raises the
// proxy's own error. kErrTopkDuplicate: a low-latency top-k row selects one expert twice (`peer`
// holds the token, `expert` the expert); the host raises InvalidArgument("topk_idx"). kErrPeerGone:
// written by the host, never a kernel (uccl_ep/cuda/liveness.py): `peer`'s process exited; the
// kernels' waits see the word set and end, the host raises PeerFailure.
enum ErrorCode : int { kErrNone = 0, kErrTimeout = 1, kErrProtocol = 2, kErrProxy = 3, kErrTopkDuplicate = 4,
                       kErrPeerGone = 5 };

enum Phase : int {
  kPhaseLLDispatchRecv = 1,
  kPhaseLLCombineRecv = 2,
  kPhaseHTNotify = 3,
  kPhaseHTDispatchSend = 4,
  kPhaseHTDispatchRecv = 5,
  kPhaseHTCombineSend = 6,
  kPhaseHTCombineRecv = 7,
  kPhaseBarrier = 8,
  kPhaseLLDispatchSend = 9,   // proxy path: pushing commands
  kPhaseLLCombineSend = 10,
  kPhaseLLProxyCopy = 11,     // proxy path, ipc "kernel" copies: waiting for the proxy's descriptors
  kPhaseHTProxyCopy = 12,     // normal mode through the proxy, ipc "kernel" copies (device/ht_dma.cuh)
  kPhaseLiveness = 13,        // the host's watch of the peers' processes (kErrPeerGone)
};

// ---- low-latency ---------------------------------------------------------------------------------
// Per buffer set (two alternate): recv area, dispatch signals [E_loc][R] u64, combine signals [E] u64.
// A signal is (tag << 32) | count; tag = completed ops on that set + 1 (see ll/nvlink/dispatch.cu NOTES).
// Every LL kernel takes `mask`: the Buffer's rank mask, int32 [R] in device memory (nonzero = masked;
// device/shrink.cuh), read when the kernel runs, so CUDA-graph replays see the mask of the moment.
// Receive kernels take `shrink`: 1 = a bounded wait on a peer that expires masks the peer
// (DeepEP's enable_shrink) instead of failing the op.

struct LLDispatchParams {
  uint64_t x;               // bf16 [T, H]
  uint64_t topk_idx;        // int64 [T, K]
  uint64_t peer_recv;       // u64[R]: each rank's recv area of this set (own entry = local)
  uint64_t peer_signal;     // u64[R]: each rank's dispatch signal area of this set
  uint64_t seq;             // u32 device word: completed ops on this set (tag = seq + 1)
  int64_t flag_off;         // bytes from a recv area to its slot flags [E_loc][R][T] u64
  int64_t num_tokens;       // T (this rank)
  int64_t num_max;          // slots per (expert, source)
  int64_t hidden;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t use_fp8;
  int64_t round_scale;
  int64_t msg_bytes;        // stride of one message slot
  uint64_t mask;            // int32 [R] device words: nonzero = masked rank
  uint64_t error;           // ErrorWord* (duplicate top-k ids)
};

struct LLDispatchRecvParams {
  uint64_t recv_area;       // this rank's recv area of the set
  uint64_t signal;          // this rank's dispatch signals of the set
  uint64_t seq;             // u32 device word of the set
  uint64_t done;            // u32 device word: blocks finished (last one bumps seq)
  int64_t flag_off;         // bytes from the recv area to its slot flags
  uint64_t recv_x;          // [E_loc, R*T, H] fp8 or bf16
  uint64_t recv_scales;     // fp32 [E_loc, H/128, R*T] or int32 [E_loc, H/512, R*T] (or 0)
  uint64_t recv_count;      // int32 [E_loc]
  uint64_t src_info;        // int32 [E_loc, R*T]
  uint64_t layout_range;    // int64 [E_loc, R]
  uint64_t cumulative_stats;// int32 [E_loc] or 0
  uint64_t wait_stats;      // int64 [R] or 0
  uint64_t error;           // ErrorWord* (device address of mapped host memory)
  int64_t num_max;
  int64_t hidden;
  int64_t num_local_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t use_fp8;
  int64_t use_ue8m0;
  int64_t msg_bytes;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t shrink;           // 1: an expired wait on a peer masks it instead of failing the op
  int64_t timeout_ns;
};

struct LLCombineParams {
  uint64_t y;               // bf16 [E_loc, R*T, H]
  uint64_t src_info;        // int32 [E_loc, R*T]
  uint64_t layout_range;    // int64 [E_loc, R]
  uint64_t peer_recv;       // u64[R]: combine recv areas of this set ([E][T][H] bf16 rows; flags at flag_off)
  uint64_t seq;
  int64_t flag_off;         // bytes from a combine area to its [E][T] u64 row flags
  int64_t num_max;
  int64_t hidden;
  int64_t num_local_experts;
  int64_t num_ranks;
  int64_t rank;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t meta_off;         // LogFMT build only: bytes from a combine area to its [E][T][H/128] u32 meta words
};

struct LLCombineRecvParams {
  uint64_t recv_area;       // [E][T][H] bf16 rows; [E][T] u64 row flags at flag_off
  uint64_t seq;
  int64_t flag_off;
  uint64_t done;
  uint64_t topk_idx;        // int64 [T, K]
  uint64_t topk_weights;    // fp32 [T, K]
  uint64_t out;             // bf16 [T, H]
  uint64_t wait_stats;      // int64 [R] or 0
  uint64_t error;
  int64_t num_tokens;
  int64_t num_max;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_local_experts;
  int64_t rank;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t shrink;           // 1: an expired wait on a peer masks it instead of failing the op
  int64_t timeout_ns;
  int64_t meta_off;         // LogFMT build only (as in LLCombineParams)
};

// ---- normal (high-throughput) intranode ---------------------------------------------------------
// Each rank's NVL buffer: [0, kHTRingOffset) control (notify area, ring counters), then rings:
// ring (channel c, source i) of this rank = ring_slots slots of slot_bytes, written by rank i.
// Ring positions are cumulative over every op (dispatch and combine share the rings of one
// direction), so no counter is ever reset between ops; see ht/nvlink/dispatch.cu NOTES.
constexpr int kHTMaxRanks = 8;
constexpr int kHTMaxChannels = 64;
constexpr int kHTMaxWarps = 32;  // warps of one HT block (Tuning.ht_warps), one counter each
constexpr int kHTMaxLocalExperts = 1024;
constexpr uint64_t kHTNotifyOffset = 0;                       // sig[2][R] u64, ack[R] u64, payload
constexpr uint64_t kHTNotifyPayloadOffset = 256;              // int32 [2][R][kHTNotifyStride]
constexpr int kHTNotifyStride = kHTMaxRanks + kHTMaxChannels + kHTMaxLocalExperts;
constexpr uint64_t kHTTailOffset = 128 * 1024;                // u64 [C][R][kHTMaxWarps] by sender warps
constexpr uint64_t kHTHeadOffset = kHTTailOffset + 8ull * kHTMaxChannels * kHTMaxRanks * kHTMaxWarps;
constexpr uint64_t kHTRingOffset = 512 * 1024;

struct HTLayoutParams {
  uint64_t topk_idx;          // int64 [T, K]
  uint64_t num_tokens_per_rank;    // int32 [R], zeroed
  uint64_t num_tokens_per_expert;  // int32 [E], zeroed
  uint64_t is_token_in_rank;  // bool [T, R]
  int64_t num_tokens;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
};

struct HTNotifyParams {
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t num_tokens_per_expert;  // int32 [E]
  uint64_t peer_buf;          // u64[R] NVL buffer bases
  uint64_t seq;               // u32 device word: fresh dispatches done
  uint64_t rank_prefix;       // out int32 [R, R]
  uint64_t channel_prefix;    // out int32 [R, C]
  uint64_t recv_channel_prefix;  // out int32 [R, C]
  uint64_t host;              // int32 mapped host: [0] flag, [1] num_recv, [2, 2+R) per source, then per expert
  uint64_t error;
  int64_t host_tag;
  int64_t num_tokens;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  int64_t num_experts;
  int64_t expert_alignment;
  int64_t num_worst_tokens;
  int64_t timeout_ns;
};

struct HTDispatchParams {
  uint64_t x;                 // [T, hidden_bytes]
  uint64_t x_scales;          // 4-byte elements, strided, or 0
  uint64_t topk_idx;          // int64 [T, K] or 0 (cached)
  uint64_t topk_weights;      // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t peer_buf;          // u64[R]
  uint64_t sent;              // u64 [C][R] cumulative positions written per destination (local)
  uint64_t consumed;          // u64 [C][R] cumulative positions consumed per source (local)
  uint64_t recv_x;
  uint64_t recv_scales;       // row-major [rows, num_scales] or 0
  uint64_t recv_topk_idx;     // int64 [rows, K] or 0
  uint64_t recv_topk_weights; // fp32 [rows, K] or 0
  uint64_t recv_src_idx;      // int32 [rows] or 0
  uint64_t send_head;         // int32 [T, R] or 0
  uint64_t rank_prefix;       // int32 [R, R]
  uint64_t recv_channel_prefix;  // int32 [R, C]
  uint64_t error;
  int64_t num_tokens;
  int64_t hidden_bytes;
  int64_t num_scales;
  int64_t scale_stride_token;
  int64_t scale_stride_col;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  int64_t ring_slots;
  int64_t slot_bytes;
  int64_t warps_per_peer;
  int64_t num_rows;
  int64_t timeout_ns;
};

struct HTCombineParams {
  uint64_t x;                 // bf16 [rows, H]
  uint64_t topk_weights;      // fp32 [rows, K] or 0
  uint64_t bias0;             // bf16 [T, H] or 0
  uint64_t bias1;             // bf16 [T, H] or 0
  uint64_t out;               // bf16 [T, H]
  uint64_t out_weights;       // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t send_head;         // int32 [T, R]
  uint64_t peer_buf;
  uint64_t sent;
  uint64_t consumed;
  uint64_t rank_prefix;
  uint64_t recv_channel_prefix;
  uint64_t error;
  int64_t num_tokens;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  int64_t ring_slots;
  int64_t slot_bytes;
  int64_t warps_per_peer;
  int64_t timeout_ns;
};

// Combine with copy engines (ht/nvlink/combine_ce.cu, uccl_ep/cuda/ht_ce.py): each rank's staging
// buffer (IPC-shared, apart from the NVL buffer) = a header, then per source rank j != me a region
// (ce_region_slot) of cap_rows rows (BF16, hidden wide) and cap_rows x num_topk fp32 weights, which
// rank j's copy engine fills with the rows of this rank's tokens it holds (its x rows from this
// rank, in order).
//   flags[j][k]: the epoch of rank j's last copy of chunk k (rows [k * chunk_rows, +chunk_rows))
//   freed[j]:    the epoch up to which rank j has read this rank's rows in ITS staging buffer
//   epoch:       this rank's count of such combines (the begin kernel raises it; device-side, so
//                graph replays count too); epoch_src: the value the copy engine writes into flags
constexpr int kCEMaxChunks = 128;
constexpr uint64_t kCEFlagsOffset = 0;                                         // u64 [kHTMaxRanks][kCEMaxChunks]
constexpr uint64_t kCEFreedOffset = 8ull * kHTMaxRanks * kCEMaxChunks;         // u64 [kHTMaxRanks]
constexpr uint64_t kCEEpochOffset = kCEFreedOffset + 8ull * kHTMaxRanks;       // u64
constexpr uint64_t kCEEpochSrcOffset = kCEEpochOffset + 64;                    // u64 (own line)
constexpr uint64_t kCEDoneOffset = kCEEpochSrcOffset + 64;                     // u32 blocks done
constexpr uint64_t kCEDataOffset = 64 * 1024;
// The staging region of source rank `src` in rank `rcv`'s buffer (R - 1 regions: none for itself).
#if defined(__CUDACC__) || defined(__HIPCC__)
__host__ __device__
#endif
constexpr int ce_region_slot(int src, int rcv) { return src - (src > rcv ? 1 : 0); }

// Dispatch by copy engines (ht/nvlink/dispatch_ce.cu): senders write each peer's rows (and their
// metadata) into the peer's dispatch region for them (after the combine regions), then raise
// dflags[src][chunk] there; the receiver's copy engines move each chunk into recv_x.
constexpr uint64_t kCEDFlagsOffset = 16 * 1024;                                // u64 [kHTMaxRanks][kCEMaxChunks]
constexpr uint64_t kCEDFreedOffset = 24 * 1024;                                // u64 [kHTMaxRanks]
constexpr uint64_t kCEDEpochOffset = kCEDFreedOffset + 8ull * kHTMaxRanks;     // u64
constexpr uint64_t kCEDEpochSrcOffset = kCEDEpochOffset + 64;                  // u64 (own line)
constexpr uint64_t kCEDCountOffset = 32 * 1024;                                // u32 [kHTMaxRanks][kCEMaxChunks]

// ht_ce_begin: epoch += 1 (the word at epoch_off), epoch_src = epoch, then wait until every peer
// j freed this rank's rows of the previous epoch (freed_off[j] >= epoch - 1).
struct HTCEBeginParams {
  uint64_t stage;             // this rank's staging buffer
  uint64_t error;
  int64_t epoch_off;
  int64_t epoch_src_off;
  int64_t freed_off;
  int64_t phase;              // kPhase* named on timeout
  int64_t num_ranks;
  int64_t rank;
  int64_t timeout_ns;
};

// ht_ce_wait (one thread, on a copy stream): wait until *flag >= this rank's epoch (the word at
// stage + epoch_off), bounded; on timeout the error word names (rank, peer, chunk).
struct HTCEWaitParams {
  uint64_t flag;
  uint64_t stage;
  uint64_t error;
  int64_t epoch_off;
  int64_t rank;
  int64_t peer;
  int64_t chunk;
  int64_t timeout_ns;
};

struct HTDispatchCEParams {
  uint64_t x;                 // [T, hidden_bytes]
  uint64_t x_scales;          // 4-byte elements, strided, or 0
  uint64_t topk_idx;          // int64 [T, K] or 0 (cached)
  uint64_t topk_weights;      // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t channel_prefix;    // int32 [R, C] (inclusive)
  uint64_t rank_prefix;       // int32 [R, R]
  uint64_t recv_x;            // own rows go straight here
  uint64_t recv_scales;       // row-major [rows, num_scales] or 0
  uint64_t recv_topk_idx;     // int64 [rows, K] or 0
  uint64_t recv_topk_weights; // fp32 [rows, K] or 0
  uint64_t recv_src_idx;      // int32 [rows] or 0
  uint64_t send_head;         // int32 [T, R] or 0 (cached)
  uint64_t stage;             // this rank's staging buffer
  uint64_t peer_stage;        // u64 [R]
  uint64_t error;
  int64_t num_tokens;
  int64_t hidden_bytes;
  int64_t num_scales;
  int64_t scale_stride_token;
  int64_t scale_stride_col;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  int64_t region_base;        // offset of the dispatch regions in a staging buffer
  int64_t region_bytes;       // per source region: rows, then scales, top-k ids, weights, source index
  int64_t scales_off;
  int64_t topk_off;
  int64_t weights_off;
  int64_t src_off;
  int64_t chunk_rows;
  int64_t fresh;              // 1: a fresh dispatch (metadata and send_head too); 0: cached (rows, scales)
  int64_t timeout_ns;
};

struct HTCombineCEParams {
  uint64_t x;                 // bf16 [rows, H]: this rank's own rows are read here
  uint64_t topk_weights;      // fp32 [rows, K] or 0
  uint64_t bias0;             // bf16 [T, H] or 0
  uint64_t bias1;             // bf16 [T, H] or 0
  uint64_t out;               // bf16 [T, H]
  uint64_t out_weights;       // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t send_head;         // int32 [T, R]
  uint64_t channel_prefix;    // int32 [R, C]: inclusive prefix of this rank's tokens sent to each rank
  uint64_t recv_channel_prefix;  // int32 [R, C]
  uint64_t stage;             // this rank's staging buffer
  uint64_t peer_stage;        // u64 [R]: every rank's staging buffer, mapped here
  uint64_t error;
  int64_t num_tokens;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  int64_t region_bytes;       // bytes per source region (rows, then weights)
  int64_t cap_rows;           // rows per source region
  int64_t chunk_rows;
  int64_t timeout_ns;
};

// ---- low-latency through the CPU proxy (ll/proxy/dispatch.cu, ll/proxy/combine.cu) ---------------
// Kernels push Write + Atomic commands into proxy FIFOs instead of storing to peers; the receiving
// proxy bumps counters[src][counter] in mapped host memory. Per buffer set, inside the region the
// proxy registered (this rank's LL buffer; same offsets on every rank), one packed region of
// region_bytes per peer in each area:
//   send area  region [d]: what this rank sends to rank d (dispatch), or to source rank d (combine)
//   recv area  region [s]: what rank s sent to this rank
// The rank's own region never goes through the proxy (a NIC would not carry it either): it stays
// in the send area (staged, or y itself in zero-copy combine), where its receive kernel reads it;
// the send kernel adds signal_total to the receiver's device copy of the rank's own counter
// (counter_cache[rank], which the receive kernel waits on like any other: wait_counter_shared).
// A dispatch region = 16-byte header {slots, magic, 0, 0}, int32 slots per local expert of the
// destination (counts_bytes), then per slot its source token t and its row r as uint32 t | r << 16
// (idx_bytes; num_max <= 65536), then the rows (payload_bytes apart): one per
// source token that selects any expert of the destination, in token order, however many of them
// it selects; slots in (expert, source token) order. A combine region = the rows
// for one token rank, bf16, in (expert, slot) order. Per (op, peer) the sender pushes n counted
// Writes (the region's used bytes, in chunks of at most chunk_bytes) and a signal pair (fenced
// Atomic n + 1, plain Atomic signal_total - n - 1; device/proxy_ll.cuh) on one counter, so that
// counter grows by signal_total per op: receivers wait for signal_total * (rounds[src] + 1),
// rounds counting the ops seen from src on that set and phase. Peers of the rank's own node may be
// reached over NVLink instead (hybrid: nvl_peers, device/proxy_ll.cuh), same regions and targets.
constexpr uint32_t kLLProxyBlockMagic = 0x55454c4cu;  // "LLEU"

struct LLProxyDispatchParams {
  uint64_t x;               // bf16 [T, H]
  uint64_t topk_idx;        // int64 [T, K]
  uint64_t fifos;           // fifo::FifoLayout[num_fifos] (device addresses)
  uint64_t finish;          // u32 [R] device counters: slots staged per destination (last one pushes)
  uint64_t send_area;       // device address of this set's send area
  uint64_t error;           // ErrorWord*
  int64_t send_off;         // byte offset of this set's send area in the region
  int64_t recv_off;         // byte offset of this set's recv area in the region (every rank)
  int64_t num_tokens;
  int64_t num_max;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t use_fp8;
  int64_t round_scale;
  int64_t region_bytes;     // stride of the per-peer packed regions
  int64_t counts_bytes;     // int32 per local expert, 16-byte aligned
  int64_t idx_bytes;        // uint32 token | row << 16 per slot (max_slots of them), 16-byte aligned
  int64_t payload_bytes;    // one row (FP8 + scales, or BF16); a region holds up to num_max rows
  int64_t max_slots;        // slots a region holds: num_max * min(K, local experts)
  int64_t chunk_bytes;      // largest Write
  int64_t signal_total;     // counter growth per op
  int64_t num_fifos;
  int64_t counter;          // receiver counter of this set's dispatch
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t timeout_ns;
  uint64_t dma_pushed;      // u64 [num_proxy_threads]: bytes of Writes pushed per proxy thread, for the
                            // copy kernel (ipc "kernel" copies, transport/copy_ring.cu); 0 = no copy rings
  int64_t num_proxy_threads; // FIFO f is served by proxy thread f % num_proxy_threads
  uint64_t self_counter;    // u64 device word: this op's receive counter for the rank's own region
                            // (counter_cache[rank] of the receive kernel), + signal_total when staged
  int64_t push_fence;       // 1: a system fence before an op's pushes (a NIC or the proxy's driver
                            // copies read the staged bytes); 0: only the copy kernel reads them, after
                            // this kernel in stream order (proxy_ll.cuh, OpRoute)
  uint64_t peer_ll;         // u64 [R]: NVLink peers' LL buffers mapped here (0 for the others), or 0
  uint64_t nvl_peers;       // bit d: rank d is an NVLink peer (region stored there, signalled there)
  int64_t nvl_signal_off;   // byte offset in every LL buffer of this (set, phase)'s NVLink words u64 [R]
};

struct LLProxyDispatchRecvParams {
  uint64_t recv_area;       // device address of this set's recv area
  uint64_t send_area;       // device address of this set's send area: the rank's own region is read
                            // there (it never goes through the proxy)
  uint64_t counters;        // int64 [R][num_counters], mapped host memory (device address)
  uint64_t rounds;          // int64 [R] device words: dispatch ops seen per source on this set
  uint64_t done;            // u32 device word: blocks finished
  uint64_t counter_cache;   // u64 [R] device words: the largest value of each source's counter read
                            // so far (wait_counter_shared), zeroed with the counters
  uint64_t counter_lock;    // i32 [R] device words: which thread reads the host counter (0 = none)
  uint64_t status;          // a FIFO status word of the proxy (mapped host memory)
  uint64_t recv_x;
  uint64_t recv_scales;
  uint64_t recv_count;
  uint64_t src_info;
  uint64_t layout_range;
  uint64_t cumulative_stats;
  uint64_t wait_stats;
  uint64_t error;
  int64_t num_counters;
  int64_t counter;
  int64_t num_max;
  int64_t hidden;
  int64_t num_local_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t use_fp8;
  int64_t use_ue8m0;
  int64_t region_bytes;
  int64_t counts_bytes;
  int64_t idx_bytes;
  int64_t payload_bytes;
  int64_t max_slots;
  int64_t signal_total;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t shrink;           // 1: an expired wait on a peer masks it instead of failing the op
  int64_t timeout_ns;
  uint64_t nvl_peers;       // as in LLProxyDispatchParams: those sources signal nvl_signal[src]
  uint64_t nvl_signal;      // u64 [R] device words of this (set, phase) (nvl_signal_off in this buffer)
};

struct LLProxyCombineParams {
  uint64_t y;               // bf16 [E_loc, R*T, H] (may be the send area itself: zero copy)
  uint64_t src_info;
  uint64_t layout_range;
  uint64_t fifos;
  uint64_t finish;          // u32 [R] device counters: rows staged per source rank
  uint64_t send_area;       // device address of this set's send area
  uint64_t error;
  int64_t send_off;
  int64_t recv_off;
  int64_t num_max;
  int64_t hidden;
  int64_t num_local_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t region_bytes;     // stride of the per-peer packed row regions
  int64_t chunk_bytes;
  int64_t signal_total;
  int64_t zero_copy;        // y is the send area ([E_loc][R*T][H]): one Write per (expert, source)
  int64_t num_fifos;
  int64_t counter;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t timeout_ns;
  uint64_t dma_pushed;      // u64 [num_proxy_threads]: bytes of Writes pushed per proxy thread, for the
                            // copy kernel (ipc "kernel" copies, transport/copy_ring.cu); 0 = no copy rings
  int64_t num_proxy_threads; // FIFO f is served by proxy thread f % num_proxy_threads
  uint64_t self_counter;    // u64 device word: this op's receive counter for the rank's own region
                            // (counter_cache[rank] of the receive kernel), + signal_total when staged
  int64_t own_in_y;         // 1: the rank's own rows are not staged (the receive kernel reads them in y,
                            // as in zero copy: it follows this kernel directly on the stream)
  int64_t push_fence;       // as in LLProxyDispatchParams
  int64_t row_split;        // most warps that stage one row (>= 1; fewer when the grid has no spare warps)
  uint64_t peer_ll;         // as in LLProxyDispatchParams
  uint64_t nvl_peers;
  int64_t nvl_signal_off;
};

struct LLProxyCombineRecvParams {
  uint64_t recv_area;       // region [owner]: rows in (local expert, slot) order
  uint64_t send_area;       // this set's send area: region [rank] holds the rank's own rows (staged),
                            // or in zero copy the [E_loc][R*num_max] rows of y (with layout_range)
  uint64_t layout_range;    // int64 [E_loc][R] (begin << 32 | count) of the dispatch (zero copy only)
  uint64_t counters;
  uint64_t rounds;          // int64 [R]: combine ops seen per source on this set
  uint64_t done;
  uint64_t counter_cache;   // u64 [R], i32 [R]: as in LLProxyDispatchRecvParams
  uint64_t counter_lock;
  uint64_t status;
  uint64_t topk_idx;
  uint64_t topk_weights;
  uint64_t out;
  uint64_t wait_stats;
  uint64_t error;
  int64_t num_counters;
  int64_t counter;
  int64_t num_tokens;
  int64_t num_max;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t region_bytes;
  int64_t signal_total;
  uint64_t mask;            // int32 [R] device words (as in LLDispatchParams)
  int64_t shrink;           // 1: an expired wait on a peer masks it instead of failing the op
  int64_t zero_copy;        // the rank's own rows: y (send_area, by layout_range) instead of region [rank]
  int64_t timeout_ns;
  uint64_t nvl_peers;       // as in LLProxyDispatchRecvParams
  uint64_t nvl_signal;
};

// The copy kernel of the ipc transport's "kernel" engine (transport/copy_ring.cu, dma_ring.h): launched
// after each proxy-path send kernel, it executes the descriptors the proxy threads queued for the
// Writes pushed so far, blocks_per_ring blocks per proxy thread's ring.
struct LLProxyDmaParams {
  uint64_t rings;           // u64 [num_rings]: device address of each proxy thread's copy ring
  uint64_t pushed;          // u64 [num_rings]: bytes of Writes pushed so far (the send kernels add)
  uint64_t state;           // DmaConsumer [num_rings] (transport/copy_ring.cu), device memory, zeroed once
  uint64_t finish;          // u32 [num_rings][kDmaRingCapacity]: blocks done per descriptor, zeroed once
  uint64_t mirror;          // DmaDesc [num_rings][kDmaRingCapacity]: device copies of the descriptors
  uint64_t status;          // a FIFO status word of the proxy (mapped host memory)
  uint64_t error;           // ErrorWord*
  int64_t num_rings;
  int64_t blocks_per_ring;
  int64_t rank;
  int64_t timeout_ns;
};

// copy_ring_handover (transport/copy_ring.cu; uccl_ep/cuda/proxy_session.py): the copy rings of one proxy
// session change consumers (the LL copy kernel, the normal-mode kernels' copy role). Per ring g:
// when the other consumer's position other[g * other_stride] is ahead of this one's own[g *
// own_stride], the words own[g * own_stride + word_k] (k < 3, -1: none) take it. Positions only
// grow, and the consumer that ran last is the one ahead.
struct CopyRingHandoverParams {
  uint64_t own;             // u64*: this consumer's position of ring 0 (device memory)
  uint64_t other;           // u64*: the other consumer's position of ring 0
  int64_t own_stride;       // u64 words from one ring's state to the next (own)
  int64_t other_stride;     // likewise (other)
  int64_t word0;            // u64 offsets from own's position of the words to set (-1: none)
  int64_t word1;
  int64_t word2;
  int64_t num_rings;
};

}  // namespace uccl_ep
