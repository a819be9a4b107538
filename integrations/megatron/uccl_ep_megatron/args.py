"""``--uccl-*`` flags on Megatron's own command line, checked right after Megatron parses it.

The group is added inside ``megatron.training.arguments.add_megatron_arguments`` (so every
Megatron entry point that builds the parser gets it, whatever ``extra_args_provider`` the
script passes), and ``parse_args`` is wrapped to check the uccl-related flags together and hand
the values to `uccl_ep_megatron.settings`.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any, Callable

from uccl_ep.errors import InvalidArgument

from . import settings
from .config_patch import BACKEND_NAME, check_uccl_settings, config_error_scope

__all__ = ["add_uccl_arguments", "apply_parsed_args", "patch_megatron_arguments", "unpatch_megatron_arguments",
           "UCCL_FLAGS"]

_state: dict[str, Any] = {}


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


def _even_sms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an even int >= 2, got {text!r}") from None
    if value < 2 or value % 2:
        raise argparse.ArgumentTypeError(f"expected an even int >= 2 (one channel = 2 SMs), got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {value}")
    return value


#: dest -> flag, for the flags that only mean something with the uccl backend
UCCL_FLAGS = {
    "uccl_backend": "--uccl-backend",
    "uccl_timeout_s": "--uccl-timeout-s",
    "uccl_gpu_timeout_s": "--uccl-gpu-timeout-s",
    "uccl_ranks_per_node": "--uccl-ranks-per-node",
    "uccl_num_sms": "--uccl-num-sms",
}


def add_uccl_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the "uccl-ep" argument group (idempotent on one parser)."""
    if any(a.dest == "uccl_backend" for a in parser._actions):
        return parser
    group = parser.add_argument_group(
        title="uccl-ep", description="uccl_ep knobs for --moe-token-dispatcher-type flex "
        "--moe-flex-dispatcher-backend uccl (unset = uccl_ep's defaults, see docs/env.md)")
    group.add_argument("--uccl-backend", choices=settings.BACKENDS, default=None,
                       help="uccl_ep executor: auto (fastest for the tensors' device), reference, host or cuda")
    group.add_argument("--uccl-timeout-s", type=_positive_float, default=None, metavar="SECONDS",
                       help="bound of every host-side wait; a Timeout names rank, peer and phase (default 100)")
    group.add_argument("--uccl-gpu-timeout-s", type=_positive_float, default=None, metavar="SECONDS",
                       help="bound of every device-side wait (default 100)")
    group.add_argument("--uccl-ranks-per-node", type=_non_negative_int, default=None, metavar="N",
                       help="ranks per NVLink domain in the EP group; 0 = detect from host names")
    group.add_argument("--uccl-num-sms", type=_even_sms, default=None, metavar="N",
                       help="SMs for normal-mode kernels; same as --moe-flex-dispatcher-num-sms (default 20)")
    return parser


def apply_parsed_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the uccl flags against the rest and publish them to `settings` (idempotent)."""
    backend = getattr(args, "moe_flex_dispatcher_backend", None)
    given = {dest: getattr(args, dest) for dest in UCCL_FLAGS if getattr(args, dest, None) is not None}
    uses_uccl = backend == BACKEND_NAME and getattr(args, "moe_token_dispatcher_type", None) == "flex"
    if given and not uses_uccl:
        flag = UCCL_FLAGS[sorted(given)[0]]
        raise InvalidArgument(flag, "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend uccl alongside it",
                              f"--moe-token-dispatcher-type {getattr(args, 'moe_token_dispatcher_type', None)} "
                              f"--moe-flex-dispatcher-backend {backend}",
                              hint="uccl flags only apply to the uccl backend; drop them or select it")
    num_sms = given.get("uccl_num_sms")
    if num_sms is not None:
        other = getattr(args, "moe_flex_dispatcher_num_sms", None)
        if other is not None and other != num_sms:
            raise InvalidArgument("--uccl-num-sms", f"the same value as --moe-flex-dispatcher-num-sms ({other})",
                                  num_sms, hint="they set the same thing; give one of them")
        args.moe_flex_dispatcher_num_sms = num_sms
    check_uccl_settings(args, style="cli")
    if uses_uccl:
        settings.configure(backend=given.get("uccl_backend"), timeout_s=given.get("uccl_timeout_s"),
                           gpu_timeout_s=given.get("uccl_gpu_timeout_s"),
                           ranks_per_node=given.get("uccl_ranks_per_node"))
    return args


def patch_megatron_arguments() -> bool:
    """Hook Megatron's argument parsing; False when megatron.training is not importable."""
    if _state:
        return True
    try:
        from megatron.training import arguments
    except ImportError:
        # Megatron-Core used as a library (no megatron.training): `settings.configure` is the API.
        return False
    original_add: Callable = arguments.add_megatron_arguments
    original_parse: Callable = arguments.parse_args

    @functools.wraps(original_add)
    def add_megatron_arguments(parser):
        return add_uccl_arguments(original_add(parser))

    @functools.wraps(original_parse)
    def parse_args(*a, **kw):
        parsed = original_parse(*a, **kw)
        with config_error_scope():
            return apply_parsed_args(parsed)

    arguments.add_megatron_arguments = add_megatron_arguments
    arguments.parse_args = parse_args
    _state.update(module=arguments, add=original_add, parse=original_parse)
    return True


def unpatch_megatron_arguments() -> None:
    if not _state:
        return
    module = _state["module"]
    module.add_megatron_arguments = _state["add"]
    module.parse_args = _state["parse"]
    _state.clear()
