"""Group topology: ranks per node (NVLink domain) and node count.

DeepEP assumes exactly 8 GPUs per node. uccl_ep reads the real layout (ranks sharing a host
name), or ``ranks_per_node`` from the constructor / ``UCCL_EP_RANKS_PER_NODE`` so that e.g. two
GPUs of one host can act as two nodes and exercise the internode protocol. Ranks of node n
must be the contiguous block ``[n*G, (n+1)*G)``, as torchrun and Slurm number them.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from .errors import InvalidArgument

__all__ = ["Topology", "detect_topology"]


@dataclass(frozen=True)
class Topology:
    num_ranks: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.ranks_per_node < 1 or self.num_ranks % self.ranks_per_node != 0:
            raise InvalidArgument("ranks_per_node", f"a divisor of the group size {self.num_ranks}",
                                  self.ranks_per_node)

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.ranks_per_node

    @property
    def is_internode(self) -> bool:
        return self.num_nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.ranks_per_node


def detect_topology(hostnames: list[str], ranks_per_node: int = 0) -> Topology:
    """Topology from every rank's host name, or from an explicit ``ranks_per_node`` (> 0)."""
    num_ranks = len(hostnames)
    if ranks_per_node > 0:
        return Topology(num_ranks, ranks_per_node)
    # Contiguous blocks of equal host names.
    blocks: list[tuple[str, int]] = []
    for h in hostnames:
        if blocks and blocks[-1][0] == h:
            blocks[-1] = (h, blocks[-1][1] + 1)
        else:
            blocks.append((h, 1))
    names = [b[0] for b in blocks]
    sizes = {b[1] for b in blocks}
    if len(set(names)) != len(names):
        raise InvalidArgument("group", "ranks of one host numbered contiguously (node-major order)",
                              f"host order {hostnames}",
                              hint="launch with torchrun/srun rank order, or set ranks_per_node")
    if len(sizes) != 1:
        raise InvalidArgument("group", "the same number of ranks on every host",
                              f"{dict(blocks)}", hint="or set ranks_per_node / UCCL_EP_RANKS_PER_NODE")
    return Topology(num_ranks, sizes.pop())


def local_hostname() -> str:
    return socket.gethostname()
