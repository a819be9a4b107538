"""A launch plan: what runs on each node, independent of how the nodes are reached.

The per-node command line is known at render time except for three things only the node (or the
Ray driver) knows: its node rank, the head's address and the rendezvous port. Those appear in argv
tokens as ``NodeVar`` parts, so the same plan renders to

- bash for Slurm (``"$NODE_RANK"``, ``$((NODE_RANK * 8))``, ...), evaluated on each node;
- concrete argv lists for the Ray driver and the local runner, evaluated in Python.

The head (node 0) and the other nodes may run different argv (vLLM's ``--headless`` workers).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["NodeVar", "Token", "Plan", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "token_to_shell",
           "argv_to_shell", "evaluate_argv", "tok"]

_SHELL_NAMES = {"node_rank": "NODE_RANK", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}


@dataclass(frozen=True)
class NodeVar:
    """A value only the node knows: ``name * times + plus`` (numbers) or ``name`` (the address)."""
    name: str
    times: int = 1
    plus: int = 0

    def __post_init__(self) -> None:
        if self.name not in _SHELL_NAMES:
            raise ValueError(f"unknown node variable {self.name!r}")

    def shell(self) -> str:
        var = _SHELL_NAMES[self.name]
        if self.times == 1 and self.plus == 0:
            return "${" + var + "}"
        return f"$(({var} * {self.times} + {self.plus}))"

    def value(self, values: dict[str, Any]) -> str:
        v = values[self.name]
        if self.times == 1 and self.plus == 0:
            return str(v)
        return str(int(v) * self.times + self.plus)


NODE_RANK = NodeVar("node_rank")
MASTER_ADDR = NodeVar("master_addr")
MASTER_PORT = NodeVar("master_port")

Part = Union[str, NodeVar]
Token = tuple[Part, ...]


def tok(*parts: Any) -> Token:
    """One argv token made of literal text and node variables (numbers become text)."""
    return tuple(p if isinstance(p, NodeVar) else str(p) for p in parts)


def token_to_shell(token: Token) -> str:
    if all(isinstance(p, str) for p in token):
        return shlex.quote("".join(token))  # type: ignore[arg-type]
    out = ['"']
    for p in token:
        if isinstance(p, NodeVar):
            out.append(p.shell())
        else:
            out.append(p.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`"))
    out.append('"')
    return "".join(out)


def argv_to_shell(argv: list[Token], indent: str = "  ", width: int = 100) -> str:
    """Render argv as one bash command, wrapped with backslashes near ``width`` columns."""
    words = [token_to_shell(t) for t in argv]
    lines, cur = [], ""
    for w in words:
        # NOTES: break only before a flag, so a flag and its value stay on one line.
        if cur and len(cur) + 1 + len(w) > width and w.lstrip("'\"").startswith("-"):
            lines.append(cur)
            cur = indent + w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return " \\\n".join(lines)


def evaluate_argv(argv: list[Token], values: dict[str, Any]) -> list[str]:
    return ["".join(p.value(values) if isinstance(p, NodeVar) else p for p in t) for t in argv]


def _token_to_json(t: Token) -> list[Any]:
    return [p if isinstance(p, str) else {"var": p.name, "times": p.times, "plus": p.plus} for p in t]


def _token_from_json(parts: list[Any]) -> Token:
    return tuple(p if isinstance(p, str) else NodeVar(p["var"], p.get("times", 1), p.get("plus", 0)) for p in parts)


@dataclass
class Plan:
    name: str
    nodes: int
    gpus_per_node: int
    nproc_per_node: int
    master_port: int
    timeout_s: int
    head_argv: list[Token]
    worker_argv: list[Token]
    env: dict[str, str] = field(default_factory=dict)
    cpus_per_node: int = 0
    ready_port: int = 0
    source: str = ""

    def node_argv(self, node_rank: int) -> list[Token]:
        return self.head_argv if node_rank == 0 else self.worker_argv

    def node_env(self, node_rank: int, master_addr: str, master_port: int) -> dict[str, str]:
        env = dict(self.env)
        env.update(NODE_RANK=str(node_rank), NNODES=str(self.nodes), MASTER_ADDR=master_addr,
                   MASTER_PORT=str(master_port))
        return env

    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in ("name", "nodes", "gpus_per_node", "nproc_per_node", "master_port",
                                           "timeout_s", "env", "cpus_per_node", "ready_port", "source")}
        d["head_argv"] = [_token_to_json(t) for t in self.head_argv]
        d["worker_argv"] = [_token_to_json(t) for t in self.worker_argv]
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        d["head_argv"] = [_token_from_json(t) for t in d["head_argv"]]
        d["worker_argv"] = [_token_from_json(t) for t in d["worker_argv"]]
        return cls(**d)
