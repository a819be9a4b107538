"""Cases with known bad outcomes, to check that the runner counts them (test_hostile.py)."""

from __future__ import annotations

import ctypes
import time

from . import Case


class NativeCtx:
    def after_case(self) -> None:
        pass


def _raise_typed(ctx):
    from uccl_ep.errors import InvalidArgument
    raise InvalidArgument("x", "something else", 1)


def cases() -> list[Case]:
    return [Case("typed", _raise_typed),
            Case("crash", lambda ctx: ctypes.string_at(0)),
            Case("typed after a crash", _raise_typed),
            Case("hang", lambda ctx: time.sleep(60)),
            Case("silent", lambda ctx: None),
            Case("untyped", lambda ctx: {}["missing"])]
