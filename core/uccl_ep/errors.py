"""Typed errors of uccl_ep.

Every error says what went wrong, with which argument or peer, and what was expected, so the
caller can tell who has to act: the caller's code (``InvalidArgument``), the deployment
(``Unsupported``, ``MissingDependency``), the job (``Timeout``, ``PeerFailure``,
``PeerProtocolError``), or the GPU (``DeviceError``).

The classes also derive from the closest builtin (``ValueError``, ``TimeoutError``, ...) so
frameworks that catch builtins keep working.
"""

from __future__ import annotations

__all__ = [
    "UcclEpError",
    "InvalidArgument",
    "Unsupported",
    "MissingDependency",
    "Timeout",
    "PeerFailure",
    "PeerProtocolError",
    "Aborted",
    "LimitExceeded",
    "DeviceError",
]


class UcclEpError(RuntimeError):
    """Base class of every error raised by uccl_ep."""


class InvalidArgument(UcclEpError, ValueError):
    """An argument has the wrong type, dtype, device, shape, layout or value.

    ``argument`` names the offending argument; ``expected`` says what would have been accepted;
    ``got`` says what was passed.
    """

    def __init__(self, argument: str, expected: str, got: object = None, hint: str = "") -> None:
        self.argument = argument
        self.expected = expected
        self.got = got
        msg = f"invalid argument `{argument}`: expected {expected}"
        if got is not None:
            msg += f", got {got}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class LimitExceeded(InvalidArgument):
    """A request exceeds a hard limit (buffer size, protocol field width, max tokens, ...).

    ``needed`` and ``limit`` are numbers in the same unit, so the message says by how much.
    """

    def __init__(self, argument: str, what: str, needed: int, limit: int, hint: str = "") -> None:
        self.needed = needed
        self.limit = limit
        super().__init__(argument, f"{what} <= {limit}", got=f"{needed} (over by {needed - limit})", hint=hint)


class Unsupported(UcclEpError, NotImplementedError):
    """A valid request that this build, backend or machine does not support."""


class MissingDependency(UcclEpError, ImportError):
    """A library or tool needed at run time is absent; the message says what to install."""


class Timeout(UcclEpError, TimeoutError):
    """A bounded wait expired. Names the rank that waited, the peer it waited for and the phase."""

    def __init__(self, rank: int, peer: int | None, phase: str, waited_s: float,
                 outstanding: object = None, hint: str = "") -> None:
        self.rank = rank
        self.peer = peer
        self.phase = phase
        self.waited_s = waited_s
        self.outstanding = outstanding
        who = "any peer" if peer is None else f"peer {peer}"
        msg = f"rank {rank} timed out after {waited_s:.1f}s waiting for {who} in phase '{phase}'"
        if outstanding is not None:
            msg += f"; outstanding: {outstanding}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class PeerFailure(UcclEpError):
    """A peer died or closed its endpoint; the survivors raise this instead of hanging."""

    def __init__(self, rank: int, peer: int | None, phase: str, detail: str = "") -> None:
        self.rank = rank
        self.peer = peer
        self.phase = phase
        who = "a peer" if peer is None else f"peer {peer}"
        msg = f"rank {rank}: {who} failed during '{phase}'"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class PeerProtocolError(UcclEpError):
    """A peer sent something that breaks the protocol (out-of-bounds offset, bad token, ...)."""


class Aborted(UcclEpError):
    """The buffer or proxy was shut down while an operation was waiting."""


# CUDA driver statuses after which the context is lost: every later call of the process fails too
# (the driver's documentation for each: "the process must be terminated and relaunched").
_STICKY_CUDA = {700, 702, 710, 714, 715, 716, 717, 718, 719}


class DeviceError(UcclEpError):
    """A call into the GPU runtime (the CUDA driver, or the HIP runtime on AMD) failed.

    ``call`` names the runtime's entry point (``cuMemAlloc_v2``, ``hipMemcpyHtoD``, ...), ``code``
    is its status, ``error_name`` the runtime's name for it (``CUDA_ERROR_OUT_OF_MEMORY``) and
    ``description`` the runtime's text. ``sticky`` is true for the statuses that lose the context
    (an illegal address, a failed launch, a device-side assert): every later GPU call of the process
    fails as well and only a new process recovers; after the others (out of memory, an invalid
    value) the device stays usable (docs/troubleshooting.md).
    """

    def __init__(self, call: str, code: int, error_name: str, description: str) -> None:
        self.call = call
        self.code = code
        self.error_name = error_name
        self.description = description
        self.sticky = code in _STICKY_CUDA
        msg = f"{call}: {error_name} ({description})"
        if self.sticky:
            msg += "; the GPU context is lost: restart the process"
        super().__init__(msg)
