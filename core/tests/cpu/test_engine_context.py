"""The cuda executor's engines read only what `EngineContext` holds (cuda/engine_context.py).

Static checks of the sources (the executor itself only runs on a GPU): every attribute an engine or
the proxy session reads of its context is a field of EngineContext, no engine reaches into the
executor (`self.ex`), and the executor builds the context with existing fields, every required one
given.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from uccl_ep.cuda.engine_context import EngineContext

pytestmark = pytest.mark.cpu
CUDA = Path(__file__).resolve().parents[2] / "uccl_ep" / "cuda"
ENGINES = ["ll.py", "ll_hybrid.py", "ll_proxy.py", "proxy_session.py", "ht.py", "ht_ce.py", "ht_proxy.py",
           "ht_proxy_forward.py"]
FIELDS = {f.name for f in dataclasses.fields(EngineContext)}


def _context_reads(tree: ast.AST) -> set[str]:
    """Attributes read of `ec`, `self.ec`, `eng.ec` or `engine.ec`."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "ec":
            out.add(node.attr)
        elif isinstance(base, ast.Attribute) and base.attr == "ec" and isinstance(base.value, ast.Name) and \
                base.value.id in ("self", "eng", "engine"):
            out.add(node.attr)
    return out


@pytest.mark.parametrize("name", ENGINES)
def test_engines_read_only_the_context(name):
    tree = ast.parse((CUDA / name).read_text())
    assert _context_reads(tree) <= FIELDS, sorted(_context_reads(tree) - FIELDS)
    reach = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "ex"]
    assert reach == [], f"{name} reaches into the executor (.ex) at lines {reach}"


def test_executor_builds_the_context_with_its_fields():
    tree = ast.parse((CUDA / "executor.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "EngineContext"]
    assert len(calls) == 1
    given = {k.arg for k in calls[0].keywords}
    required = {f.name for f in dataclasses.fields(EngineContext)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert given <= FIELDS and required <= given, (sorted(given - FIELDS), sorted(required - given))
    # every field the engines read is handed over (a default would silently stand in for it)
    read = set().union(*(_context_reads(ast.parse((CUDA / n).read_text())) for n in ENGINES))
    assert read <= given, sorted(read - given)
