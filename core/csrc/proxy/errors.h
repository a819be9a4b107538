// Errors of the native core, one-to-one with the Python classes in uccl_ep.errors (the bindings
// translate EpError into them).
#pragma once

#include <stdexcept>
#include <string>

namespace uccl_ep {

enum class ErrorKind {
  kTimeout,            // a bounded wait expired (rank, peer, phase, outstanding)
  kPeerFailure,        // a peer died or closed its endpoint
  kPeerProtocolError,  // a peer (or a producer) broke the protocol: bounds, bad immediate, token
  kAborted,            // the proxy was stopped while someone waited
  kInvalidArgument,    // a caller passed something out of range
  kUnsupported,        // valid, but not on this build / machine
};

struct ErrorInfo {
  ErrorKind kind = ErrorKind::kAborted;
  int rank = -1;
  int peer = -1;           // -1: no specific peer
  std::string phase;       // what was going on ("ll_dispatch recv", "bootstrap", "transport", ...)
  std::string detail;
  double waited_s = 0.0;   // kTimeout
  std::string outstanding; // kTimeout: what was still missing
};

std::string describe(const ErrorInfo& e);

struct EpError : std::runtime_error {
  explicit EpError(ErrorInfo info) : std::runtime_error(describe(info)), info(std::move(info)) {}
  ErrorInfo info;
};

inline std::string describe(const ErrorInfo& e) {
  std::string who = e.peer >= 0 ? "peer " + std::to_string(e.peer) : "a peer";
  switch (e.kind) {
    case ErrorKind::kTimeout:
      return "rank " + std::to_string(e.rank) + " timed out after " + std::to_string(e.waited_s) + "s waiting for " + who +
             " in phase '" + e.phase + "'" + (e.outstanding.empty() ? "" : "; outstanding: " + e.outstanding);
    case ErrorKind::kPeerFailure:
      return "rank " + std::to_string(e.rank) + ": " + who + " failed during '" + e.phase + "': " + e.detail;
    case ErrorKind::kPeerProtocolError:
      return "rank " + std::to_string(e.rank) + ": protocol error with " + who + " in '" + e.phase + "': " + e.detail;
    case ErrorKind::kAborted:
      return "rank " + std::to_string(e.rank) + ": aborted during '" + e.phase + "': " + e.detail;
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kUnsupported:
      return e.detail;
  }
  return e.detail;
}

inline ErrorInfo error_info(ErrorKind kind, int rank, int peer, std::string phase, std::string detail) {
  ErrorInfo e;
  e.kind = kind;
  e.rank = rank;
  e.peer = peer;
  e.phase = std::move(phase);
  e.detail = std::move(detail);
  return e;
}

[[noreturn]] inline void throw_error(ErrorKind kind, int rank, int peer, std::string phase, std::string detail) {
  throw EpError(error_info(kind, rank, peer, std::move(phase), std::move(detail)));
}

}  // namespace uccl_ep
