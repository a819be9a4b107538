"""Recipe files: load, merge (`extends`), validate.

A recipe is a TOML file (stdlib ``tomllib``) describing one way to run one framework with one model
on one platform. Shared parts live in profile files a recipe ``extends`` (``recipes/platforms/*.toml``
for NIC env and container images, ``recipes/models/*.toml`` for model facts); the recipe's own tables
are merged over them, later files winning, tables merged key by key, everything else replaced.

The tables are pydantic models: scalars are strict (a string is not an integer), unknown keys are
errors, so a typo never passes silently. Every error names the file and the dotted field and says
what is expected (``InvalidArgument``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

from annotated_types import Ge, Le
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from .errors import InvalidArgument

__all__ = ["Recipe", "RecipeFile", "Cluster", "Container", "Buffers", "Launch", "FRAMEWORKS", "PLATFORMS",
           "load_recipe", "recipe_from_dict", "merged_table"]

FRAMEWORKS = ("bench", "sglang", "vllm", "megatron", "primus")
PLATFORMS = ("p5en", "p6-b200", "mi300x-thor2", "mi300x-cx7", "local")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_TIME = r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_FLAG = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_SAYS = {_NAME: "a name of letters, digits, '.', '_' and '-'", _TIME: "a Slurm time like 01:30:00"}


def _ints(lo: int, hi: int):
    return Annotated[StrictInt, Ge(lo), Le(hi)]


def _bad(where: str, expected: str, got: Any) -> PydanticCustomError:
    """A check of ours, reported with its own dotted field (see _error)."""
    return PydanticCustomError("recipe", "{where}: expected {expected}", {"where": where, "expected": expected,
                                                                           "got": repr(got)})


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecipeTable(_Table):
    name: Annotated[StrictStr, Field(pattern=_NAME)]
    framework: Literal[FRAMEWORKS]  # type: ignore[valid-type]
    platform: Literal[PLATFORMS]  # type: ignore[valid-type]
    model: StrictStr = ""
    description: StrictStr = ""
    extra_args: tuple[StrictStr, ...] = ()
    notes: StrictStr = ""


class Cluster(_Table):
    nodes: _ints(1, 4096) = 1
    gpus_per_node: _ints(0, 64) = 8
    procs_per_node: _ints(0, 256) = 0          # 0 = one per GPU (or 1 without GPUs)
    time_limit: Annotated[StrictStr, Field(pattern=_TIME)] = "01:00:00"  # Slurm --time
    partition: StrictStr = ""
    account: StrictStr = ""
    exclusive: StrictBool = True
    cpus_per_node: _ints(0, 4096) = 0          # Ray bundle CPUs; 0 = leave to Ray / Slurm defaults

    @property
    def nproc(self) -> int:
        return self.procs_per_node or max(self.gpus_per_node, 1)


class Container(_Table):
    image: StrictStr = ""                       # pyxis --container-image (enroot URI or .sqsh); empty = bare metal
    mounts: tuple[StrictStr, ...] = ()
    workdir: StrictStr = ""

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, mounts: tuple[str, ...]) -> tuple[str, ...]:
        for m in mounts:
            if ":" not in m:
                raise _bad("container.mounts", "entries of the form SRC:DST[:FLAGS]", m)
        return mounts


class Buffers(_Table):
    """EP buffer sizing; each framework adapter turns these into its own flags or env."""
    nvl_mb: _ints(0, 1 << 20) = 0               # intranode (NVLink) buffer, MiB; 0 = framework default
    rdma_mb: _ints(0, 1 << 20) = 0              # internode buffer, MiB; 0 = framework default / size hint
    # NOTES: SGLang refuses more than 1024 LL tokens per rank; the same cap keeps every framework happy.
    ll_max_tokens_per_rank: _ints(0, 1024) = 0
    num_sms: _ints(0, 304) = 0                  # SMs (CUs) for normal-mode kernels; 0 = default


class Launch(_Table):
    python: Annotated[StrictStr, Field(min_length=1)] = "python3"  # interpreter on the nodes (in the container)
    master_port: _ints(1024, 65535) = 29500     # rendezvous / dist-init / DP RPC port on the head node
    timeout_s: _ints(10, 7 * 24 * 3600) = 3600  # the whole job's bound (Ray/local); Slurm: time_limit
    entry: tuple[StrictStr, ...] = ()           # megatron/primus/bench: what torchrun runs (script or -m module)
    ready_port: _ints(0, 65535) = 0             # servers: the HTTP port the batch script waits for (0 = none)


_Scalar = Union[StrictStr, StrictBool, StrictInt, StrictFloat]


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool))


class RecipeFile(_Table):
    """A merged recipe file, table by table as in the TOML."""
    recipe: RecipeTable
    cluster: Cluster = Field(default_factory=Cluster)
    container: Container = Field(default_factory=Container)
    buffers: Buffers = Field(default_factory=Buffers)
    launch: Launch = Field(default_factory=Launch)
    env: dict[str, str] = Field(default_factory=dict)
    args: dict[str, Union[_Scalar, tuple[_Scalar, ...]]] = Field(default_factory=dict)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, env: Any) -> dict[str, str]:
        if not isinstance(env, dict):
            raise _bad("env", 'a table of NAME = "value"', env)
        out = {}
        for k, v in env.items():
            if not re.match(_ENV_NAME, str(k)):
                raise _bad(f"env.{k}", "a variable name of letters, digits and '_'", k)
            if not _scalar(v):
                raise _bad(f"env.{k}", "a string, number or boolean", v)
            out[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            raise _bad("args", "a table of flag = value", args)
        for k, v in args.items():
            if not re.match(_FLAG, str(k)):
                raise _bad(f"args.{k}", "a flag name without leading dashes", k)
            if not (_scalar(v) or (isinstance(v, list) and all(_scalar(x) for x in v))):
                raise _bad(f"args.{k}", "a string, number, boolean or list of them", v)
        return args

    @model_validator(mode="after")
    def _entry_for_trainers(self) -> "RecipeFile":
        if self.recipe.framework in ("megatron", "primus") and not self.launch.entry:
            raise _bad("launch.entry", f"the script or module torchrun runs for {self.recipe.framework} "
                       "(a list of strings)", [])
        return self


@dataclass(frozen=True)
class Recipe:
    """A validated recipe and the file it came from (for messages)."""
    spec: RecipeFile
    source: str = ""

    name = property(lambda self: self.spec.recipe.name)
    framework = property(lambda self: self.spec.recipe.framework)
    platform = property(lambda self: self.spec.recipe.platform)
    model = property(lambda self: self.spec.recipe.model)
    description = property(lambda self: self.spec.recipe.description)
    extra_args = property(lambda self: self.spec.recipe.extra_args)
    notes = property(lambda self: self.spec.recipe.notes)
    cluster = property(lambda self: self.spec.cluster)
    container = property(lambda self: self.spec.container)
    buffers = property(lambda self: self.spec.buffers)
    launch = property(lambda self: self.spec.launch)
    env = property(lambda self: self.spec.env)

    @property
    def args(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.spec.args.items()}

    def as_dict(self) -> dict[str, Any]:
        """Every field, the [recipe] table's first, as `uccl-ep launch show` prints it."""
        d = self.spec.model_dump()
        top = d.pop("recipe")
        extra_args, notes = top.pop("extra_args"), top.pop("notes")
        return {**top, **d, "args": self.args, "extra_args": extra_args, "source": self.source, "notes": notes}


