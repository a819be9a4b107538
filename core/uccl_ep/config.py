"""`Config` (SM count and chunk sizes) and buffer size hints, with DeepEP V1's values.

Frameworks size their buffers from these hints (max of the dispatch and combine configs'
`get_nvl_buffer_size_hint`, `get_rdma_buffer_size_hint`) and from
`Buffer.get_low_latency_rdma_size_hint`, so the formulas are DeepEP V1's (docs/api.md,
`uccl_ep.Config`); every executor of uccl_ep fits its buffers inside them.
"""

from __future__ import annotations

from .errors import InvalidArgument

__all__ = [
    "Config",
    "NUM_MAX_NVL_PEERS",
    "NUM_MAX_LOCAL_EXPERTS",
    "NUM_BUFFER_ALIGNMENT_BYTES",
    "dispatch_config_table",
    "combine_config_table",
    "low_latency_rdma_size_hint",
]

NUM_MAX_NVL_PEERS = 8
NUM_MAX_LOCAL_EXPERTS = 1024
NUM_BUFFER_ALIGNMENT_BYTES = 128
_NUM_MAX_TOPK_SLOTS = 128     # per-token top-k slots reserved in a channel slot
_NUM_MAX_SCALE_SLOTS = 128    # per-token scale slots reserved in a channel slot
_SOURCE_META_BYTES = 8        # internode source metadata per token
_TOPK_IDX_BYTES = 8           # topk_idx_t = int64


def _align(n: int, a: int = NUM_BUFFER_ALIGNMENT_BYTES) -> int:
    return (n + a - 1) // a * a


