// The host <-> kernel ABI of uccl_ep's GPU kernels: parameter structs and the error word.
//
// Every kernel takes exactly one of these structs by value. All fields are 64-bit (pointers are
// uint64_t device addresses) so the layout is an array of 8-byte words with no padding, and the
// Python side (uccl_ep/cuda/params.py) packs it from the field names in the same order; a CPU test
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

enum ErrorCode : int { kErrNone = 0, kErrTimeout = 1, kErrProtocol = 2 };

enum Phase : int {
  kPhaseLLDispatchRecv = 1,
  kPhaseLLCombineRecv = 2,
  kPhaseHTNotify = 3,
  kPhaseHTDispatchSend = 4,
  kPhaseHTDispatchRecv = 5,
  kPhaseHTCombineSend = 6,
  kPhaseHTCombineRecv = 7,
  kPhaseBarrier = 8,
};

// ---- low-latency ---------------------------------------------------------------------------------
// Per buffer set (two alternate): recv area, dispatch signals [E_loc][R] u64, combine signals [E] u64.
// A signal is (tag << 32) | count; tag = completed ops on that set + 1 (see ll_dispatch.cu NOTES).

struct LLDispatchParams {
  uint64_t x;               // bf16 [T, H]
  uint64_t topk_idx;        // int64 [T, K]
  uint64_t peer_recv;       // u64[R]: each rank's recv area of this set (own entry = local)
  uint64_t peer_signal;     // u64[R]: each rank's dispatch signal area of this set
  uint64_t seq;             // u32 device word: completed ops on this set (tag = seq + 1)
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
  int64_t masked;           // bitmask of masked ranks
};

struct LLDispatchRecvParams {
  uint64_t recv_area;       // this rank's recv area of the set
  uint64_t signal;          // this rank's dispatch signals of the set
  uint64_t seq;             // u32 device word of the set
  uint64_t done;            // u32 device word: blocks finished (last one bumps seq)
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
  int64_t masked;
  int64_t timeout_ns;
};

struct LLCombineParams {
  uint64_t y;               // bf16 [E_loc, R*T, H]
  uint64_t src_info;        // int32 [E_loc, R*T]
  uint64_t layout_range;    // int64 [E_loc, R]
  uint64_t peer_recv;       // u64[R]: combine recv areas of this set ([E][T][H] bf16)
  uint64_t peer_signal;     // u64[R]: combine signal areas of this set ([E] u64)
  uint64_t seq;
  int64_t num_max;
  int64_t hidden;
  int64_t num_local_experts;
  int64_t num_ranks;
  int64_t rank;
  int64_t masked;
};

struct LLCombineRecvParams {
  uint64_t recv_area;       // [E][T][H] bf16
  uint64_t signal;          // [E] u64
  uint64_t seq;
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
  int64_t masked;
  int64_t timeout_ns;
};

}  // namespace uccl_ep
