"""The ``uccl-ep-megatron`` launcher.

    uccl-ep-megatron [run] SCRIPT.py [MEGATRON ARGS...]   run a training script with the hook
    uccl-ep-megatron [run] -m MODULE [MEGATRON ARGS...]   same, for a module
    uccl-ep-megatron check [MEGATRON ARGS...]            parse + check the arguments, print the result
    uccl-ep-megatron info                                versions: installed, supported, tested

Under torchrun: ``torchrun --nproc-per-node 8 -m uccl_ep_megatron pretrain_gpt.py ...``.
The hook is installed before the script runs, i.e. before Megatron builds its parser, so
``--moe-flex-dispatcher-backend uccl`` and the ``--uccl-*`` flags are part of Megatron's own
command line. Configuration mistakes (bad flag combinations, an unsupported megatron-core) end
with one ``uccl-ep-megatron: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Optional, Sequence

from uccl_ep.errors import InvalidArgument, MissingDependency, Unsupported

USAGE = __doc__.split("\n\n")[1]
_CONFIG_ERRORS = (InvalidArgument, Unsupported, MissingDependency)


def _fail(message: str) -> int:
    print(f"uccl-ep-megatron: error: {message}", file=sys.stderr)
    return 2


_installing = False


def _install(argv: Sequence[str]) -> None:
    global _installing
    from . import install

    _installing = True
    install()
    _installing = False


def _run(argv: list[str]) -> int:
    if not argv:
        return _fail("expected SCRIPT or -m MODULE\n" + USAGE)
    _install(argv)
    if argv[0] == "-m":
        if len(argv) < 2:
            return _fail("-m needs a module name")
        module, rest = argv[1], argv[2:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    script, rest = argv[0], argv[1:]
    if not os.path.isfile(script):
        return _fail(f"no such training script: {script}")
    sys.argv = [script, *rest]
    # NOTES: `python SCRIPT` puts the script's folder first on sys.path; Megatron-LM's
    # pretrain_gpt.py imports its neighbours (gpt_builders, model_provider) that way.
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def _check(argv: list[str]) -> int:
    _install(argv)
    from megatron.training import arguments

    from . import current

    sys.argv = ["uccl-ep-megatron check", *argv]
    args = arguments.parse_args()
    summary = {
        "moe_token_dispatcher_type": args.moe_token_dispatcher_type,
        "moe_flex_dispatcher_backend": args.moe_flex_dispatcher_backend,
        "moe_flex_dispatcher_num_sms": args.moe_flex_dispatcher_num_sms,
        "uccl": current().buffer_kwargs(),
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


def _info() -> int:
    from . import __version__
    from .versions import TESTED_VERSIONS, in_tested_window, megatron_core_version, window_text

    info = {"uccl_ep_megatron": __version__, "tested_window": window_text(), "tested": list(TESTED_VERSIONS)}
    try:
        version = megatron_core_version()
        info["megatron_core"] = ".".join(map(str, version))
        info["megatron_core_in_tested_window"] = in_tested_window(version)
    except MissingDependency as exc:
        info["megatron_core"] = None
        info["error"] = str(exc)
    print(json.dumps(info, sort_keys=True))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command = argv[0]
    try:
        if command == "info":
            return _info()
        if command == "check":
            return _check(argv[1:])
        if command == "run":
            return _run(argv[1:])
        if command == "-m" or command.endswith(".py") or os.path.isfile(command):
            return _run(argv)
        return _fail(f"unknown command {command!r} (expected run, check, info, a SCRIPT.py or -m MODULE)\n" + USAGE)
    except _CONFIG_ERRORS as exc:
        if command in ("run", "-m") or command.endswith(".py") or os.path.isfile(command):
            if not getattr(exc, "uccl_config_error", False) and not _installing:
                raise  # an error of the running job: keep its traceback
        return _fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
