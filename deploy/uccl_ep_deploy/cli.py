"""`uccl-ep launch`: run a recipe (framework x model x platform) on Slurm, Ray or this host.

    uccl-ep launch list                                   the recipes it knows
    uccl-ep launch show RECIPE                            the merged, validated recipe (JSON)
    uccl-ep launch slurm RECIPE [--dry-run | -o F] [--wait]   sbatch script: srun + torchrun / framework flags
    uccl-ep launch ray RECIPE [--address HEAD:6379 | --address http://HEAD:8265]
                                                          placement group, one N-GPU slot per node
                                                          (http://: through Ray's job submission API)
    uccl-ep launch local RECIPE [--nodes 1]               every node as a process group on this host

(`uccl-ep-launch ...` is the same command where only uccl-ep-deploy is installed.)

RECIPE is a .toml path or a name from `list` (e.g. sglang/deepseek-v3-p5en, or just
deepseek-v3-p5en). `--set KEY=VALUE` overrides any field (cluster.nodes=4, env.NCCL_DEBUG=INFO,
args.tp=16). `--dry-run` prints what would run and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

__all__ = ["add_parser", "run"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe file (.toml) or name (see `uccl-ep launch list`)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field, e.g. cluster.nodes=4 or env.NCCL_DEBUG=INFO (repeatable)")
    p.add_argument("--nodes", type=int, help="shorthand for --set cluster.nodes=N")
    p.add_argument("--image", help="shorthand for --set container.image=IMAGE (slurm: pyxis image)")
    p.add_argument("--python", help="shorthand for --set launch.python=PATH (interpreter on the nodes)")
    p.add_argument("--timeout", type=int, help="shorthand for --set launch.timeout_s=S")
    p.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    p.add_argument("-o", "--output", help="also write what runs here: the sbatch script (slurm), the job directory "
                                          "(ray: ray_driver.py + plan.json)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`uccl-ep launch` (uccl_ep.cli.main loads this module through the `uccl_ep.cli` entry point)."""
    p = sub.add_parser("launch", help="run a recipe on Slurm, Ray or this host", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)


def main(argv: list[str] | None = None) -> int:
    """`uccl-ep-launch`: the same command without uccl-ep (nor torch) installed."""
    p = argparse.ArgumentParser(prog="uccl-ep-launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _configure(p)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipes-dir", help="extra folder to look up recipe names in ($UCCL_EP_RECIPES_DIR)")
    targets = p.add_subparsers(dest="target", metavar="{list,show,slurm,ray,local}")
    targets.required = True
    targets.add_parser("list", help="list the recipes")
    show = targets.add_parser("show", help="print the merged, validated recipe and its per-node commands")
    _common(show)
    show.add_argument("--plan", action="store_true",
                      help="print the launch plan as JSON instead (what the Ray driver's --plan reads)")
    s = targets.add_parser("slurm", help="render an sbatch script (and submit it unless --dry-run)")
    _common(s)
    s.add_argument("--wait", action="store_true", help="sbatch --wait: return the job's exit code")
    s.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="extra #SBATCH line, e.g. --sbatch-arg=--reservation=moe (repeatable)")
    s.add_argument("--log", help="the job's --output file (default uccl-ep-NAME-%%j.out)")
    r = targets.add_parser("ray", help="run on a Ray cluster: placement group, one N-GPU slot per node")
    _common(r)
    r.add_argument("--address", help="Ray cluster: HEAD:PORT (the GCS: the driver runs here), or http://HEAD:8265 "
                                     "(the dashboard: submitted through Ray's job API); default $RAY_ADDRESS, else "
                                     "start a local cluster")
    r.add_argument("--ray-python", help="interpreter here that has Ray (default: this one, else the `ray` command's)")
    r.add_argument("--job-python", default="python",
                   help="with an http:// address: the interpreter on the cluster that runs the driver (default python)")
    r.add_argument("--placement-timeout", type=float, default=300.0, help="seconds to wait for the node slots")
    loc = targets.add_parser("local", help="run every node of the recipe as local processes")
    _common(loc)
    p.set_defaults(func=run)


def _load(args):
    from . import build_plan, load
    sets = list(args.overrides)
    for flag, key in (("nodes", "cluster.nodes"), ("image", "container.image"), ("python", "launch.python"),
                      ("timeout", "launch.timeout_s")):
        value = getattr(args, flag, None)
        if value is not None:
            sets.append(f"{key}={value}" if not isinstance(value, str) else f"{key}={_toml_str(value)}")
    recipe = load(args.recipe, sets, args.recipes_dir)
    return recipe, build_plan(recipe)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write(path: str | None, text: str, mode: int = 0o644) -> Path | None:
    if not path:
        return None
    p = Path(path)
    p.write_text(text)
    p.chmod(mode)
    return p


