"""`uccl-ep` command line: `bench` (the main job) and `doctor`, plus the subcommands other
distributions add through the entry point group ``uccl_ep.cli`` (``launch``: uccl-ep-deploy).

Each subcommand lives in its own module and registers its parser here, so the subcommands can
grow without touching each other. A subcommand module defines ``add_parser(subparsers)``, whose
parser sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

# (subcommand, module) pairs of this distribution.
_SUBCOMMANDS = (
    ("bench", "uccl_ep.cli.bench"),
    ("doctor", "uccl_ep.cli.doctor"),
)
#: entry point group of subcommands that other distributions provide
PLUGIN_GROUP = "uccl_ep.cli"
#: where a subcommand that users expect comes from, for the error when it is not installed
_ELSEWHERE = {"launch": "the uccl-ep-deploy distribution (from a checkout: pip install ./deploy)"}


def _not_installed(name: str, where: str):
    def run(args) -> int:
        print(f"uccl-ep {name}: not installed; it comes with {where}", file=sys.stderr)
        return 2
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uccl-ep", description="uccl-ep: portable MoE expert-parallel communication")
    names = [name for name, _ in _SUBCOMMANDS]
    plugins = sorted((ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name not in names), key=lambda ep: ep.name)
    names += [ep.name for ep in plugins] + [n for n in _ELSEWHERE if n not in {ep.name for ep in plugins}]
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}")
    for _, module_name in _SUBCOMMANDS:
        importlib.import_module(module_name).add_parser(sub)
    for ep in plugins:
        ep.load().add_parser(sub)
    for name, where in _ELSEWHERE.items():
        if name not in {ep.name for ep in plugins}:
            p = sub.add_parser(name, help=f"(not installed: comes with {where})", add_help=False)
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=_not_installed(name, where))
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