class Config:
    """Kernel configuration: SMs and chunk sizes (positional or keyword, as in DeepEP).

    ``num_sms`` must be even (one channel = a sender SM + a receiver SM). DeepEP's invariants are
    checked here with typed errors: ``nvl_send < nvl_recv``, ``rdma_send <= rdma_recv / 2``; and
    ``rdma_recv`` is rounded up to a multiple of ``rdma_send``.
    """

    __slots__ = ("num_sms", "num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                 "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens")

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256) -> None:
        for name, value in (("num_sms", num_sms),
                            ("num_max_nvl_chunked_send_tokens", num_max_nvl_chunked_send_tokens),
                            ("num_max_nvl_chunked_recv_tokens", num_max_nvl_chunked_recv_tokens),
                            ("num_max_rdma_chunked_send_tokens", num_max_rdma_chunked_send_tokens),
                            ("num_max_rdma_chunked_recv_tokens", num_max_rdma_chunked_recv_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgument(name, "a positive int", repr(value))
        if num_sms % 2 != 0:
            raise InvalidArgument("num_sms", "an even number (one channel = 2 SMs)", num_sms)
        if num_max_nvl_chunked_send_tokens >= num_max_nvl_chunked_recv_tokens:
            raise InvalidArgument("num_max_nvl_chunked_send_tokens",
                                  f"< num_max_nvl_chunked_recv_tokens ({num_max_nvl_chunked_recv_tokens})",
                                  num_max_nvl_chunked_send_tokens)
        if num_max_rdma_chunked_send_tokens > num_max_rdma_chunked_recv_tokens // 2:
            raise InvalidArgument("num_max_rdma_chunked_send_tokens",
                                  f"<= num_max_rdma_chunked_recv_tokens / 2 ({num_max_rdma_chunked_recv_tokens // 2})",
                                  num_max_rdma_chunked_send_tokens)
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        # Round the RDMA receive ring up to a whole number of send chunks.
        r = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = (num_max_rdma_chunked_recv_tokens + r - 1) // r * r

    @property
    def num_channels(self) -> int:
        return self.num_sms // 2

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of the NVLink buffer the normal kernels need for ``num_ranks`` ranks."""
        _check_ranks(num_ranks)
        num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
        num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
        slots = self.num_channels * num_nvl_ranks * self.num_max_nvl_chunked_recv_tokens
        n = self.num_channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
        n += slots * int(hidden_bytes)
        n += slots * _SOURCE_META_BYTES
        n += slots * _NUM_MAX_TOPK_SLOTS * _TOPK_IDX_BYTES
        n += slots * _NUM_MAX_TOPK_SLOTS * 4
        n += slots * _NUM_MAX_SCALE_SLOTS * 4
        return _align(n)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of the RDMA buffer for internode normal kernels; 0 within one node (<= 8 ranks)."""
        _check_ranks(num_ranks)
        if num_ranks <= NUM_MAX_NVL_PEERS:
            return 0
        num_rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
        slots = self.num_channels * num_rdma_ranks * self.num_max_rdma_chunked_recv_tokens
        n = self.num_channels * num_rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
        n += slots * int(hidden_bytes) * 2
        n += slots * _SOURCE_META_BYTES * 2
        n += slots * _NUM_MAX_TOPK_SLOTS * _TOPK_IDX_BYTES * 2
        n += slots * _NUM_MAX_TOPK_SLOTS * 4 * 2
        n += slots * _NUM_MAX_SCALE_SLOTS * 4 * 2
        return _align(n)

    def _astuple(self) -> tuple[int, int, int, int, int]:
        return (self.num_sms, self.num_max_nvl_chunked_send_tokens, self.num_max_nvl_chunked_recv_tokens,
                self.num_max_rdma_chunked_send_tokens, self.num_max_rdma_chunked_recv_tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._astuple() == other._astuple()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __repr__(self) -> str:
        return ("Config(num_sms={}, num_max_nvl_chunked_send_tokens={}, num_max_nvl_chunked_recv_tokens={}, "
                "num_max_rdma_chunked_send_tokens={}, num_max_rdma_chunked_recv_tokens={})".format(*self._astuple()))


def _check_ranks(num_ranks: int) -> None:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise InvalidArgument("num_ranks", "a positive int", repr(num_ranks))


# (nvl_send, nvl_recv, rdma_send, rdma_recv) per group size, DeepEP V1's tuned values, except the RDMA
# chunk of groups of <= 8 ranks: DeepEP never reads it there (one node), uccl-ep's proxy path does when
# such a group spans hosts or is forced through the proxy (12: the measured choice, docs/benchmarks.md).
_DISPATCH_TABLE = {
    2: (24, 256, 12, 128), 4: (6, 256, 12, 128), 8: (6, 256, 12, 128),
    16: (36, 288, 20, 128), 24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128),
    64: (32, 288, 8, 128), 96: (20, 480, 12, 128), 128: (20, 560, 12, 128),
    144: (32, 720, 12, 128), 160: (28, 720, 12, 128),
}
_COMBINE_TABLE = {
    2: (10, 256, 12, 128), 4: (9, 256, 12, 128), 8: (4, 256, 12, 128),
    16: (4, 288, 12, 128), 24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128),
    64: (1, 288, 8, 128), 96: (1, 480, 8, 128), 128: (1, 560, 8, 128),
    144: (2, 720, 8, 128), 160: (2, 720, 8, 128),
}


def _nearest_config(table: dict[int, tuple[int, int, int, int]], num_ranks: int) -> tuple[int, int, int, int]:
    # NOTES: DeepEP asserts on group sizes outside its table (issues #300, #541). We are not tied
    # to 8-GPU nodes, so sizes like 1, 3, 6 or 12 take the entry of the next larger tuned size.
    _check_ranks(num_ranks)
    if num_ranks in table:
        return table[num_ranks]
    larger = [k for k in sorted(table) if k >= num_ranks]
    return table[larger[0] if larger else max(table)]


def dispatch_config_table(num_ranks: int, num_sms: int) -> Config:
    nvl_send, nvl_recv, rdma_send, rdma_recv = _nearest_config(_DISPATCH_TABLE, num_ranks)
    return Config(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)


def combine_config_table(num_ranks: int, num_sms: int) -> Config:
    nvl_send, nvl_recv, rdma_send, rdma_recv = _nearest_config(_COMBINE_TABLE, num_ranks)
    return Config(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)


def low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                               num_experts: int) -> int:
    """Bytes of the low-latency buffer: two ping-pong sets of (send, recv, signal) areas.

    Does not depend on ``num_ranks`` (kept for the API). dispatch message = 16 B header +
    max(2*hidden, hidden + hidden/128*4); combine message = hidden/128*4 + 2*hidden.
    """
    for name, value in (("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank),
                        ("hidden", hidden), ("num_ranks", num_ranks), ("num_experts", num_experts)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidArgument(name, "a positive int", repr(value))
    if hidden % 128 != 0:
        raise InvalidArgument("hidden", "a multiple of 128", hidden)
    t, e = num_max_dispatch_tokens_per_rank, num_experts
    dispatch_msg = 16 + max(hidden * 2, hidden + hidden // 128 * 4)
    combine_msg = hidden // 128 * 4 + hidden * 2
    send = max(t * dispatch_msg, e * t * combine_msg)
    recv = e * t * max(dispatch_msg, combine_msg)
    signal = _align(e * 4)
    return _align(2 * (send + recv + signal))
