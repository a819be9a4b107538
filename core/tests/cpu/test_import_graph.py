"""The uccl_ep package has no import cycles, counting imports inside functions too (a lazy import
only hides a cycle until someone moves it), and the executors share definitions through
`uccl_ep.protocol` and `uccl_ep.executor_interface` rather than through each other."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import uccl_ep

ROOT = Path(uccl_ep.__file__).resolve().parent


def _modules(root: Path, top: str) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return {m: v for m, v in out.items() if m.split(".")[0] == top}


def _is_extension(name: str) -> bool:
    """A compiled module (uccl_ep._C): a leaf of the graph."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, OSError):  # OSError: a stale editable install's entry
        return False
    return spec is not None and spec.origin is not None and not spec.origin.endswith(".py")


def import_graph(root: Path, top: str) -> dict[str, set[str]]:
    """module -> the package modules it imports, anywhere in its body; ``from pkg import name``
    counts as an import of pkg.name when that is a module, else of pkg."""
    mods = _modules(root, top)

    def owner(name: str) -> str:
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[mod] |= {owner(a.name) for a in node.names if a.name.split(".")[0] == top}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")[:None if is_pkg else -1]
                    base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] != top:
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        graph[mod].add(full)
                    elif not _is_extension(full):
                        graph[mod].add(owner(base))
    for mod in graph:
        graph[mod].discard(mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(graph, comp) -> str:
    edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a] & set(comp))]
    return "cycle among " + ", ".join(comp) + ":\n  " + "\n  ".join(edges)


def test_no_import_cycles():
    graph = import_graph(ROOT, "uccl_ep")
    assert len(graph) > 50 and "uccl_ep.cuda.executor" in graph
    found = cycles(graph)
    assert not found, "\n".join(_describe(graph, c) for c in found)


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "cyc"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import thing\n")  # lazy: still a cycle
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(pkg, "cyc")
    assert cycles(graph) == [["cyc.a", "cyc.sub.b"]]


def test_executors_share_definitions_through_protocol():
    """cuda/ imports neither host/ nor refs/; host/ imports from refs/ only what defines the semantics it
    must match bit for bit (the FP8 cast, LogFMT, the top-k check, the dispatch layout); no executor imports
    the registry (backends) that imports it."""
    graph = import_graph(ROOT, "uccl_ep")
    bad = []
    for mod, deps in graph.items():
        for dep in deps:
            if mod.startswith("uccl_ep.cuda") and dep.startswith(("uccl_ep.host", "uccl_ep.refs")):
                bad.append(f"{mod} -> {dep}")
            if mod.startswith("uccl_ep.host") and dep.startswith("uccl_ep.refs") and \
                    dep not in ("uccl_ep.refs.fp8", "uccl_ep.refs.logfmt", "uccl_ep.refs.low_latency", "uccl_ep.refs.normal"):
                bad.append(f"{mod} -> {dep}")
            if mod.startswith(("uccl_ep.cuda", "uccl_ep.host", "uccl_ep.refs")) and dep == "uccl_ep.backends":
                bad.append(f"{mod} -> {dep}")
    assert not bad, bad
