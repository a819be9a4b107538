// Host <-> kernel ABI of the high-throughput (normal) mode through the CPU proxy
// (ht/proxy/notify.cu, ht/proxy/dispatch.cu, ht/proxy/combine.cu; Python:
// uccl_ep/cuda/ht_proxy.py). Same rules as kernel_abi.h: every *Params struct is a list of
// 64-bit fields that uccl_ep.cuda.runtime.pack_params fills by name from this header.
//
// The protocol is the host executor's (uccl_ep/host/ht.py, ht_internode.py, csrc/executor/
// ring_engine.*), carried out by GPU warps instead of host threads:
//
//   op start   every op exchanges a meta record (fresh dispatch) or a bare handshake (cached
//              dispatch, combine) with every rank: counted Write into the receiver's meta slot
//              [parity][source] + fenced Atomic on counter META(parity); parity = op count % 2
//   rings      per (peer, ring) streams of fixed-size messages; ring r = channel c (area 0 of the
//              two areas of the host layout: hop 1 / hop B of the internode protocol). The sender
//              stages up to `chunk` messages in its staging ring and pushes ONE ordered Write
//              (counter TAIL(r) = r, increment = messages) into the receiver's ring; the receiver
//              consumes what TAIL(r) covers and returns credits with an unfenced Atomic HEAD(r)
//   positions  cumulative per (peer, ring) over every op (dispatch and combine share them), kept
//              in device memory (HTProxyState) on both sides, so nothing is ever reset
//
// Region (this rank's NVL buffer, registered with the proxy; same offsets on every rank):
//   [0, shared)               ring areas: area 0 = [0, shared/2): receive rings [src][ring][slot],
//                             then staging rings [dst][ring][slot] (see uccl_ep.host.ht_common.ring_spec)
//   [meta_base, +4 R slot)    meta records: received [parity][source], then sent [parity][destination]
#pragma once

#include <stdint.h>

#include "uccl_ep/protocol.h"

