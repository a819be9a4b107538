"""The limits implied by the protocol's field widths (kernels/include/uccl_ep/protocol.h and
immediate.h), read from the native module so Python never restates a bit width.

`check_protocol_limits` is what `Buffer.__init__` (and each op, for per-call sizes) calls: it
raises `LimitExceeded` naming the limit and by how much a request is over it.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import LimitExceeded

__all__ = ["protocol_limits", "check_protocol_limits", "LL_COUNTERS_PER_LOCAL_EXPERT"]

#: Counters a low-latency buffer uses per local expert: 2 buffer sets x (dispatch, combine).
LL_COUNTERS_PER_LOCAL_EXPERT = 4


@lru_cache(maxsize=1)
def protocol_limits() -> dict:
    """Limits from the protocol headers, e.g. ``max_ranks``, ``max_write_bytes``, ``max_counters``."""
    from .native import native
    return dict(native().protocol_limits())


def check_protocol_limits(num_ranks: int, *, num_experts: int = 0, num_max_tokens: int = 0, hidden: int = 0,
                          num_rdma_bytes: int = 0, num_nvl_bytes: int = 0, num_channels: int = 0,
                          chunk_tokens: int = 0, ring_tokens: int = 0, message_bytes: int = 0) -> None:
    """Raise `LimitExceeded` if a buffer of this shape cannot be expressed in TransferCmds.

    - ``num_ranks``: destination rank field;
    - ``num_experts`` (low-latency: experts per rank x 4 counters per source) and ``num_max_tokens``
      (tokens per (source, expert) counted by one fenced atomic);
    - ``hidden``: one token row (BF16, 2 bytes per element) must fit in one write;
    - ``num_rdma_bytes`` / ``num_nvl_bytes``: offsets address at most ``max_region_bytes``;
    - ``num_channels``: high-throughput ordered counters (one per channel);
    - ``chunk_tokens``: tokens one ordered write may add to a channel tail;
    - ``ring_tokens``: ordered writes one channel may have in flight (reorder window);
    - ``message_bytes``: largest single write.
    """
    lim = protocol_limits()
    if num_ranks > lim["max_ranks"]:
        raise LimitExceeded("num_ranks", "ranks in the group (12-bit destination rank)", num_ranks, lim["max_ranks"])
    if num_experts and num_ranks:
        local = (num_experts + num_ranks - 1) // num_ranks
        limit = lim["max_counters"] // LL_COUNTERS_PER_LOCAL_EXPERT
        if local > limit:
            raise LimitExceeded("num_experts", f"experts per rank ({LL_COUNTERS_PER_LOCAL_EXPERT} counters each, "
                                f"{lim['max_counters']} counters per source)", local, limit)
    if num_max_tokens > lim["max_fenced_count"]:
        raise LimitExceeded("num_max_dispatch_tokens_per_rank", "tokens one fenced atomic can count",
                            num_max_tokens, lim["max_fenced_count"])
    if hidden and 2 * hidden > lim["max_write_bytes"]:
        raise LimitExceeded("hidden", "bytes of one token row in one write", 2 * hidden, lim["max_write_bytes"])
    for name, value in (("num_rdma_bytes", num_rdma_bytes), ("num_nvl_bytes", num_nvl_bytes)):
        if value > lim["max_region_bytes"]:
            raise LimitExceeded(name, f"bytes addressable by a 31-bit offset in {lim['offset_unit_bytes']}-byte units",
                                value, lim["max_region_bytes"])
    for argument, value, what, key in (
            ("num_channels", num_channels, "channels (ordered counters per source)", "max_ordered_counters"),
            ("chunk_tokens", chunk_tokens, "tokens one ordered write adds to a channel tail", "max_increment"),
            ("ring_tokens", ring_tokens, "ordered writes in flight per channel (reorder window)", "max_ordered_in_flight"),
            ("message_bytes", message_bytes, "bytes of one write (24-bit length)", "max_write_bytes")):
        if value > lim[key]:
            raise LimitExceeded(argument, what, value, lim[key])
