"""Argument checks shared by every Buffer method: typed errors that name the argument and say
what was expected. Checks that need tensor values (e.g. top-k ids in range) run only where the
data are on the host or the executor syncs anyway, so no check adds a GPU sync to a hot path."""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, Iterable, TypeVar

import torch

from .errors import InvalidArgument, LimitExceeded, Unsupported

__all__ = [
    "check_int",
    "check_bool",
    "check_seconds",
    "check_tensor",
    "check_topk_ids_in_range",
    "split_fp8_tuple",
    "check_extra_kwargs",
    "check_combine_rows",
    "exclusive",
    "enter_exclusive",
    "tensor_signature",
    "CheckedCalls",
    "FP8_DTYPES",
]

#: dtypes of the FP8 half of an ``(x, scales)`` pair (e4m3; the fnuz variant on AMD).
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))

F = TypeVar("F", bound=Callable[..., Any])


def exclusive(method: F) -> F:
    """One call at a time per Buffer: a call while another thread is inside one of the Buffer's
    methods is refused with `InvalidArgument` (a Buffer's buffers, counters and handles are
    shared state; two interleaved ops would compute offsets from each other's half-updated
    state). The same thread may nest calls."""

    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        # NOTES: on every eager op's host path: the lock is looked up here, enter_exclusive only
        # makes it (first call) or refuses a second thread.
        lock = self.__dict__.get("_op_lock")
        if lock is None or not lock.acquire(blocking=False):
            lock = enter_exclusive(self, name)
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release()

    return wrapper  # type: ignore[return-value]


def enter_exclusive(buffer: Any, what: str) -> threading.RLock:
    """Enter `buffer`'s one-call-at-a-time section (see `exclusive`) for `what`; the caller releases
    the returned lock when done."""
    lock = buffer.__dict__.get("_op_lock") or buffer.__dict__.setdefault("_op_lock", threading.RLock())
    if not lock.acquire(blocking=False):
        raise InvalidArgument("self", "one call at a time on a Buffer (it is not thread-safe: use one Buffer "
                              "per thread, or serialize the calls)",
                              f"{what}() while another thread is inside a call on it")
    return lock


def tensor_signature(t: Any) -> tuple | None:
    """What `check_tensor` depends on (type, dtype, shape, device, layout, contiguity), for a key of
    `CheckedCalls`; None for None. Raises for an object that is not tensor-like: the caller then
    checks the call in full."""
    return None if t is None else (type(t), t.dtype, t.shape, t.device, t.layout, t.is_contiguous())


class CheckedCalls(set):
    """Signatures of calls whose checks passed (each tensor's `tensor_signature`, each other
    argument's type and value), so a repeated call skips them; `signature in calls` asks.

    NOTES: an eager low-latency op's checks cost several microseconds of host time, a large share of
    the op; the checks depend only on the signature and on the Buffer's fixed state (group size,
    buffer sizes), so a signature that passed once passes again. Checks of values (top-k ids on the
    host) and of identities (the handle) are not covered and run every call. A set, so the question
    is one C call; None (a call whose signature could not be taken) is never added."""

    def __init__(self, limit: int = 256) -> None:
        super().__init__()
        self._limit = limit

    def add(self, signature: tuple | None) -> None:
        if signature is None:
            return
        if len(self) >= self._limit:
            self.clear()
        super().add(signature)


