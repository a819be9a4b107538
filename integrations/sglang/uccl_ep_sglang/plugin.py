"""`register()`: the `sglang.srt.plugins` entry point. Runs in every SGLang process.

What it does (no fork of SGLang, no edit of its files):

1. CLI: an AFTER hook on `ServerArgs.add_cli_args` appends "uccl" to the choices of
   `--moe-a2a-backend` and `--speculative-moe-a2a-backend` (argparse is SGLang's only check of
   these strings: neither the msgspec Struct of 0.5.20+ nor the dataclass before checks Literal).
2. Alias: a BEFORE hook on server-args resolution (`ServerArgs.resolve_once` from 0.5.19,
   `ServerArgs.__post_init__` before) rewrites "uccl" to "deepep", so every DeepEP rule (ep_size =
   tp_size, CUDA-graph rules, the model predicates) applies unchanged, refuses combinations
   uccl_ep cannot serve with a clear error, and sets `UCCL_EP_SGLANG=1`, which the scheduler
   processes SGLang starts afterwards inherit.
3. Swap: in any process where `UCCL_EP_SGLANG` is set, SGLang's DeepEP dispatcher module is made
   to use `uccl_ep.Buffer` / `uccl_ep.Config` (dispatcher_swap.py), lazily: nothing here imports
   the dispatcher, torch or CUDA at plugin load.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from . import support

__all__ = ["register", "add_uccl_choice", "alias_uccl_to_deepep", "check_combination", "UCCL"]

logger = logging.getLogger("uccl_ep.sglang")  # below uccl_ep: UCCL_EP_LOG_LEVEL applies

UCCL = "uccl"
_BACKEND_FLAGS = ("--moe-a2a-backend", "--speculative-moe-a2a-backend")
_BACKEND_FIELDS = ("moe_a2a_backend", "speculative_moe_a2a_backend")
# Devices SGLang can be asked for on which uccl_ep's Buffer runs (ROCm builds report "cuda");
# "cpu" is uccl_ep's reference executor (tests, CI).
_DEVICES = ("cuda", "cpu")
# Dispatch dtypes of `--deepep-dispatcher-output-dtype` that uccl_ep's low-latency dispatch
# implements (bf16, and fp8 with per-128 scales); "auto" resolves to one of them on GPUs.
_DISPATCH_DTYPES = ("auto", "bf16", "fp8")


def _registered_once() -> bool:
    if getattr(register, "_done", False):
        return True
    register._done = True  # type: ignore[attr-defined]
    return False


def register() -> None:
    """Entry point. Idempotent; cheap: registers hooks, imports nothing heavy."""
    if _registered_once():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    version = support.installed_version()
    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", add_uccl_choice, HookType.AFTER)
    HookRegistry.register(support.resolution_hook_target(version), alias_uccl_to_deepep, HookType.BEFORE)
    if support.dispatcher_active_flag():
        from .dispatcher_swap import activate
        activate()


def add_uccl_choice(result: Any, parser: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of `ServerArgs.add_cli_args(parser)`: offer "uccl" where DeepEP is offered."""
    for action in getattr(parser, "_actions", ()):
        if set(action.option_strings) & set(_BACKEND_FLAGS) and action.choices is not None:
            if UCCL not in action.choices:
                action.choices = list(action.choices) + [UCCL]
    return result


def _too_old_error(version: str):
    from uccl_ep.errors import Unsupported
    lo = ".".join(map(str, support.MIN_VERSION))
    return Unsupported(f"--moe-a2a-backend uccl needs sglang >= {lo} (plugin system); found sglang "
                       f"{version}. Older versions: install the deep_ep drop-in (deep-ep-uccl) and "
                       "use --moe-a2a-backend deepep (docs/sglang.md)")


def check_combination(values: dict) -> None:
    """Refuse, with the flag and the accepted values named, what uccl_ep cannot serve.

    ``values`` holds the server-args fields (missing ones are skipped: older versions lack some).
    Raises `uccl_ep.errors.InvalidArgument` / `Unsupported`.
    """
    from uccl_ep.errors import InvalidArgument, Unsupported

    main = values.get("moe_a2a_backend")
    draft = values.get("speculative_moe_a2a_backend")
    # NOTES: the main and the draft model share one process-wide DeepEP dispatcher module, so one
    # process cannot run sgl-deep-ep for one and uccl_ep for the other.
    if {main, draft} >= {UCCL, "deepep"}:
        flag = "--speculative-moe-a2a-backend" if draft == "deepep" else "--moe-a2a-backend"
        raise InvalidArgument(flag, "uccl (or none) when the other of --moe-a2a-backend / "
                              "--speculative-moe-a2a-backend is uccl", "deepep",
                              hint="the main and draft models share one DeepEP dispatcher module per process")
    device = values.get("device")
    if device not in (None, *_DEVICES):
        raise InvalidArgument("--device", f"one of {', '.join(_DEVICES)} with --moe-a2a-backend uccl", device)
    dtype = values.get("deepep_dispatcher_output_dtype")
    if dtype not in (None, *_DISPATCH_DTYPES):
        raise InvalidArgument("--deepep-dispatcher-output-dtype",
                              f"one of {', '.join(_DISPATCH_DTYPES)} with --moe-a2a-backend uccl", dtype,
                              hint="uccl_ep dispatches BF16 or FP8 (per-128 scales); NVFP4/MXFP are not implemented")
    if values.get("enable_single_batch_overlap"):
        raise Unsupported("--enable-single-batch-overlap is not supported with --moe-a2a-backend uccl: it "
                          "needs the signal-based overlapped low-latency combine of DeepEP forks "
                          "(overlap/comp_signal/src_signals), which uccl_ep does not implement; drop the flag "
                          "(two-batch overlap, --enable-two-batch-overlap, is supported)")


def alias_uccl_to_deepep(self: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook of server-args resolution: "uccl" -> "deepep", checks, process flag."""
    chosen = [f for f in _BACKEND_FIELDS if getattr(self, f, None) == UCCL]
    if not chosen:
        return None
    version = support.installed_version() or "unknown"
    if not support.in_supported_range(version):
        raise _too_old_error(version)
    if not support.in_tested_window(version):
        # NOTES: a warning, not a refusal: the plugin hooks SGLang's public plugin API and DeepEP
        # module names; a release outside the window most likely works, and a typed error names
        # whatever does not.
        logger.warning("uccl_ep_sglang: sglang %s is outside the tested window %s (CI runs %s); "
                       "--moe-a2a-backend uccl is not verified on it", version, support.window_text(),
                       " and ".join(sorted(support.TESTED_VERSIONS)))
    fields = ("device", "deepep_dispatcher_output_dtype", "enable_single_batch_overlap", *_BACKEND_FIELDS)
    check_combination({f: getattr(self, f) for f in fields if hasattr(self, f)})
    for field in chosen:
        # Allowed: resolution has not frozen the record yet (msgspec Struct and dataclass alike).
        setattr(self, field, "deepep")
    # NOTES: the flag is how SGLang's scheduler processes (spawned after resolution, handed the
    # resolved ServerArgs by pickle, which does not re-run resolution) learn to swap the
    # dispatcher; they inherit os.environ. Writing it is the plugin's job, not uccl_ep's.
    os.environ[support.FLAG] = "1"
    from .dispatcher_swap import activate
    activate()
    logger.info("uccl_ep_sglang: %s = uccl -> SGLang's DeepEP path on uccl_ep", "/".join(chosen))
    return None
