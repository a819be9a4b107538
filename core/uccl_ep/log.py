"""uccl_ep's logging: the standard `logging` module, one logger tree under ``uccl_ep``.

Every module logs through ``get_logger(__name__)`` (``uccl_ep.buffer``, ``uccl_ep.backends``, ...);
the framework plugins log under ``uccl_ep.sglang``, ``uccl_ep.vllm``, ``uccl_ep.megatron`` and
``uccl_ep.primus``, so one setting governs them all.

``UCCL_EP_LOG_LEVEL`` (env registry) sets the level of the ``uccl_ep`` logger when the package is
imported. Left unset, the logger keeps the default level ``warning`` and has no handler of its
own: records propagate to the application's logging configuration (or, with none, to Python's
last-resort stderr handler, which prints warnings and errors). Set explicitly, uccl_ep also
attaches one stderr handler to ``uccl_ep`` and stops propagation, so ``debug`` / ``info`` records
show even in a process that configured no logging, and never twice.

`warn_once` is for conditions a user must see but that would otherwise repeat per call or per
Buffer (e.g. ``backend="auto"`` not picking the fast path): logged at WARNING the first time a
key is seen in this process, at DEBUG afterwards.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["ROOT", "get_logger", "configure", "warn_once", "reset_warn_once"]

ROOT = "uccl_ep"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_FORMAT = "[%(name)s %(levelname)s] %(message)s"

_lock = threading.Lock()
_warned: set[str] = set()
_handler: logging.Handler | None = None


def get_logger(name: str) -> logging.Logger:
    """The logger for ``name``, always below ``uccl_ep`` (``uccl_ep.x`` stays, ``x`` -> ``uccl_ep.x``)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)


def configure(environ=None) -> logging.Logger:
    """Apply ``UCCL_EP_LOG_LEVEL`` to the ``uccl_ep`` logger (idempotent; run at import).

    A malformed value raises `uccl_ep.errors.InvalidArgument` naming the variable (registry rule).
    """
    global _handler
    from . import env

    logger = logging.getLogger(ROOT)
    level = env.get("UCCL_EP_LOG_LEVEL", environ)
    logger.setLevel(_LEVELS[level])
    with _lock:
        if env.is_set("UCCL_EP_LOG_LEVEL", environ):
            if _handler is None:
                _handler = logging.StreamHandler(sys.stderr)
                _handler.setFormatter(logging.Formatter(_FORMAT))
                logger.addHandler(_handler)
            logger.propagate = False
        elif _handler is not None:
            logger.removeHandler(_handler)
            _handler = None
            logger.propagate = True
    return logger


def warn_once(logger: logging.Logger, key: str, message: str, *args) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process (then at DEBUG).

    Returns True when it was logged at WARNING.
    """
    with _lock:
        first = key not in _warned
        _warned.add(key)
    logger.log(logging.WARNING if first else logging.DEBUG, message, *args)
    return first


def reset_warn_once() -> None:
    """Forget which warnings were given (tests)."""
    with _lock:
        _warned.clear()
