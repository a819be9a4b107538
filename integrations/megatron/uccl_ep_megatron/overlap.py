"""``--overlap-moe-expert-parallel-comm`` (Megatron's combined 1F1B EP-overlap schedule) for the
flex backend "uccl".

Megatron-Core splits each transformer layer into schedule nodes (attention + router, dispatch,
experts, combine) that run on a compute and a communication stream, each node with its own
autograd segment. Two places decide by backend *name* how the flex dispatcher's manager is wired
into those segments:

- ``models/gpt/fine_grained_callables.build_transformer_layer_callables``: for "deepep" (and
  "hybridep", "ncclep") the dispatch node hands the manager the node's detached ``probs`` and the
  experts node its detached ``dispatched_probs``, so each node's backward stays inside its
  segment;
- ``models/common/utils.should_free_input``: for those names the dispatch node keeps its inputs
  (the manager's backward needs them) instead of freeing their storage.

`UcclManager` is Megatron's `_DeepepManager` with uccl_ep communication underneath (same fields,
same autograd contract), so "uccl" needs exactly the "deepep" wiring. This module wraps both
functions so that, for a flex/uccl config, they run Megatron's own code with the backend name
read as "deepep"; every other config goes through untouched. Nothing else of the schedule
depends on the name.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from .config_patch import BACKEND_NAME

__all__ = ["patch_overlap_schedule", "unpatch_overlap_schedule", "overlap_supported", "WIRED_AS"]

#: the Megatron flex backend whose schedule wiring "uccl" shares
WIRED_AS = "deepep"

_state: dict[str, Any] = {}
_missing: Optional[str] = None


class _ReadAsDeepep:
    """A read-only view of a TransformerConfig whose flex backend reads as "deepep"."""

    __slots__ = ("_config",)

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        if name == "moe_flex_dispatcher_backend":
            return WIRED_AS
        return getattr(self._config, name)


def _uses_uccl(config: Any) -> bool:
    return (getattr(config, "moe_token_dispatcher_type", None) == "flex"
            and getattr(config, "moe_flex_dispatcher_backend", None) == BACKEND_NAME)


def overlap_supported() -> Optional[str]:
    """None when the hook covers this Megatron's overlap schedule, else why not."""
    return _missing if _state or _missing else "uccl_ep_megatron.install() has not run"


def patch_overlap_schedule() -> bool:
    """Wrap Megatron's two name-keyed overlap decisions (idempotent); False (and the reason in
    `overlap_supported`) when this Megatron does not have them where expected."""
    global _missing
    if _state:
        return True
    try:
        from megatron.core.models.common import fine_grained_callables as common_callables
        from megatron.core.models.common import utils as common_utils
        from megatron.core.models.gpt import fine_grained_callables as gpt_callables
    except ImportError as exc:
        _missing = f"megatron-core has no EP-overlap schedule modules ({exc})"
        return False
    build: Optional[Callable] = getattr(gpt_callables, "build_transformer_layer_callables", None)
    free: Optional[Callable] = getattr(common_utils, "should_free_input", None)
    if build is None or free is None or getattr(common_callables, "build_transformer_layer_callables", None) \
            is not build:
        _missing = ("megatron-core's EP-overlap schedule is laid out differently from 0.19 "
                    "(build_transformer_layer_callables / should_free_input not found where expected)")
        return False

    @functools.wraps(build)
    def build_transformer_layer_callables(layer):
        config = getattr(layer, "config", None)
        if not _uses_uccl(config):
            return build(layer)
        # NOTES: the builder reads the backend name once, up front, into the flags its closures
        # keep; the name reads as "deepep" for that call only (single-threaded, restored after).
        config.moe_flex_dispatcher_backend = WIRED_AS
        try:
            return build(layer)
        finally:
            config.moe_flex_dispatcher_backend = BACKEND_NAME

    @functools.wraps(free)
    def should_free_input(name, is_moe, config, num_local_experts):
        if _uses_uccl(config):
            config = _ReadAsDeepep(config)
        return free(name, is_moe, config, num_local_experts)

    gpt_callables.build_transformer_layer_callables = build_transformer_layer_callables
    common_callables.build_transformer_layer_callables = build_transformer_layer_callables
    common_utils.should_free_input = should_free_input
    _state.update(gpt=gpt_callables, common=common_callables, utils=common_utils, build=build, free=free)
    _missing = None
    return True


def unpatch_overlap_schedule() -> None:
    global _missing
    if not _state:
        return
    _state["gpt"].build_transformer_layer_callables = _state["build"]
    _state["common"].build_transformer_layer_callables = _state["build"]
    _state["utils"].should_free_input = _state["free"]
    _state.clear()
    _missing = None
