"""Stream events with DeepEP's `EventHandle` / `EventOverlap` semantics.

On CUDA an `EventHandle` records a `torch.cuda.Event` on the current stream at construction;
`EventOverlap.current_stream_wait()` makes the current stream wait for it. On CPU tensors there
are no streams: work is finished when a call returns, so the event is `None` and every wait is a
correct no-op.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["EventHandle", "EventOverlap", "OpScope"]


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class EventHandle:
    """A point on a stream. ``EventHandle()`` records on the current CUDA stream (if any)."""

    def __init__(self, event: Any = None) -> None:
        if event is None and _cuda_ready():
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream())
        self.event = event

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def __repr__(self) -> str:
        return f"EventHandle(event={'cuda' if self.event is not None else None})"


class EventOverlap:
    """DeepEP's overlap helper: an optional event plus tensors kept alive until it is waited on.

    ``extra_tensors`` keep low-latency outputs alive without ``record_stream`` (which CUDA graphs
    cannot capture). Use as ``with ev: ...`` to wait on exit, or call ``current_stream_wait()``.
    """

    def __init__(self, event: EventHandle | None = None, extra_tensors: Iterable[Any] | None = None) -> None:
        self.event = event
        self.extra_tensors = tuple(extra_tensors) if extra_tensors is not None else None

    def current_stream_wait(self, release_handle: bool = False) -> None:
        if self.event is not None:
            self.event.current_stream_wait()
        if release_handle:
            self.extra_tensors = None

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.event is not None:
            self.event.current_stream_wait()

    def __repr__(self) -> str:
        return f"EventOverlap(event={self.event!r})"


class OpScope:
    """Where one normal-mode op runs, and the event it returns (DeepEP §1.7 semantics).

    Default, used by the reference and host executors: the op runs on the current stream (CPU
    work is complete when the call returns), after waiting for ``previous_event``; with
    ``async_finish`` the returned `EventOverlap` holds an event recorded at the end of the work
    and keeps the outputs alive. The CUDA executor subclasses it to run on its comm stream.

        with executor.op_scope(previous_event, async_finish, allocate_on_comm_stream) as scope:
            outputs = ...
        return ..., scope.finish(outputs)
    """

    def __init__(self, previous_event, async_finish: bool, allocate_on_comm_stream: bool) -> None:
        self.previous_event = previous_event
        self.async_finish = async_finish
        self.allocate_on_comm_stream = allocate_on_comm_stream

    def _wait_previous(self) -> None:
        prev = self.previous_event
        inner = prev.event if isinstance(prev, EventOverlap) else prev
        if inner is not None:
            inner.current_stream_wait()

    def __enter__(self) -> "OpScope":
        self._wait_previous()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def finish(self, tensors=()) -> EventOverlap:
        if self.async_finish:
            kept = tuple(t for t in tensors if t is not None)
            return EventOverlap(EventHandle(), extra_tensors=kept if kept else None)
        return EventOverlap(None)
