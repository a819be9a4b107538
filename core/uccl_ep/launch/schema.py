"""Recipe files: load, merge (`extends`), validate.

A recipe is a TOML file (stdlib ``tomllib``: no extra dependency) describing one way to run one
framework with one model on one platform. Shared parts live in profile files a recipe
``extends`` (``recipes/platforms/*.toml`` for NIC env and container images, ``recipes/models/*.toml``
for model facts); the recipe's own tables are merged over them, later files winning, tables merged
key by key, everything else replaced.

Every field is checked with a typed check that names the file and the dotted field and says what
is expected (``InvalidArgument``); unknown keys are errors too, so a typo never passes silently.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument

__all__ = ["Recipe", "Cluster", "Container", "Buffers", "Launch", "FRAMEWORKS", "PLATFORMS",
           "load_recipe", "recipe_from_dict", "merged_table"]

FRAMEWORKS = ("bench", "sglang", "vllm", "megatron", "primus")
PLATFORMS = ("p5en", "p6-b200", "mi300x-thor2", "mi300x-cx7", "local")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$")
_FLAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Cluster:
    nodes: int = 1
    gpus_per_node: int = 8
    procs_per_node: int = 0          # 0 = one per GPU (or 1 without GPUs)
    time_limit: str = "01:00:00"     # Slurm --time
    partition: str = ""
    account: str = ""
    exclusive: bool = True
    cpus_per_node: int = 0           # Ray bundle CPUs; 0 = leave to Ray / Slurm defaults

    @property
    def nproc(self) -> int:
        return self.procs_per_node or max(self.gpus_per_node, 1)


@dataclass(frozen=True)
class Container:
    image: str = ""                  # pyxis --container-image (enroot URI or .sqsh path); empty = bare metal
    mounts: tuple[str, ...] = ()
    workdir: str = ""


@dataclass(frozen=True)
class Buffers:
    """EP buffer sizing; each framework adapter turns these into its own flags or env."""
    nvl_mb: int = 0                  # intranode (NVLink) buffer, MiB; 0 = framework default
    rdma_mb: int = 0                 # internode buffer, MiB; 0 = framework default / size hint
    ll_max_tokens_per_rank: int = 0  # low-latency max dispatch tokens per rank; 0 = default
    num_sms: int = 0                 # SMs (CUs) for normal-mode kernels; 0 = default


@dataclass(frozen=True)
class Launch:
    python: str = "python3"          # interpreter on the nodes (inside the container, if any)
    master_port: int = 29500         # rendezvous / dist-init / DP RPC port on the head node
    timeout_s: int = 3600            # the whole job is bounded by this (Ray/local) or time_limit (Slurm)
    entry: tuple[str, ...] = ()      # megatron/primus/bench: what torchrun runs (script or -m module)
    ready_port: int = 0              # servers: the HTTP port the batch script waits for (0 = none)


@dataclass(frozen=True)
class Recipe:
    name: str
    framework: str
    platform: str
    model: str = ""
    description: str = ""
    cluster: Cluster = field(default_factory=Cluster)
    container: Container = field(default_factory=Container)
    buffers: Buffers = field(default_factory=Buffers)
    launch: Launch = field(default_factory=Launch)
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    source: str = ""                 # file it came from, for messages
    notes: str = ""

    def with_overrides(self, **changes: Any) -> "Recipe":
        from dataclasses import replace
        return replace(self, **changes)


# --------------------------------------------------------------------------------------------
# typed checks

class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def bad(self, where: str, expected: str, got: Any) -> InvalidArgument:
        return InvalidArgument(f"{self.source}: {where}", expected, repr(got))

    def table(self, data: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.bad(where, "a table", data)
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise InvalidArgument(f"{self.source}: {where}.{unknown[0]}",
                                  f"one of the known keys ({', '.join(allowed)})", "an unknown key")
        return data

    def integer(self, data: dict, key: str, where: str, default: int, minimum: int = 0,
                maximum: int | None = None) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(f"{where}.{key}", "an integer", value)
        if value < minimum or (maximum is not None and value > maximum):
            rng = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise self.bad(f"{where}.{key}", f"an integer {rng}", value)
        return value

    def string(self, data: dict, key: str, where: str, default: str = "", pattern: re.Pattern | None = None,
               choices: tuple[str, ...] = (), what: str = "") -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.bad(f"{where}.{key}", "a string", value)
        if choices and value not in choices:
            raise self.bad(f"{where}.{key}", f"one of {', '.join(choices)}", value)
        if pattern is not None and value and not pattern.match(value):
            raise self.bad(f"{where}.{key}", what or f"a string matching {pattern.pattern}", value)
        return value

    def boolean(self, data: dict, key: str, where: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            raise self.bad(f"{where}.{key}", "true or false", value)
        return value

    def strings(self, data: dict, key: str, where: str) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(f"{where}.{key}", "a list of strings", value)
        return tuple(value)


def _scalar_ok(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool))


def recipe_from_dict(data: dict[str, Any], source: str = "<recipe>", default_name: str = "") -> Recipe:
    """Validate a merged recipe table and build the typed ``Recipe``."""
    c = _Checker(source)
    top = c.table(data, "(top level)", ("recipe", "cluster", "container", "buffers", "launch", "env", "args",
                                        "extends"))
    r = c.table(top.get("recipe", {}), "recipe",
                ("name", "framework", "platform", "model", "description", "extra_args", "notes"))
    name = c.string(r, "name", "recipe", default_name, re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
                    what="a name of letters, digits, '.', '_' and '-'")
    if not name:
        raise c.bad("recipe.name", "a non-empty name", name)
    framework = c.string(r, "framework", "recipe", "", choices=FRAMEWORKS)
    platform = c.string(r, "platform", "recipe", "", choices=PLATFORMS)

    cl = c.table(top.get("cluster", {}), "cluster", tuple(Cluster.__dataclass_fields__))
    cluster = Cluster(
        nodes=c.integer(cl, "nodes", "cluster", 1, 1, 4096),
        gpus_per_node=c.integer(cl, "gpus_per_node", "cluster", 8, 0, 64),
        procs_per_node=c.integer(cl, "procs_per_node", "cluster", 0, 0, 256),
        time_limit=c.string(cl, "time_limit", "cluster", "01:00:00", _TIME, what="a Slurm time like 01:30:00"),
        partition=c.string(cl, "partition", "cluster"),
        account=c.string(cl, "account", "cluster"),
        exclusive=c.boolean(cl, "exclusive", "cluster", True),
        cpus_per_node=c.integer(cl, "cpus_per_node", "cluster", 0, 0, 4096),
    )
    co = c.table(top.get("container", {}), "container", ("image", "mounts", "workdir"))
    container = Container(image=c.string(co, "image", "container"), mounts=c.strings(co, "mounts", "container"),
                          workdir=c.string(co, "workdir", "container"))
    for m in container.mounts:
        if ":" not in m:
            raise c.bad("container.mounts", "entries of the form SRC:DST[:FLAGS]", m)
    bu = c.table(top.get("buffers", {}), "buffers", tuple(Buffers.__dataclass_fields__))
    buffers = Buffers(
        nvl_mb=c.integer(bu, "nvl_mb", "buffers", 0, 0, 1 << 20),
        rdma_mb=c.integer(bu, "rdma_mb", "buffers", 0, 0, 1 << 20),
        # NOTES: SGLang refuses more than 1024 LL tokens per rank; the same cap keeps every framework happy.
        ll_max_tokens_per_rank=c.integer(bu, "ll_max_tokens_per_rank", "buffers", 0, 0, 1024),
        num_sms=c.integer(bu, "num_sms", "buffers", 0, 0, 304),
    )
    la = c.table(top.get("launch", {}), "launch", tuple(Launch.__dataclass_fields__))
    launch = Launch(
        python=c.string(la, "python", "launch", "python3"),
        master_port=c.integer(la, "master_port", "launch", 29500, 1024, 65535),
        timeout_s=c.integer(la, "timeout_s", "launch", 3600, 10, 7 * 24 * 3600),
        entry=c.strings(la, "entry", "launch"),
        ready_port=c.integer(la, "ready_port", "launch", 0, 0, 65535),
    )
    if not launch.python:
        raise c.bad("launch.python", "a non-empty interpreter name or path", launch.python)
    if framework in ("megatron", "primus") and not launch.entry:
        raise c.bad("launch.entry", f"the script or module torchrun runs for {framework} (a list of strings)", [])

    env_t = top.get("env", {})
    if not isinstance(env_t, dict):
        raise c.bad("env", "a table of NAME = \"value\"", env_t)
    env: dict[str, str] = {}
    for k, v in env_t.items():
        if not _ENV_NAME.match(k):
            raise c.bad(f"env.{k}", "a variable name of letters, digits and '_'", k)
        if not _scalar_ok(v):
            raise c.bad(f"env.{k}", "a string, number or boolean", v)
        env[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)

    args_t = top.get("args", {})
    if not isinstance(args_t, dict):
        raise c.bad("args", "a table of flag = value", args_t)
    for k, v in args_t.items():
        if not _FLAG.match(k):
            raise c.bad(f"args.{k}", "a flag name without leading dashes", k)
        if not (_scalar_ok(v) or (isinstance(v, list) and all(_scalar_ok(x) for x in v))):
            raise c.bad(f"args.{k}", "a string, number, boolean or list of them", v)
    return Recipe(name=name, framework=framework, platform=platform,
                  model=c.string(r, "model", "recipe"), description=c.string(r, "description", "recipe"),
                  cluster=cluster, container=container, buffers=buffers, launch=launch, env=env,
                  args=dict(args_t), extra_args=c.strings(r, "extra_args", "recipe"), source=source,
                  notes=c.string(r, "notes", "recipe"))


# --------------------------------------------------------------------------------------------
# files and `extends`

def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise InvalidArgument("recipe", "an existing recipe file", str(path)) from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgument(f"{path}", "valid TOML", str(e)) from None


def merged_table(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The file's table with every ``extends`` file merged underneath (depth first, in order)."""
    path = path.resolve()
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise InvalidArgument(f"{path}: extends", "no cycles", cycle)
    data = _read_toml(path)
    ext = data.pop("extends", [])
    if isinstance(ext, str):
        ext = [ext]
    if not isinstance(ext, list) or not all(isinstance(e, str) for e in ext):
        raise InvalidArgument(f"{path}: extends", "a path or a list of paths (relative to the file)", repr(ext))
    merged: dict[str, Any] = {}
    for e in ext:
        merged = _merge(merged, merged_table((path.parent / e), (*_chain, path)))
    return _merge(merged, data)


def load_recipe(path: str | Path) -> Recipe:
    p = Path(path)
    table = merged_table(p)
    return recipe_from_dict(table, source=str(p), default_name=p.stem)