def check_int(name: str, value: Any, minimum: int | None = None, multiple_of: int | None = None,
              maximum: int | None = None, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # numpy / torch scalar ints are fine
        try:
            import numbers
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise InvalidArgument(name, "an int", f"{type(value).__name__} {value!r}") from None
    if minimum is not None and value < minimum:
        raise InvalidArgument(name, f"an int >= {minimum}", value)
    if maximum is not None and value > maximum:
        raise LimitExceeded(name, what or "the value", value, maximum)
    if multiple_of is not None and value % multiple_of != 0:
        raise InvalidArgument(name, f"a multiple of {multiple_of}", value)
    return value


def check_seconds(name: str, value: Any) -> float:
    """A finite, positive number of seconds (every wait is bounded: NaN and inf are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgument(name, "a finite positive number of seconds", repr(value))
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, int)) or (isinstance(value, int) and value not in (0, 1)):
        raise InvalidArgument(name, "a bool", repr(value))
    return bool(value)


def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def check_tensor(name: str, t: Any, *, dtypes: Iterable[torch.dtype] | None = None, ndim: int | None = None,
                 shape: tuple[int | None, ...] | None = None, device: torch.device | None = None,
                 contiguous: bool = True) -> torch.Tensor:
    """Check one tensor argument; ``None`` entries in ``shape`` match any size."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(name, "a torch.Tensor", type(t).__name__)
    if t.device.type == "meta":
        raise InvalidArgument(name, "a tensor with data (cpu or a GPU)", "a meta-device tensor")
    if t.layout != torch.strided:
        raise InvalidArgument(name, "a dense (strided) tensor", f"layout {t.layout}")
    if dtypes is not None:
        allowed = tuple(dtypes)
        if t.dtype not in allowed:
            raise InvalidArgument(name, f"dtype {' or '.join(_dtype_name(d) for d in allowed)}", _dtype_name(t.dtype))
    if ndim is not None and t.dim() != ndim:
        raise InvalidArgument(name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(want is not None and want != got for want, got in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise InvalidArgument(name, f"shape {want}", f"shape {list(t.shape)}")
    if device is not None and t.device != device and not (device.type == t.device.type and device.index is None):
        raise InvalidArgument(name, f"a tensor on {device}", f"a tensor on {t.device}",
                              hint="all tensors of one call must be on the same device")
    if contiguous and not t.is_contiguous():
        raise InvalidArgument(name, "a contiguous tensor", f"strides {tuple(t.stride())} for shape {tuple(t.shape)}",
                              hint="call .contiguous() first")
    return t


def check_topk_ids_in_range(name: str, topk_idx: torch.Tensor, num_experts: int) -> None:
    """-1 (no selection) or a valid expert id. Reads values: call where a sync is acceptable."""
    if topk_idx.numel() == 0:
        return
    lo, hi = int(topk_idx.min()), int(topk_idx.max())
    if lo < -1 or hi >= num_experts:
        bad = lo if lo < -1 else hi
        raise InvalidArgument(name, f"expert ids in [0, {num_experts}) or -1", f"id {bad}")


def split_fp8_tuple(name: str, x: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` or ``(x_fp8, scales)`` -> (data, scales or None)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise InvalidArgument(name, "a tensor or a (fp8 data, scales) pair", f"a sequence of length {len(x)}")
        data, scales = x
        # NOTES: the pair means "already FP8": a BF16 first half would be moved as FP8 bytes of half
        # the row width and the scales applied to them.
        check_tensor(name + "[0]", data, dtypes=FP8_DTYPES, ndim=2)
        check_tensor(name + "[1]", scales, dtypes=(torch.float32, torch.int32), ndim=2, contiguous=False)
        if scales.shape[0] != data.shape[0]:
            raise InvalidArgument(name + "[1]", f"{data.shape[0]} rows (one scale row per token)", scales.shape[0])
        if scales.device != data.device:
            raise InvalidArgument(name + "[1]", f"a tensor on {data.device}", f"a tensor on {scales.device}")
        return data, scales
    check_tensor(name, x, ndim=2)
    return x, None


# Keyword arguments that framework forks pass; each maps to the value meaning "not used".
_KNOWN_INERT_KWARGS = {
    # constructor
    "is_intranode": None,  # Primus-Turbo's uccl special case; topology is detected instead
    # LL dispatch/combine (SGLang forks: NVFP4, single-batch overlap)
    "use_nvfp4": False,
    "x_global_scale": None,
    "overlap": False,
    "packed_recv_count": None,
    "comp_signal": None,
    "block_m": None,
    "threshold": None,
    "num_sms": None,
    "src_signals": None,
    "src_signal_expect_value": 0,
}
_ALWAYS_ACCEPTED = {"is_intranode"}


def check_combine_rows(x: torch.Tensor, num_rows: int, topk_weights: torch.Tensor | None, backend: str) -> None:
    """A normal-mode combine's inputs against its handle: BF16 rows (as DeepEP combines), one per row
    the dispatch produced, and as many weight rows."""
    if x.dtype != torch.bfloat16:
        raise Unsupported(f"the {backend} backend combines BF16 only (as DeepEP); got {x.dtype}")
    if x.shape[0] != num_rows:
        raise InvalidArgument("x", f"{num_rows} rows (the rows of the dispatch output for `handle`)", x.shape[0])
    if topk_weights is not None and topk_weights.shape[0] != num_rows:
        raise InvalidArgument("topk_weights", f"{num_rows} rows", topk_weights.shape[0])


def check_extra_kwargs(where: str, kwargs: dict[str, Any]) -> None:
    """Accept extra keyword arguments only when they ask for nothing.

    A framework may pass arguments that only its fork of DeepEP knows. uccl_ep accepts them when
    their value is the "off" value (None, False, 0); any other value asks for a feature uccl_ep
    does not have, and is refused with ``Unsupported`` naming the argument.
    """
    for key, value in kwargs.items():
        if key in _ALWAYS_ACCEPTED:
            continue
        inert = _KNOWN_INERT_KWARGS.get(key, None)
        is_off = (value is None or value is False
                  or (type(value) in (int, float) and value == 0)
                  or (not isinstance(value, torch.Tensor) and inert is not None and value == inert))
        if not is_off:
            known = "a DeepEP fork extension" if key in _KNOWN_INERT_KWARGS else "not a DeepEP V1 argument"
            raise Unsupported(f"{where}: argument `{key}={value!r}` is {known} that uccl_ep does not implement; "
                              f"leave it unset (or {inert!r})")