namespace uccl_ep {

// Sized for one host of GPUs acting as nodes (the ipc transport); a block has 16 warps and
// gives every peer at least one.
constexpr int kHTProxyMaxRanks = 16;
constexpr int kHTProxyMaxChannels = 64;
constexpr int kHTProxyWarps = 16;
// Counters per source (uccl_ep.protocol.layout): TAIL(r) = r, HEAD(r) = kHTProxyHeadBase + r,
// META(parity) = kHTProxyMetaCounter + parity.
constexpr int kHTProxyHeadBase = 512;
constexpr int kHTProxyMetaCounter = 1024;
constexpr int kHTProxyNumCounters = 1026;

// Ring ids: channel c of area 0 (hop 1 / hop B) is ring c, of area 1 (hop 2 / hop A) ring C + c.
constexpr int kHTProxyMaxRings = 2 * kHTProxyMaxChannels;

// Device-resident progress of one Buffer (zeroed once at set-up, never reset).
struct HTProxyState {
  uint32_t op;                                            // ops started (parity = op & 1)
  uint32_t pad;
  int64_t seen[2][kHTProxyMaxRanks];                      // META counter values accounted
  uint64_t send_pos[kHTProxyMaxRanks][kHTProxyMaxRings];  // messages written per (dst, ring id)
  uint64_t recv_pos[kHTProxyMaxRanks][kHTProxyMaxRings];  // messages consumed per (src, ring id)
  // This rank's stream to itself never enters the proxy (no NIC would carry it): the sender stages
  // straight into its own receive ring and the two sides count in device memory.
  uint64_t self_tail[kHTProxyMaxRings];                   // messages staged into the own ring (TAIL)
  uint64_t self_head[kHTProxyMaxRings];                   // messages of it consumed (HEAD)
  // Geometry keys of the two ring areas as used since the last handshake (0: unused since): a
  // cached dispatch or combine needs the handshake only where it would use an area in another one.
  uint64_t area_geometry[2];
  // Area-1 streams with a node mate over NVLink (HTProxyForward*Params::mates), the proxy's TAIL and
  // HEAD counters' stand-ins, stored by the mate through its map of this struct: messages it wrote
  // into this rank's ring (TAIL), and messages of this rank's stream it consumed (HEAD).
  uint64_t mate_tail[kHTProxyMaxRanks][kHTProxyMaxRings];
  uint64_t mate_head[kHTProxyMaxRanks][kHTProxyMaxRings];
};

// Byte offset of a slot: rings [peer][ring - first_ring][slot] of `msg` bytes from `base`.
UCCL_EP_HOST_DEVICE constexpr uint64_t ht_ring_slot(uint64_t base, int64_t peer, int64_t lane, int64_t num_rings,
                                                    int64_t slots, int64_t slot, int64_t msg) {
  return base + uint64_t(((peer * num_rings + lane) * slots + slot) * msg);
}

// Meta records (uccl_ep.protocol.layout.MetaLayout): received [parity][src], sent [parity][dst].
UCCL_EP_HOST_DEVICE constexpr uint64_t ht_meta_recv(uint64_t base, int64_t slot_bytes, int64_t num_ranks, int64_t parity,
                                                    int64_t src) {
  return base + uint64_t((parity * num_ranks + src) * slot_bytes);
}
UCCL_EP_HOST_DEVICE constexpr uint64_t ht_meta_send(uint64_t base, int64_t slot_bytes, int64_t num_ranks, int64_t parity,
                                                    int64_t dst) {
  return base + uint64_t(((2 + parity) * num_ranks + dst) * slot_bytes);
}

// A dispatch message (the host executor's packed row): x bytes | scales (4 B each) | top-k ids
// (int64) | top-k weights (fp32) | source token index (int32), padded to 16 bytes. Fields after
// x are only 4-byte aligned (the host packs them back to back), so kernels move them as words.
struct HTDispatchMsg {
  int64_t scales, topk, weights, src, bytes;
};
UCCL_EP_HOST_DEVICE constexpr HTDispatchMsg ht_dispatch_msg(int64_t hidden_bytes, int64_t num_scales, int64_t num_topk) {
  return HTDispatchMsg{hidden_bytes, hidden_bytes + 4 * num_scales, hidden_bytes + 4 * num_scales + 8 * num_topk,
                       hidden_bytes + 4 * num_scales + 12 * num_topk,
                       (hidden_bytes + 4 * num_scales + 12 * num_topk + 4 + 15) / 16 * 16};
}

// With several ranks per node a dispatch message also carries the source rank and the bitmask of
// the destination node's local ranks that want the token (the host executor's hop-1 row).
UCCL_EP_HOST_DEVICE constexpr int64_t ht_forward_msg_bytes(int64_t hidden_bytes, int64_t num_scales, int64_t num_topk) {
  return (hidden_bytes + 4 * num_scales + 12 * num_topk + 12 + 15) / 16 * 16;
}

// A combine message: the BF16 row | top-k weights (fp32), padded to 16 bytes.
UCCL_EP_HOST_DEVICE constexpr int64_t ht_combine_msg_bytes(int64_t hidden, int64_t num_topk) {
  return (2 * hidden + 4 * num_topk + 15) / 16 * 16;
}

// A node's partial sum of a token (hop B): fp32 row | fp32 top-k weights, padded to 16 bytes; with
// bf16 the row rounded to BF16 (a combine message's layout, as DeepEP sends it).
UCCL_EP_HOST_DEVICE constexpr int64_t ht_partial_msg_bytes(int64_t hidden, int64_t num_topk, bool bf16 = false) {
  return ((bf16 ? 2 : 4) * hidden + 4 * num_topk + 15) / 16 * 16;
}

// The rings of one area of the region for one op (uccl_ep.protocol.rings.RingSpec, built by
// cuda/ht_proxy_plan.geometry), the same on every rank: a member of the params structs below
// (`ring`: area 0, hop 1 / hop B; `nvl_ring`: area 1, hop 2 / hop A of the forward kernels).
struct HTRingGeometry {
  int64_t msg_bytes;        // bytes per message (multiple of 16)
  int64_t ring_slots;       // messages per ring
  int64_t chunk;            // most messages per Write (<= 511)
  int64_t recv_base;        // region offset of the receive rings
  int64_t send_base;        // region offset of the staging rings
  int64_t first_ring;       // ring id (TAIL counter) of channel 0; HEAD(r) = head_base + r
  int64_t peer_div;         // the rings of peer r are row (r / peer_div) % peer_mod of the area: only
  int64_t peer_mod;         //    the peers an area's streams reach take room (forwarding: area 0 the
                            //    nodes' rail ranks, area 1 the node mates; otherwise every rank)
};

// A fresh dispatch's plan (ht/proxy/plan.cu), one rank per node or a forced proxy on one node.
struct HTProxyPlanSendParams {
  uint64_t is_token_in_rank;       // bool [T, R], contiguous
  uint64_t num_tokens_per_rank;    // int32 [R]
  uint64_t num_tokens_per_expert;  // int32 [E]
  uint64_t records;                // out int64 [R, L]: the notify record for each destination
  uint64_t send_prefix;            // out int32 [R, C]: my tokens to j in channels 0..c
  uint64_t send_head;              // out int32 [T, R]: index of token t among my tokens to j, or -1
  uint64_t send_rdma_head;         // out int32 [T, N] (several ranks per node; else 0): ... to node n
  uint64_t node_send_prefix;       // out int32 [N, C] (several ranks per node; else 0)
  int64_t num_tokens;
  int64_t num_ranks;
  int64_t ranks_per_node;          // G: 1, or > 1 with blocks R .. R + N for the nodes
  int64_t num_channels;
  int64_t num_local_experts;
  int64_t msg_bytes;
  int64_t node_col;                // column of the node counts in a record, or -1
  int64_t record_ints;             // L = R + C + E_loc (+ C with forwarding) + 1
};

struct HTProxyPlanRecvParams {
  uint64_t meta_out;               // int64 [R, L]: the records received, by source
  uint64_t send_prefix;            // int32 [R, C] (ht_proxy_plan_send's), copied to send_prefix_copy
  uint64_t recv_prefix;            // out int32 [R, C]: first row of (source, channel)
  uint64_t recv_end;               // out int32 [R]: end row of each source's block
  uint64_t recv_end_copy;          // out int32 [R] or 0
  uint64_t channel_prefix;         // out int32 [R, C] or 0: what source i sends me in channels 0..c
  uint64_t rank_prefix;            // out int32 [R, R] or 0: tokens sources 0..i send rank j
  uint64_t send_prefix_copy;       // out int32 [R, C] or 0
  uint64_t recv_src_meta;          // out int32 [rows, 2] or 0: (source node, NVL mask), zero past the real rows
  uint64_t nvl_head;               // out int32 [rows] or 0: the row, -1 past the real rows
  uint64_t recv_count;             // out int32 [R, C] or 0: what source i sends me in channel c
  uint64_t rdma_count;             // out int32 [N, C] (node_col >= 0): what node n's rail source forwards through me
  uint64_t rdma_end;               // out int32 [N]: end of node n's block of those rows
  uint64_t rdma_prefix;            // out int32 [N, C]: first of those rows per (node, channel)
  int64_t num_ranks;
  int64_t rank;
  int64_t ranks_per_node;
  int64_t num_channels;
  int64_t node_col;                // column of the node counts in a record, or -1 (no forwarding)
  int64_t record_ints;
  int64_t num_rows;
};

struct HTProxyNotifyParams {
  uint64_t per_dst;         // int64 [R, L]: the record for each destination (0: handshake)
  uint64_t meta_out;        // int64 [R, L]: the records received, by source (0: handshake)
  uint64_t region;          // device address of this rank's proxy region
  uint64_t fifos;           // fifo::FifoLayout[num_fifos] (device addresses)
  uint64_t counters;        // int64 [R][num_counters] (mapped host memory, device address)
  uint64_t status;          // a FIFO status word of the proxy (mapped host memory)
  uint64_t state;           // HTProxyState* (device)
  uint64_t host;            // int32 mapped host: [0] tag, [1] rows, [2, 2+R) per source, per expert, RDMA rows
  uint64_t error;           // ErrorWord*
  uint64_t dma;             // HtDmaContext* (device/ht_dma.cuh), 0: no copy role in this launch
  int64_t record_ints;      // L
  int64_t num_ranks;
  int64_t rank;
  int64_t num_counters;
  int64_t num_fifos;
  int64_t meta_base;        // region offset of the meta records
  int64_t meta_slot_bytes;
  int64_t expert_col;       // column of this rank's expert counts in a record
  int64_t node_col;         // column of the tokens to this rank's node per channel (-1: one rank per node)
  int64_t ranks_per_node;
  int64_t num_channels;
  int64_t num_local_experts;
  int64_t check_col;        // column every rank must agree on (message bytes), or -1
  int64_t expert_alignment;
  int64_t num_worst_tokens;
  int64_t host_tag;
  int64_t handshake;        // 1: no record, a bare fence (cached dispatch, combine), sent only where
                            //    an area's geometry changes (HTProxyState::area_geometry)
  uint64_t area_geometry0;  // this op's geometry key of ring area 0 (0: the op does not use it)
  uint64_t area_geometry1;  // ... of ring area 1
  int64_t timeout_ns;
  int64_t dma_blocks;       // copy-role blocks at the end of the grid (0: none)
  int64_t dma_senders;      // signals the main blocks give the copy role (one per pushing thread as it is done)
};

struct HTProxyDispatchParams {
  uint64_t x;               // [T, hidden_bytes]
  uint64_t x_scales;        // 4-byte elements, strided, or 0
  uint64_t topk_idx;        // int64 [T, K] or 0 (cached dispatch)
  uint64_t topk_weights;    // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t send_prefix;     // int32 [R, C]: tokens to rank j in channels <= c (inclusive)
  uint64_t recv_prefix;     // int32 [R, C]: first output row of (source i, channel c)
  uint64_t recv_end;        // int32 [R]: end row of source i's block (inclusive prefix over sources)
  uint64_t recv_x;
  uint64_t recv_scales;     // row-major [rows, num_scales] or 0
  uint64_t recv_topk_idx;   // int64 [rows, K] or 0
  uint64_t recv_topk_weights;  // fp32 [rows, K] or 0
  uint64_t recv_src_idx;    // int32 [rows] or 0
  uint64_t region;
  uint64_t fifos;
  uint64_t counters;
  uint64_t status;
  uint64_t state;
  uint64_t error;
  uint64_t dma;             // HtDmaContext* (device/ht_dma.cuh), 0: no copy role in this launch
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
  int64_t num_rows;         // rows of the outputs (num_worst_tokens pads)
  // this op's rings (one area: one rank per node)
  HTRingGeometry ring;
  int64_t head_base;
  int64_t num_counters;     // counters per source in the proxy's counter array
  int64_t num_fifos;
  int64_t timeout_ns;
  int64_t dma_blocks;       // copy-role blocks at the end of the grid (0: none)
  int64_t dma_senders;      // signals the main blocks give the copy role (one per pushing thread as it is done)
};

struct HTProxyCombineParams {
  uint64_t x;               // bf16 [rows, H]
  uint64_t topk_weights;    // fp32 [rows, K] or 0
  uint64_t bias0;           // bf16 [T, H] or 0
  uint64_t bias1;           // bf16 [T, H] or 0
  uint64_t out;             // bf16 [T, H]
  uint64_t out_weights;     // fp32 [T, K] or 0
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t send_head;       // int32 [T, R]: index of token t among the tokens sent to rank j, or -1
  uint64_t send_prefix;     // int32 [R, C]
  uint64_t recv_prefix;     // int32 [R, C]
  uint64_t recv_end;        // int32 [R]
  uint64_t region;
  uint64_t fifos;
  uint64_t counters;
  uint64_t status;
  uint64_t state;
  uint64_t error;
  uint64_t dma;             // HtDmaContext* (device/ht_dma.cuh), 0: no copy role in this launch
  int64_t num_tokens;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_ranks;
  int64_t rank;
  int64_t num_channels;
  // this op's rings (one area: one rank per node)
  HTRingGeometry ring;
  int64_t head_base;
  int64_t num_counters;     // counters per source in the proxy's counter array
  int64_t num_fifos;
  int64_t timeout_ns;
  int64_t dma_blocks;       // copy-role blocks at the end of the grid (0: none)
  int64_t dma_senders;      // signals the main blocks give the copy role (one per pushing thread as it is done)
};

}  // namespace uccl_ep

