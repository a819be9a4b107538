"""The hostile-input suite (run by test_hostile.py): generated bad calls of every public Buffer
method (reference and host backends, 2 CPU ranks) and of every native binding, each of which
must end in a typed error (`uccl_ep.errors.UcclEpError`) of the expected class, within its time
bound and without taking the process down.

Outcomes:
- ``typed``: the expected `UcclEpError` subclass was raised (the only passing outcome);
- ``crash``: the process died (signal, abort) while running the case;
- ``hang``: the case did not finish within its bound;
- ``silent``: the call returned as if the input were fine;
- ``untyped``: another exception (a builtin, or a `UcclEpError` of the wrong class).

Native cases that could crash run in a worker subprocess (native_worker.py) so a crash is
counted and the rest still run; Buffer cases run on 2 spawned ranks (buffer_cases.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

OUTCOMES = ("typed", "crash", "hang", "silent", "untyped")


@dataclass
class Case:
    name: str
    fn: Callable[[Any], Any]      # fn(ctx): makes the hostile call
    expect: type | tuple = ()     # the UcclEpError subclass(es) it must raise (default InvalidArgument)


def classify(case: Case, ctx: Any) -> tuple[str, str]:
    """Run one case in this process: (outcome, detail)."""
    from uccl_ep.errors import InvalidArgument, UcclEpError
    expect = case.expect or InvalidArgument
    try:
        case.fn(ctx)
    except UcclEpError as e:
        if isinstance(e, expect):
            return "typed", f"{type(e).__name__}: {e}"[:300]
        return "untyped", f"expected {expect}, got {type(e).__name__}: {e}"[:300]
    except BaseException as e:  # noqa: BLE001 - every other exception is a finding
        return "untyped", f"{type(e).__name__}: {e}"[:300]
    return "silent", "returned normally"


def summary(results: list[tuple[str, str, str]]) -> str:
    """``N cases: N typed, 0 crash, 0 hang, 0 silent`` (plus untyped when there are any)."""
    counts = {k: sum(1 for _, o, _ in results if o == k) for k in OUTCOMES}
    line = f"{len(results)} cases: {counts['typed']} typed, {counts['crash']} crash, {counts['hang']} hang, " \
           f"{counts['silent']} silent"
    if counts["untyped"]:
        line += f", {counts['untyped']} untyped"
    return line
