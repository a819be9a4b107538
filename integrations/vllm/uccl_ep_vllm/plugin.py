"""`register()`: the `vllm.general_plugins` entry point. Runs in every vLLM process (front end,
engine core, workers; vLLM calls it from `AsyncEngineArgs.add_cli_args` before the parser is
built and from `EngineArgs.__post_init__`).

vLLM has no registry for all2all backends, and `ParallelConfig.all2all_backend` is a pydantic
`Literal` (unknown strings are refused). So:

1. CLI: `vllm.engine.arg_utils.get_kwargs` is wrapped so that, for `ParallelConfig`, the
   `--all2all-backend` choices also list `uccl_low_latency` and `uccl_high_throughput`
   (`EngineArgs.add_cli_args` looks the module global up at call time).
2. Config: `ParallelConfig.__init__` is wrapped: a uccl_* value is checked (tested vLLM version,
   no NVFP4 dispatch) and replaced by the DeepEP value it runs through, so every DeepEP rule of
   vLLM (prepare/finalize choice, CUDA-graph and DBO allow-lists, fault tolerance) applies
   unchanged; `UCCL_EP_VLLM=1` is set for the engine-core and worker processes started later
   (and listed in `VLLM_RAY_EXTRA_ENV_VARS_TO_COPY` for Ray workers).
3. Swap: in every process with `UCCL_EP_VLLM` set, `deep_ep` is made to mean uccl_ep
   (deep_ep_alias.py), so vLLM's DeepEP managers build `uccl_ep.Buffer` on the gloo CPU group
   they pass, and its DeepEP HT/LL prepare/finalize classes drive it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from . import support

__all__ = ["register", "select_backend", "UCCL_BACKENDS"]

logger = logging.getLogger("uccl_ep.vllm")  # below uccl_ep: UCCL_EP_LOG_LEVEL applies

UCCL_BACKENDS = tuple(support.BACKENDS)
_RAY_COPY = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def register() -> None:
    """Entry point. Idempotent (vLLM may call it more than once per process)."""
    _patch_parallel_config()
    if "vllm.engine.arg_utils" in sys.modules:  # only processes that build a CLI have it loaded
        _patch_cli_kwargs()
    if support.flag_set():
        from .deep_ep_alias import install
        install()


def _check_version() -> None:
    version = support.installed_version()
    if support.is_tested(version):
        return
    # NOTES: a warning, not a refusal: a release outside the window most likely works, and what
    # does not fails with a typed error where it is used.
    logger.warning("uccl_ep_vllm: vllm %s is outside the tested window %s (CI runs %s); --all2all-backend uccl_* "
                   "is not verified on it", version, support.window_text(), ", ".join(support.TESTED_VERSIONS))


def select_backend(value: str) -> str:
    """Check a uccl_* value, mark the process (and its future children), return vLLM's value."""
    from uccl_ep.errors import InvalidArgument, Unsupported

    if value not in support.BACKENDS:
        raise InvalidArgument("--all2all-backend", f"one of {', '.join(UCCL_BACKENDS)}", repr(value))
    _check_version()
    nvfp4 = os.environ.get("VLLM_DEEPEPLL_NVFP4_DISPATCH", "0").strip().lower() in ("1", "true")
    if value == "uccl_low_latency" and nvfp4:
        raise Unsupported("VLLM_DEEPEPLL_NVFP4_DISPATCH=1 asks the low-latency dispatch for NVFP4, which "
                          "uccl_ep does not implement; unset it (BF16/FP8 dispatch is used)")
    os.environ[support.FLAG] = "1"
    # NOTES: Ray copies only VLLM_*-prefixed and listed variables to its actors; a VLLM_-named
    # flag would trip vLLM's unknown-variable check, so the flag is listed instead.
    listed = [v for v in os.environ.get(_RAY_COPY, "").split(",") if v.strip()]
    if support.FLAG not in listed:
        os.environ[_RAY_COPY] = ",".join(listed + [support.FLAG])
    from .deep_ep_alias import install
    install()
    return support.BACKENDS[value]


def _patch_parallel_config() -> None:
    from vllm.config.parallel import ParallelConfig

    original = ParallelConfig.__init__
    if getattr(original, "__uccl_ep__", False):
        return

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        value = kwargs.get("all2all_backend")
        if isinstance(value, str) and value in support.BACKENDS:
            kwargs["all2all_backend"] = select_backend(value)
        original(self, *args, **kwargs)

    __init__.__uccl_ep__ = True  # type: ignore[attr-defined]
    ParallelConfig.__init__ = __init__


def _patch_cli_kwargs() -> None:
    import vllm.engine.arg_utils as arg_utils
    from vllm.config.parallel import ParallelConfig

    original = arg_utils.get_kwargs
    if getattr(original, "__uccl_ep__", False):
        return

    @functools.wraps(original)
    def get_kwargs(cls: Any) -> dict:
        kwargs = original(cls)
        if cls is ParallelConfig and "all2all_backend" in kwargs:
            choices = kwargs["all2all_backend"].get("choices")
            if choices is not None:
                kwargs["all2all_backend"]["choices"] = list(choices) + [c for c in UCCL_BACKENDS if c not in choices]
        return kwargs

    get_kwargs.__uccl_ep__ = True  # type: ignore[attr-defined]
    arg_utils.get_kwargs = get_kwargs