# --------------------------------------------------------------------------------------------
# pydantic's errors in the words of the recipe

_EXPECTED = {"int_type": "an integer", "bool_type": "true or false", "string_type": "a string",
             "tuple_type": "a list of strings", "list_type": "a list", "dict_type": "a table",
             "model_type": "a table", "model_attributes_type": "a table", "string_too_short": "a non-empty string",
             "missing": "a value"}


def _table_model(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = RecipeFile
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return None
        model = sub
    return model


def _error(source: str, err: dict) -> InvalidArgument:
    kind, ctx, loc = err["type"], err.get("ctx") or {}, tuple(str(p) for p in err["loc"])
    if kind == "recipe":
        return InvalidArgument(f"{source}: {ctx['where']}", ctx["expected"], ctx["got"])
    where = ".".join(loc) or "(top level)"
    model = _table_model(loc)
    if kind == "extra_forbidden":
        known = ", ".join(model.model_fields) if model else ""
        return InvalidArgument(f"{source}: {where}", f"one of the known keys ({known})", "an unknown key")
    if kind in ("greater_than_equal", "less_than_equal") and model is not None:
        meta = model.model_fields[loc[-1]].metadata
        lo = next((m.ge for m in meta if isinstance(m, Ge)), None)
        hi = next((m.le for m in meta if isinstance(m, Le)), None)
        expected = f"an integer in [{lo}, {hi}]"
    elif kind == "literal_error":
        choices = get_args(model.model_fields[loc[-1]].annotation) if model else ()
        expected = "one of " + ", ".join(choices) if choices else err["msg"]
    elif kind == "string_pattern_mismatch":
        expected = _SAYS.get(ctx.get("pattern", ""), f"a string matching {ctx.get('pattern')}")
    else:
        expected = _EXPECTED.get(kind, err["msg"])
    return InvalidArgument(f"{source}: {where}", expected, repr(err.get("input")))


def recipe_from_dict(data: dict[str, Any], source: str = "<recipe>", default_name: str = "") -> Recipe:
    """Validate a merged recipe table and build the typed ``Recipe``."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{source}: (top level)", "a table", repr(data))
    table = {k: v for k, v in data.items() if k != "extends"}
    head = table.get("recipe", {})
    if isinstance(head, dict):
        table["recipe"] = {"name": default_name, "framework": "", "platform": "", **head}
    try:
        return Recipe(RecipeFile.model_validate(table), source)
    except ValidationError as e:
        raise _error(source, e.errors()[0]) from None


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
    return recipe_from_dict(merged_table(p), source=str(p), default_name=p.stem)
