"""Finding recipes by name, listing them, and `--set key=value` overrides."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from .errors import InvalidArgument
from .schema import Recipe, merged_table, recipe_from_dict

__all__ = ["recipe_dirs", "find_recipe", "list_recipes", "parse_override", "load", "PACKAGED_RECIPES"]

#: the recipes shipped with this distribution (recipes/ of the repository)
PACKAGED_RECIPES = Path(__file__).resolve().parent / "recipes"
# Folders under a recipes directory that hold profiles (merged into recipes), not recipes.
PROFILE_DIRS = ("platforms", "models")


def recipe_dirs(extra: str | None = None) -> list[Path]:
    """Where recipe names are looked up, in order: --recipes-dir, $UCCL_EP_RECIPES_DIR, ./recipes,
    and the recipes shipped with this package."""
    dirs = []
    if extra:
        dirs.append(Path(extra))
    configured = os.environ.get("UCCL_EP_RECIPES_DIR", "")
    if configured:
        dirs.append(Path(configured))
    dirs.append(Path.cwd() / "recipes")
    dirs.append(PACKAGED_RECIPES)
    seen, out = set(), []
    for d in dirs:
        key = d.resolve()
        if key not in seen and d.is_dir():
            seen.add(key)
            out.append(d)
    return out


def list_recipes(extra: str | None = None) -> list[tuple[str, Path]]:
    """(name, path) of every recipe (profiles excluded); the name is the path below its directory."""
    found: dict[str, Path] = {}
    for d in recipe_dirs(extra):
        for p in sorted(d.rglob("*.toml")):
            rel = p.relative_to(d)
            if rel.parts[0] in PROFILE_DIRS:
                continue
            found.setdefault(str(rel.with_suffix("")), p)
    return sorted(found.items())


def find_recipe(name: str, extra: str | None = None) -> Path:
    p = Path(name)
    if p.suffix == ".toml" and p.is_file():
        return p
    candidates = list_recipes(extra)
    exact = [path for n, path in candidates if n == name]
    if exact:
        return exact[0]
    by_stem = [path for n, path in candidates if Path(n).name == name]
    if len(by_stem) == 1:
        return by_stem[0]
    near = [n for n, _ in candidates if name in n][:8]
    hint = ("did you mean: " + ", ".join(near)) if near else "`uccl-ep launch list` shows them"
    expected = "a recipe file or name" if not by_stem else "one recipe (the name is ambiguous)"
    raise InvalidArgument("recipe", expected, repr(name), hint=hint)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``cluster.nodes=4`` -> (["cluster", "nodes"], 4). Values are TOML literals when they parse
    as one (numbers, true/false, "strings", [lists]), else plain strings; the recipe's schema
    checks them like any value in a file."""
    if "=" not in text:
        raise InvalidArgument("--set", "KEY=VALUE with a dotted KEY such as cluster.nodes=4", repr(text))
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise InvalidArgument("--set", "a dotted key such as env.FI_PROVIDER", repr(key))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def load(name: str, overrides: list[str] = (), extra_dir: str | None = None) -> Recipe:  # type: ignore[assignment]
    path = find_recipe(name, extra_dir)
    table = merged_table(path)
    for text in overrides:
        keys, value = parse_override(text)
        node = table
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise InvalidArgument("--set", f"{'.'.join(keys[:-1])} to be a table", repr(node))
        node[keys[-1]] = value
    return recipe_from_dict(table, source=os.path.relpath(path), default_name=path.stem)
