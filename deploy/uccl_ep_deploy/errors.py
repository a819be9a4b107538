"""Typed errors of the launcher. Each says what went wrong, with which recipe field or argument, and
what was expected; `uccl-ep launch` prints them in one line and exits with 2. The classes derive from
the closest builtin (``ValueError``, ``ImportError``, ``TimeoutError``) as uccl_ep's own errors do,
without importing uccl_ep (rendering a recipe needs neither torch nor the EP library)."""

from __future__ import annotations

__all__ = ["DeployError", "InvalidArgument", "MissingDependency", "Timeout"]


class DeployError(RuntimeError):
    """Base class of every error raised by uccl_ep_deploy."""


class InvalidArgument(DeployError, ValueError):
    """A recipe field, an override or a command-line argument is not what the launcher accepts."""

    def __init__(self, argument: str, expected: str, got: object = None, hint: str = "") -> None:
        self.argument, self.expected, self.got = argument, expected, got
        msg = f"invalid argument `{argument}`: expected {expected}"
        if got is not None:
            msg += f", got {got}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class MissingDependency(DeployError, ImportError):
    """A tool the launch needs (sbatch, Ray) is not installed here."""


class Timeout(DeployError, TimeoutError):
    """A launch did not finish within its bound (the job was cancelled)."""

    def __init__(self, what: str, waited_s: float) -> None:
        self.what, self.waited_s = what, waited_s
        super().__init__(f"timed out after {waited_s:.1f}s waiting for {what}")
