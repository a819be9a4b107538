"""Tuning of the cuda executor's kernels: `Tuning`, passed as ``Buffer(..., tuning=Tuning(...))``.

These are settings of the library, not of the machine: an operator never needs them to run a job,
a tuning run (``uccl-ep bench --tune key=value``, tools/lab/run_device.sh) does. Each field keeps
the default the environment variable it replaces had; docs/api.md ("Tuning") says what each does.

Fields marked shared must be equal on every rank of a group: the cuda executor gathers them when a
Buffer is built and refuses the Buffer on every rank alike when they differ (`shared_values`,
`require_same_across_ranks`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Iterable

from .errors import InvalidArgument

__all__ = ["Tuning", "DEFAULT", "resolve", "shared_values", "require_same_across_ranks"]

# (min, max) of the integer fields; None = unbounded.
_INT_RANGES: dict[str, tuple[int | None, int | None]] = {
    "ll_combine_recv_threads": (32, 512),
    "ll_proxy_parts": (1, 8),
    "ll_stage_split": (1, 16),
    "ipc_copy_blocks": (1, 64),
    "proxy_write_kb": (1, 16383),
    "ht_warps": (8, 32),
    "ht_combine_warps": (0, 32),
    "ht_ce_chunk_kb": (64, None),
    "ht_combine_ce_max_mb": (1, None),
    "ht_ce_min_mb": (0, None),
}
_CHOICES: dict[str, tuple[str, ...]] = {"ht_dispatch_ce": ("auto", "1", "0")}


@dataclass(frozen=True)
class Tuning:
    """Kernel tuning of one Buffer (cuda executor); every field has its measured default.

    Low-latency mode: ``ll_combine_recv_threads`` (threads per block of the NVLink combine's
    receive kernel, a multiple of the warp size), ``ll_pdl`` (receive kernels by programmatic
    dependent launch, sm_90+), ``ll_torch_ops`` (an eager NVLink-path op through uccl_ep's torch
    op, allocation and both launches in one native call, where its library loads:
    uccl_ep.cuda.native_ops; False: the Python path), ``ll_own_rows_in_y`` (proxy-path combine leaves the rank's own rows
    in the caller's tensor), ``ll_stage_split`` (most warps staging one combine row on the proxy
    path), ``ll_proxy_parts`` (shared; an experiment: parts an op's region towards a peer is spread
    over), ``ipc_copy_blocks`` (blocks per ring of the ipc copy kernel), ``proxy_write_kb``
    (shared; largest Write the proxy path pushes, KiB).
    Normal mode: ``ht_warps`` / ``ht_combine_warps`` (shared; warps per block of the intranode
    dispatch / combine, 0 = as dispatch), ``ht_defines`` (shared; extra NAME=VALUE compile-time
    settings from ht_tuning.cuh), ``ht_combine_ce`` / ``ht_dispatch_ce`` (shared; copy-engine
    combine, dispatch ``auto`` / ``1`` / ``0``), ``ht_ce_chunk_kb`` (shared; copy-engine chunk),
    ``ht_combine_ce_max_mb`` (shared; largest copy-engine staging buffer), ``ht_ce_min_mb`` (shared;
    the copy-engine paths take an op only when its largest rank-to-rank share of rows is at least
    this many MiB; smaller ops run the ring kernels, faster there; 0: always).
    Normal mode through the proxy with several ranks per node: ``ht_partials_bf16`` (shared; a node's
    partial sums cross to the other nodes in BF16, as DeepEP sends them: half the bytes, exact only
    where each partial is exact in BF16; False: fp32, exact wherever the fp32 sums are).
    """

    ll_combine_recv_threads: int = 512
    ll_pdl: bool = True
    ll_torch_ops: bool = True
    ll_own_rows_in_y: bool = True
    ll_stage_split: int = 4
    ll_proxy_parts: int = 1
    ipc_copy_blocks: int = 16
    proxy_write_kb: int = 16383
    ht_warps: int = 16
    ht_combine_warps: int = 16
    ht_defines: str = ""
    ht_combine_ce: bool = True
    ht_dispatch_ce: str = "auto"
    ht_ce_chunk_kb: int = 8192
    ht_combine_ce_max_mb: int = 2048
    ht_ce_min_mb: int = 24
    ht_partials_bf16: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            arg = f"tuning.{f.name}"
            if f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise InvalidArgument(arg, "a bool", repr(value))
            elif f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise InvalidArgument(arg, "an int", repr(value))
                lo, hi = _INT_RANGES.get(f.name, (None, None))
                if lo is not None and value < lo:
                    raise InvalidArgument(arg, f"an int >= {lo}", value)
                if hi is not None and value > hi:
                    raise InvalidArgument(arg, f"an int <= {hi}", value)
            elif f.name in _CHOICES:
                if value not in _CHOICES[f.name]:
                    raise InvalidArgument(arg, f"one of {', '.join(_CHOICES[f.name])}", repr(value))
            elif not isinstance(value, str):
                raise InvalidArgument(arg, "a str", repr(value))

    def replace(self, **changes: Any) -> "Tuning":
        """A copy with ``changes`` (validated like the constructor)."""
        unknown = [k for k in changes if k not in _NAMES]
        if unknown:
            raise InvalidArgument(f"tuning.{unknown[0]}", f"a Tuning field ({', '.join(_NAMES)})", repr(unknown[0]))
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_pairs(cls, pairs: Iterable[str], base: "Tuning | None" = None) -> "Tuning":
        """``key=value`` texts (``uccl-ep bench --tune``) parsed by each field's type over ``base``."""
        changes: dict[str, Any] = {}
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip()
            if not sep or key not in _NAMES:
                raise InvalidArgument("--tune", f"key=value with key one of {', '.join(_NAMES)}", repr(pair))
            kind = _NAMES[key]
            text = raw.strip()
            if kind in ("bool", bool):
                low = text.lower()
                if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                    raise InvalidArgument(f"tuning.{key}", "a boolean (1/0, true/false, on/off)", repr(raw))
                changes[key] = low in ("1", "true", "yes", "on")
            elif kind in ("int", int):
                try:
                    changes[key] = int(text, 0)
                except ValueError:
                    raise InvalidArgument(f"tuning.{key}", "an integer", repr(raw)) from None
            else:
                changes[key] = raw
        return (base or cls()).replace(**changes)


_NAMES: dict[str, Any] = {f.name: f.type for f in fields(Tuning)}
DEFAULT = Tuning()


def resolve(tuning: Any) -> Tuning:
    """The Buffer's ``tuning`` argument checked: None means the defaults."""
    if tuning is None:
        return DEFAULT
    if not isinstance(tuning, Tuning):
        raise InvalidArgument("tuning", "a uccl_ep.Tuning or None", type(tuning).__name__)
    return tuning


def shared_values(tuning: Tuning, names: tuple[str, ...]) -> tuple:
    """The values of ``names`` every rank must agree on, for an exchange between ranks."""
    return tuple(getattr(tuning, n) for n in names)


def require_same_across_ranks(names: tuple[str, ...], per_rank: list, why: str = "") -> None:
    """Raise on every rank alike when the ranks' shared_values() answers differ."""
    if len(set(map(tuple, per_rank))) > 1:
        listing = ", ".join(f"rank {r}: " + "/".join(str(x) for x in v) for r, v in enumerate(per_rank))
        label = " / ".join(f"tuning.{n}" for n in names)
        raise InvalidArgument(label, "the same value on every rank" + (f" ({why})" if why else ""), listing,
                              hint="pass the same Tuning to every rank's Buffer")
