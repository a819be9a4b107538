"""Ring geometry shared by every executor's normal-mode streams: how deep each ring of a phase is,
how many tokens go per chunk, and where in the shared area its slots lie."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LimitExceeded
from ..proxy.limits import check_protocol_limits

__all__ = ["RingSpec", "ring_spec"]


@dataclass
class RingSpec:
    msg_bytes: int
    ring_slots: int
    chunk: int
    num_rings: int
    threads: int
    timeout_s: float
    phase: str
    recv_base: int = 0
    send_base: int = 0
    first_ring: int = 0
    peer_div: int = 1      # the rings of peer r are row (r // peer_div) % peer_mod of the area
    peer_mod: int = 0

    def as_dict(self, phase: str) -> dict:
        d = dict(self.__dict__)
        d["phase"] = phase
        return d


def ring_spec(ex, msg_bytes: int, num_rings: int, cfg_slots: int, cfg_chunk: int, phase: str, area: int = 0,
              areas: int = 1, peers: int = 0, peer_div: int = 1) -> RingSpec:
    """Rings of `num_rings` per peer in area `area` of `areas` equal parts of the shared area
    (ring ids ``area * num_rings + [0, num_rings)``), as deep as the config asks and space allows.
    ``peers`` rows of rings (default: every rank), peer r's at row (r // peer_div) % peers: an area
    whose streams reach only some ranks (a forwarding hop: one rank per node, or the node's mates)
    gives them deeper rings.

    NOTES: phases that may overlap in time on some rank (e.g. the two hops of internode combine,
    which carry messages of different sizes) take different areas, so one hop's slots can never
    overlay the other's."""
    R = peers or ex.num_ranks
    part = ex.shared_bytes // areas // 16 * 16
    budget = part // (2 * R * num_rings)
    slots = min(cfg_slots, budget // msg_bytes, 1024)
    if slots < 1:
        raise LimitExceeded("num_nvl_bytes", f"bytes of one message ({msg_bytes}) in the host executor's rings "
                            f"({2 * R * num_rings * areas} rings in {ex.shared_bytes} bytes)", msg_bytes, budget)
    chunk = max(1, min(cfg_chunk, max(1, slots // 2), 511, ((1 << 24) - 1) // msg_bytes))
    check_protocol_limits(R, chunk_tokens=chunk, ring_tokens=slots, message_bytes=chunk * msg_bytes)
    spec = RingSpec(msg_bytes, slots, chunk, num_rings, ex.threads, ex.timeout_s, phase)
    spec.first_ring = area * num_rings
    spec.recv_base = area * part
    spec.send_base = spec.recv_base + R * num_rings * slots * msg_bytes
    spec.peer_div, spec.peer_mod = peer_div, R
    return spec
