"""`uccl-ep` command line: `bench` (the main job), `doctor`, and `launch`.

Each subcommand lives in its own module and registers its parser here, so the subcommands can
grow without touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (subcommand, module) pairs; each module defines add_parser(subparsers) and run(args) -> int.
_SUBCOMMANDS = (
    ("bench", "uccl_ep.cli.bench"),
    ("doctor", "uccl_ep.cli.doctor"),
    ("launch", "uccl_ep.cli.launch"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uccl-ep", description="uccl-ep: portable MoE expert-parallel communication")
    sub = parser.add_subparsers(dest="command", metavar="{bench,doctor,launch}")
    for name, module_name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # subcommand not built yet
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
