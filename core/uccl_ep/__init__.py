"""uccl_ep: portable expert-parallel dispatch/combine with DeepEP V1's API.

    import uccl_ep
    buffer = uccl_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)   # same as deep_ep.Buffer

Public surface (docs/api.md): Buffer, Config, Tuning, EventOverlap, EventHandle, topk_idx_t, utils,
refs (the pure-torch reference), env (env-var registry), errors (typed errors).
Importing this package touches no GPU, no NIC and no compiler.
"""

from ._version import __version__
from . import env, errors, log
from .buffer import Buffer, topk_idx_t
from .config import Config
from .tuning import Tuning
from .events import EventHandle, EventOverlap
from . import utils

__all__ = ["__version__", "Buffer", "Config", "Tuning", "EventHandle", "EventOverlap", "topk_idx_t", "utils", "env", "errors",
           "get_low_latency_rdma_size_hint"]

get_low_latency_rdma_size_hint = Buffer.get_low_latency_rdma_size_hint

log.configure()
