"""The flex dispatcher's "uccl" backend: a DeepEP-style manager whose communication is uccl_ep.

Megatron-Core's `MoEFlexTokenDispatcher.__init__` picks a manager by
``config.moe_flex_dispatcher_backend`` and raises for names it does not know. The hook wraps
``__init__``: for "uccl" it builds `UcclManager`, otherwise it calls Megatron's own code
untouched (so "deepep", "hybridep" and "ncclep" keep working in the same process).

`UcclManager` inherits Megatron's `_DeepepManager` for everything that is not communication
(routing-map -> top-k metadata with -1 for dropped tokens, the permute into per-expert order and
its inverse, padding for quantization) and replaces only the constructor (no `deep_ep` needed)
and the two communication calls.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

import uccl_ep
from uccl_ep.errors import InvalidArgument

from .config_patch import BACKEND_NAME
from .dispatch import uccl_combine, uccl_dispatch

__all__ = ["make_manager_class", "patch_flex_dispatcher", "unpatch_flex_dispatcher"]

_state: dict[str, Any] = {}
_manager_cls: type | None = None

#: Megatron's default SM count for DeepEP-style kernels when moe_flex_dispatcher_num_sms is unset
DEFAULT_NUM_SMS = 20


def make_manager_class() -> type:
    """Build (once) `UcclManager` as a subclass of this Megatron's `_DeepepManager`."""
    global _manager_cls
    if _manager_cls is not None:
        return _manager_cls
    from megatron.core.transformer.moe.token_dispatcher import _DeepepManager

    class UcclManager(_DeepepManager):
        """`_DeepepManager` with uccl_ep.Buffer underneath (flex backend "uccl")."""

        def __init__(self, group, num_local_experts: int, router_topk: int, num_experts: int, config) -> None:
            # NOTES: the parent constructor refuses to run without deep_ep; these are the fields its
            # other methods read (Megatron-Core 0.19), set here without it.
            self.group = group
            self.num_local_experts = num_local_experts
            self.config = config
            self.router_topk = router_topk
            self.num_experts = num_experts
            self.router_dtype = config.moe_router_dtype
            self.capacity_factor = config.moe_expert_capacity_factor
            self.permute_fusion = config.moe_permute_fusion
            self.token_indices = None
            self.token_probs = None
            self.handle = None
            num_sms = config.moe_flex_dispatcher_num_sms
            uccl_ep.Buffer.set_num_sms(DEFAULT_NUM_SMS if num_sms is None else num_sms)

        def dispatch(self, hidden_states: torch.Tensor, async_finish: bool = False,
                     allocate_on_comm_stream: bool = False) -> torch.Tensor:
            # Routing weights travel as fp32 (DeepEP's contract, kept by uccl_ep).
            if self.token_probs.dtype != torch.float32:
                self.token_probs = self.token_probs.float()
            hidden_states, self.dispatched_indices, self.dispatched_probs, self.tokens_per_expert, self.handle = \
                uccl_dispatch(hidden_states, self.token_indices, self.token_probs, self.num_experts, self.group,
                              async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream)
            return hidden_states

        def combine(self, hidden_states: torch.Tensor, async_finish: bool = False,
                    allocate_on_comm_stream: bool = False) -> torch.Tensor:
            hidden_states, _ = uccl_combine(hidden_states, self.group, self.handle, async_finish=async_finish,
                                            allocate_on_comm_stream=allocate_on_comm_stream)
            # Drop per-step state as Megatron's manager does (the handle pins the routing plan).
            self.handle = None
            self.dispatched_indices = None
            self.dispatched_probs = None
            return hidden_states

    _manager_cls = UcclManager
    return UcclManager


def _init_uccl(self, num_local_experts, local_expert_indices, config, pg_collection=None) -> None:
    """The "uccl" branch of MoEFlexTokenDispatcher.__init__ (mirrors Megatron's "deepep" branch)."""
    from megatron.core.transformer.moe.token_dispatcher import MoETokenDispatcher

    MoETokenDispatcher.__init__(self, config=config, pg_collection=pg_collection)
    self.num_local_experts = num_local_experts
    self.local_expert_indices = local_expert_indices
    if self.tp_size * self.ep_size <= 1:
        raise InvalidArgument("expert_model_parallel_size",
                              "expert x tensor parallel size > 1 for moe_flex_dispatcher_backend='uccl'",
                              f"EP {self.ep_size} x TP {self.tp_size}",
                              hint="with a single rank there is nothing to dispatch; use the alltoall dispatcher")
    self._comm_manager = make_manager_class()(
        group=self.tp_ep_group,
        num_local_experts=self.num_local_experts,
        router_topk=self.tp_size * self.config.moe_router_topk,
        num_experts=self.tp_size * self.config.num_moe_experts,
        config=self.config,
    )
    self.cudagraph_attrs = ["_comm_manager.token_probs", "_comm_manager.token_indices"]


def patch_flex_dispatcher() -> None:
    """Route ``moe_flex_dispatcher_backend == "uccl"`` to `UcclManager` (idempotent)."""
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher

    if _state:
        return
    make_manager_class()
    original: Callable = MoEFlexTokenDispatcher.__init__

    @functools.wraps(original)
    def init(self, num_local_experts, local_expert_indices, config, pg_collection=None, *args, **kwargs):
        if getattr(config, "moe_flex_dispatcher_backend", None) == BACKEND_NAME:
            if args or kwargs:
                raise InvalidArgument("MoEFlexTokenDispatcher()", "(num_local_experts, local_expert_indices, "
                                      "config, pg_collection)", f"extra arguments {args} {sorted(kwargs)}")
            return _init_uccl(self, num_local_experts, local_expert_indices, config, pg_collection)
        return original(self, num_local_experts, local_expert_indices, config, pg_collection, *args, **kwargs)

    MoEFlexTokenDispatcher.__init__ = init
    _state.update(cls=MoEFlexTokenDispatcher, init=original)


def unpatch_flex_dispatcher() -> None:
    if not _state:
        return
    _state["cls"].__init__ = _state["init"]
    _state.clear()
