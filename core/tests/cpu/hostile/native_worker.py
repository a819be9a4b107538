"""Runs native cases in this (sub)process, from a start index, one JSON line per case on stdout:
``{"i": index, "outcome": ..., "detail": ...}``. The parent (runner.py) counts a case during
which this process died as a crash and one that outlived its bound as a hang, then restarts the
worker after it."""

from __future__ import annotations

import json
import sys


def main(module: str, start: int) -> None:
    import importlib

    import uccl_ep.errors  # noqa: F401 - imports torch: startup time, not the first case's

    from . import classify
    cases_module = importlib.import_module(module)
    all_cases = cases_module.cases()
    ctx = cases_module.NativeCtx()
    for i in range(start, len(all_cases)):
        print(json.dumps({"i": i, "begin": True}), flush=True)
        outcome, detail = classify(all_cases[i], ctx)
        try:
            ctx.after_case()
        except BaseException as e:  # noqa: BLE001 - a cleanup failure is the case's finding
            outcome, detail = "untyped", f"cleanup: {type(e).__name__}: {e}"
        print(json.dumps({"i": i, "outcome": outcome, "detail": detail}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
