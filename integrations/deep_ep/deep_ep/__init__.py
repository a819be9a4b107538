"""``import deep_ep`` backed by uccl_ep (distribution ``deep-ep-uccl``).

For stacks that only know DeepEP's module name (Megatron-Core's flex dispatcher with
``--moe-flex-dispatcher-backend deepep``, vLLM's ``deepep_*`` all2all backends, Primus-Turbo's
``DEEP_EP``): the same classes as ``uccl_ep`` under DeepEP V1's names. ``deep_ep.utils`` exports
``EventHandle`` and ``EventOverlap``, as Megatron-Core imports them.

Never install this beside SGLang >= 0.5.20: SGLang depends on ``sgl-deep-ep``, which owns the
same ``deep_ep`` directory; pip would overwrite one with the other. SGLang selects uccl_ep with
its own plugin (``--moe-a2a-backend uccl``) instead.
"""

from uccl_ep import Buffer, Config, EventHandle, EventOverlap, topk_idx_t
from uccl_ep import __version__ as uccl_ep_version

from . import utils
from ._guard import warn_if_beside_sglang

__version__ = "1.2.1+uccl." + uccl_ep_version
__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t", "utils"]

warn_if_beside_sglang()