def _show(recipe, plan) -> int:
    from .frameworks import describe
    from .plan import argv_to_shell
    print(describe(recipe))
    print("\n# node 0 (head):\n" + argv_to_shell(plan.head_argv))
    if plan.worker_argv != plan.head_argv:
        print("\n# nodes 1..N-1:\n" + argv_to_shell(plan.worker_argv))
    return 0


def _slurm(args, recipe, plan) -> int:
    from .slurm import SlurmOptions, render_sbatch, submit
    script = render_sbatch(recipe, plan, SlurmOptions(output=args.log or "", extra_sbatch=tuple(args.sbatch_arg)))
    if args.dry_run:
        _write(args.output, script, 0o755)
        print(script)
        return 0
    path = _write(args.output or f"uccl-ep-{plan.name}.sbatch", script, 0o755)
    assert path is not None
    # NOTES: with --wait the CLI is bounded by the recipe's timeout plus queueing slack; the job's own
    # --time bounds it on the cluster side.
    code, job = submit(path, args.wait, timeout_s=plan.timeout_s + 600)
    print(f"[uccl-ep slurm] {path}: job {job}" + (f" exited with {code}" if args.wait else " submitted"))
    return code


def _ray(args, recipe, plan) -> int:
    from .ray_launch import DRIVER, PLAN_FILE, find_ray_python, is_job_address, run_driver, submit_job, write_job_dir
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    job_api = is_job_address(address)
    if args.dry_run:
        if args.output:
            write_job_dir(plan, args.output)
        d = args.output or "JOB_DIR"
        print(f"# Ray launch of {plan.name}: {plan.nodes} node(s) x {{GPU: {plan.gpus_per_node}}}, STRICT_SPREAD")
        print(f"# cluster: {address or '(start a local one)'}"
              + (" (Ray's job submission API)" if job_api else ""))
        from .plan import argv_to_shell
        print("# env of every node: " + " ".join(f"{k}={v}" for k, v in plan.env.items()))
        print("# node 0 (head):\n" + argv_to_shell(plan.head_argv))
        if plan.worker_argv != plan.head_argv:
            print("# nodes 1..N-1:\n" + argv_to_shell(plan.worker_argv))
        print(f"# job directory ({DRIVER} + {PLAN_FILE}): {d}"
              + ("" if args.output else "  (write it with -o DIR)"))
        if job_api:
            print(f"# one command: ray job submit --address {address} --working-dir {d} -- "
                  f"{args.job_python} {DRIVER} --plan {PLAN_FILE}")
        else:
            print(f"# one command: {find_ray_python_or_hint(args)} {d}/{DRIVER}"
                  + (f" --address {address}" if address else ""))
        return 0
    python = find_ray_python(args.ray_python)

    def go(job_dir: Path) -> int:
        if job_api:
            return submit_job(job_dir, python, address, args.job_python, plan.timeout_s, args.placement_timeout)
        return run_driver(job_dir, python, address, plan.timeout_s, args.placement_timeout)

    if args.output:
        return go(write_job_dir(plan, args.output))
    with tempfile.TemporaryDirectory(prefix="uccl-ep-ray-") as d:
        return go(write_job_dir(plan, d))


def find_ray_python_or_hint(args) -> str:
    from .errors import MissingDependency
    from .ray_launch import find_ray_python
    try:
        return find_ray_python(args.ray_python)
    except MissingDependency:
        return "python"


def _local(args, recipe, plan) -> int:
    from .local import local_commands, run_local
    from .plan import argv_to_shell, tok
    if args.dry_run:
        for rank, (argv, env) in enumerate(local_commands(plan, "127.0.0.1", plan.master_port)):
            extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            text = argv_to_shell([tok(a) for a in argv])
            print(f"# node {rank}\nenv {extra} \\\n  {text}")
        return 0
    return run_local(plan, plan.timeout_s)


def _list(args) -> int:
    from . import list_recipes, load_recipe
    rows = []
    for name, path in list_recipes(args.recipes_dir):
        r = load_recipe(path)
        rows.append((name, r.framework, r.platform, f"{r.cluster.nodes}x{r.cluster.gpus_per_node}", r.description))
    if not rows:
        print("no recipes found (looked in: --recipes-dir, $UCCL_EP_RECIPES_DIR, ./recipes, the shipped recipes)",
              file=sys.stderr)
        return 1
    width = max(len(r[0]) for r in rows)
    for name, fw, plat, shape, desc in rows:
        print(f"{name:<{width}}  {fw:<8} {plat:<12} {shape:<6} {desc}")
    return 0


def run(args) -> int:
    from .errors import DeployError
    try:
        if args.target == "list":
            return _list(args)
        recipe, plan = _load(args)
        handler = {"show": lambda: print(plan.to_json()) or 0 if args.plan else _show(recipe, plan),
                   "slurm": lambda: _slurm(args, recipe, plan), "ray": lambda: _ray(args, recipe, plan),
                   "local": lambda: _local(args, recipe, plan)}
        return handler[args.target]()
    except DeployError as e:
        print(f"uccl-ep launch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
