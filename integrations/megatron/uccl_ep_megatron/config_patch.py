"""Teach Megatron-Core's TransformerConfig the value ``moe_flex_dispatcher_backend="uccl"``.

Two changes, both reversible and idempotent:

1. The dataclass field's type becomes ``Literal[<Megatron's values>, "uccl"]``. Megatron's
   command line is generated from that type (``ArgumentGroupFactory`` turns a Literal into
   argparse ``choices``), so ``--moe-flex-dispatcher-backend uccl`` is accepted by Megatron's
   own parser once this runs, and ``--help`` lists it.
2. ``__post_init__`` first checks the settings the uccl backend cannot honour and raises a
   typed error that names the field, then runs Megatron's own checks.
"""

from __future__ import annotations

import contextlib
import functools
import typing
from typing import Any, Callable, Literal

from uccl_ep.errors import InvalidArgument, UcclEpError, Unsupported

__all__ = ["BACKEND_NAME", "patch_transformer_config", "unpatch_transformer_config", "check_uccl_settings",
           "config_error_scope"]

BACKEND_NAME = "uccl"

_state: dict[str, Any] = {}


@contextlib.contextmanager
def config_error_scope():
    """Mark uccl_ep errors raised inside as configuration mistakes (the launcher prints them as one
    line instead of a traceback; errors from a running job keep their traceback)."""
    try:
        yield
    except UcclEpError as exc:
        exc.uccl_config_error = True  # type: ignore[attr-defined]
        raise


def _flag(name: str, style: str) -> str:
    return "--" + name.replace("_", "-") if style == "cli" else name


def check_uccl_settings(cfg: Any, style: str = "field") -> None:
    """Refuse combinations the uccl flex backend does not support.

    ``cfg`` is a TransformerConfig or Megatron's parsed ``args`` namespace (same attribute
    names); ``style="cli"`` spells names as command-line flags in the messages.
    """
    if getattr(cfg, "moe_flex_dispatcher_backend", None) != BACKEND_NAME:
        return
    n = functools.partial(_flag, style=style)
    dispatcher = getattr(cfg, "moe_token_dispatcher_type", None)
    if dispatcher != "flex":
        raise InvalidArgument(n("moe_token_dispatcher_type"),
                              f"'flex' when {n('moe_flex_dispatcher_backend')} is 'uccl'", repr(dispatcher),
                              hint="the uccl backend is a flex-dispatcher backend")
    if getattr(cfg, "moe_enable_deepep", False):
        raise InvalidArgument(n("moe_enable_deepep"), f"unset when {n('moe_flex_dispatcher_backend')} is 'uccl'",
                              True, hint="the deprecated flag forces the deepep backend; drop it")
    if getattr(cfg, "moe_pad_expert_input_to_capacity", False):
        raise Unsupported(f"{n('moe_pad_expert_input_to_capacity')} is not supported with "
                          f"{n('moe_flex_dispatcher_backend')} uccl (as with deepep): capacity dropping marks "
                          "dropped tokens -1 and is supported through moe_expert_capacity_factor alone")
    if getattr(cfg, "overlap_moe_expert_parallel_comm", False):
        # NOTES: Megatron's EP-overlap schedule wires the flex manager into its schedule nodes by
        # backend name; overlap.py gives "uccl" the "deepep" wiring. Without it the dispatch
        # node's backward would run into the router's graph segment.
        from .overlap import overlap_supported

        reason = overlap_supported()
        if reason is not None:
            raise Unsupported(f"{n('overlap_moe_expert_parallel_comm')} is not supported with "
                              f"{n('moe_flex_dispatcher_backend')} uccl here: {reason}; run without it")
    num_sms = getattr(cfg, "moe_flex_dispatcher_num_sms", None)
    if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int)
                                or num_sms < 2 or num_sms % 2):
        raise InvalidArgument(n("moe_flex_dispatcher_num_sms"), "an even int >= 2 (one channel = 2 SMs)",
                              repr(num_sms))


def _literal_values(tp: Any) -> tuple:
    if typing.get_origin(tp) is not Literal:
        raise Unsupported(f"TransformerConfig.moe_flex_dispatcher_backend has type {tp!r}, expected a "
                          "typing.Literal of backend names; this megatron-core is not supported")
    return typing.get_args(tp)


def patch_transformer_config() -> None:
    """Add "uccl" to the backend Literal and the uccl checks to ``__post_init__`` (idempotent)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if _state:
        return
    field = TransformerConfig.__dataclass_fields__["moe_flex_dispatcher_backend"]
    original_type = field.type
    values = _literal_values(original_type)
    new_type = Literal[values + ((BACKEND_NAME,) if BACKEND_NAME not in values else ())]  # type: ignore[valid-type]
    # NOTES: subclasses (MLATransformerConfig, ...) share this Field object, so changing it in
    # place covers them; __annotations__ is updated too for tools that read hints instead.
    field.type = new_type
    original_annotation = TransformerConfig.__annotations__.get("moe_flex_dispatcher_backend")
    TransformerConfig.__annotations__["moe_flex_dispatcher_backend"] = new_type

    original_post_init: Callable = TransformerConfig.__post_init__

    @functools.wraps(original_post_init)
    def post_init(self, *args, **kwargs):
        with config_error_scope():
            check_uccl_settings(self)
        return original_post_init(self, *args, **kwargs)

    post_init.__uccl_ep_original__ = original_post_init  # type: ignore[attr-defined]
    TransformerConfig.__post_init__ = post_init
    _state.update(cls=TransformerConfig, field=field, type=original_type, annotation=original_annotation,
                  post_init=original_post_init)


def unpatch_transformer_config() -> None:
    """Undo `patch_transformer_config` (tests)."""
    if not _state:
        return
    cls = _state["cls"]
    _state["field"].type = _state["type"]
    if _state["annotation"] is not None:
        cls.__annotations__["moe_flex_dispatcher_backend"] = _state["annotation"]
    cls.__post_init__ = _state["post_init"]
    _state.clear()