namespace uccl_ep {

// ---- several ranks per node: per-node dedup, forwarding inside the node, node-first reduce ------
// (ht/proxy/forward_dispatch.cu, ht/proxy/forward_combine.cu; uccl_ep/host/ht_internode.py)
//   hop 1 (area 0, ring c):      source -> the rank of its rail on each destination node, once
//   hop 2 (area 1, ring C + c):  that forwarder -> the other local ranks in the token's mask, the
//                                rail sources in ascending order (source-major), tokens in order;
//                                the forwarder places its own rows itself
//   hop A (area 1, ring C + c):  each rank returns its rows to the forwarder they came from
//   hop B (area 0, ring c):      the forwarder's fp32 partial (local ranks ascending) to the source,
//                                which adds the biases, then the nodes' partials in node order

struct HTProxyForwardDispatchParams {
  uint64_t x;
  uint64_t x_scales;
  uint64_t topk_idx;
  uint64_t topk_weights;
  uint64_t is_token_in_rank;  // bool [T, R]
  uint64_t node_send_prefix;  // int32 [N, C]: tokens to node n in channels <= c (inclusive)
  uint64_t rdma_prefix;       // int32 [N, C]: first RDMA-level row of (node m's rail source, channel c)
  uint64_t rdma_count;        // int32 [N, C]: tokens received from node m's rail source in channel c
  uint64_t recv_prefix;       // int32 [R, C]: first output row of (source, channel)
  uint64_t recv_end;          // int32 [R]
  uint64_t recv_count;        // int32 [R, C]: tokens each source sends this rank per channel
  uint64_t recv_x;
  uint64_t recv_scales;
  uint64_t recv_topk_idx;
  uint64_t recv_topk_weights;
  uint64_t recv_src_idx;
  uint64_t recv_mask;         // int32 [rows]: the NVL mask each received row carried
  uint64_t rdma_mask;         // int32 [rdma_rows]: the NVL mask of each token received at RDMA level
  uint64_t region;
  uint64_t fifos;
  uint64_t counters;
  uint64_t status;
  uint64_t state;
  uint64_t error;
  uint64_t dma;             // HtDmaContext* (device/ht_dma.cuh), 0: no copy role in this launch
  uint64_t mates;           // u64 [R][2] (device): each node mate's region and HTProxyState* as mapped
                            //    here (0 elsewhere): area-1 streams stored over NVLink; 0: all through the proxy
  int64_t num_tokens;
  int64_t hidden_bytes;
  int64_t num_scales;
  int64_t scale_stride_token;
  int64_t scale_stride_col;
  int64_t num_topk;
  int64_t num_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t ranks_per_node;
  int64_t num_channels;
  int64_t num_rows;
  int64_t rdma_rows;          // rows of rdma_mask
  // hop 1 (area 0)
  HTRingGeometry ring;
  // hop 2 (area 1): same messages
  HTRingGeometry nvl_ring;
  int64_t head_base;
  int64_t num_counters;
  int64_t num_fifos;
  int64_t timeout_ns;
  int64_t dma_blocks;       // copy-role blocks at the end of the grid (0: none)
  int64_t dma_senders;      // signals the main blocks give the copy role (one per pushing thread as it is done)
};

// DeepEP's handle items of a fresh dispatch with forwarding (ht/proxy/plan.cu ht_proxy_forward_handle),
// after the forwarding dispatch kernel recorded the NVL masks; ht_proxy_plan.forward_handle on the host.
struct HTProxyForwardHandleParams {
  uint64_t meta_out;          // int64 [R, L]: the records received, by source (columns 0..R: tokens per rank)
  uint64_t recv_end;          // int32 [R]: end row of each source's block
  uint64_t recv_mask;         // int32 [rows]: the NVL mask each received row carried
  uint64_t rdma_count;        // int32 [N, C]: what node n's rail source forwards through me per channel
  uint64_t rdma_end;          // int32 [N]: end of node n's block of those rows
  uint64_t rdma_mask;         // int32 [rdma_rows]: the NVL mask of each token received at RDMA level
  uint64_t recv_src_meta;     // out int32 [rows, 2]: (source node, NVL mask), zero past the real rows
  uint64_t send_nvl_head;     // out int32 [rdma_rows, G]: row of token k at local rank g, or -1
  uint64_t recv_rdma_prefix;  // out int32 [N, C]: rdma_count summed over channels 0..c
  uint64_t rdma_rank_prefix;  // out int32 [N]: a copy of rdma_end
  int64_t num_ranks;
  int64_t rank;
  int64_t ranks_per_node;
  int64_t num_channels;
  int64_t record_ints;        // L
  int64_t num_rows;           // rows of recv_mask / recv_src_meta (num_worst_tokens pads)
  int64_t rdma_rows;          // rows of rdma_mask / send_nvl_head (num_worst_tokens pads)
};

struct HTProxyForwardCombineParams {
  uint64_t x;                 // bf16 [rows, H]
  uint64_t topk_weights;      // fp32 [rows, K] or 0
  uint64_t bias0;
  uint64_t bias1;
  uint64_t out;
  uint64_t out_weights;
  uint64_t send_rdma_head;    // int32 [T, N]: index of token t among the tokens sent to node n, or -1
  uint64_t node_send_prefix;  // int32 [N, C]
  uint64_t rdma_prefix;       // int32 [N, C]
  uint64_t rdma_count;        // int32 [N, C]
  uint64_t rdma_mask;         // int32 [rdma_rows]
  uint64_t recv_prefix;       // int32 [R, C]
  uint64_t recv_end;          // int32 [R]
  uint64_t recv_count;        // int32 [R, C]
  uint64_t region;
  uint64_t fifos;
  uint64_t counters;
  uint64_t status;
  uint64_t state;
  uint64_t error;
  uint64_t dma;             // HtDmaContext* (device/ht_dma.cuh), 0: no copy role in this launch
  uint64_t mates;           // u64 [R][2] (device): each node mate's region and HTProxyState* as mapped
                            //    here (0 elsewhere): area-1 streams stored over NVLink; 0: all through the proxy
  int64_t num_tokens;
  int64_t hidden;
  int64_t num_topk;
  int64_t num_ranks;
  int64_t rank;
  int64_t ranks_per_node;
  int64_t num_channels;
  // hop B (area 0): partials
  HTRingGeometry ring;
  // hop A (area 1): rows
  HTRingGeometry nvl_ring;
  int64_t head_base;
  int64_t num_counters;
  int64_t num_fifos;
  int64_t timeout_ns;
  int64_t dma_blocks;       // copy-role blocks at the end of the grid (0: none)
  int64_t dma_senders;      // signals the main blocks give the copy role (one per pushing thread as it is done)
  int64_t partial_bf16;     // 1: hop B carries BF16 partials (Tuning.ht_partials_bf16); 0: fp32
};

}  // namespace uccl_ep
