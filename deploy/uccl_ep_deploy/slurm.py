"""Render a plan as an sbatch script; optionally submit it.

Shape (the convention SGLang's, vLLM's and Megatron-Core's Slurm examples share): one task per node, the
head is the allocation's first node, its address comes from ``scontrol`` (``NodeAddr``, which
defaults to the node name on real clusters), node rank is ``$SLURM_NODEID``, and one ``srun``
starts the per-node command everywhere, inside a pyxis/enroot container when the recipe names one.

Bounds: ``--time`` caps the job; ``srun --kill-on-bad-exit=1`` ends every node when one fails, and
``--wait`` ends the others a bounded time after the first node exits.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument, MissingDependency, Timeout
from .plan import Plan, argv_to_shell
from .schema import Recipe

__all__ = ["SlurmOptions", "render_sbatch", "submit"]


@dataclass
class SlurmOptions:
    output: str = ""             # --output pattern; default uccl-ep-<name>-%j.out
    container_image: str = ""    # overrides recipe.container.image
    srun_wait_s: int = 120       # srun --wait: how long the other nodes may outlive the first to exit
    extra_sbatch: tuple[str, ...] = ()


def _q(s: str) -> str:
    return shlex.quote(s)


def render_sbatch(recipe: Recipe, plan: Plan, opts: SlurmOptions | None = None) -> str:
    opts = opts or SlurmOptions()
    c = recipe.cluster
    image = opts.container_image or recipe.container.image
    out = opts.output or f"uccl-ep-{plan.name}-%j.out"
    lines = [
        "#!/bin/bash",
        f"# Rendered by `uccl-ep launch slurm` from {recipe.source or plan.name}: {recipe.description}",
        "# Re-render instead of editing; `uccl-ep launch slurm RECIPE --dry-run` prints this script.",
        f"#SBATCH --job-name=uccl-ep-{plan.name}",
        f"#SBATCH --nodes={plan.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if c.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    if c.exclusive:
        lines.append("#SBATCH --exclusive")
    lines.append(f"#SBATCH --time={c.time_limit}")
    if c.partition:
        lines.append(f"#SBATCH --partition={c.partition}")
    if c.account:
        lines.append(f"#SBATCH --account={c.account}")
    lines.append(f"#SBATCH --output={out}")
    lines += [f"#SBATCH {x}" for x in opts.extra_sbatch]
    lines += ["", "set -euo pipefail", ""]
    if plan.env:
        lines.append("# Environment of every node: the platform's NIC profile and the recipe's own settings.")
        lines += [f"export {k}={_q(v)}" for k, v in plan.env.items()]
        lines.append("")
    lines += [
        f'if [ "${{SLURM_JOB_NUM_NODES:-0}}" -ne {plan.nodes} ]; then',
        f'  echo "[uccl-ep] this recipe needs exactly {plan.nodes} node(s), the job has ${{SLURM_JOB_NUM_NODES:-?}}" >&2',
        "  exit 2",
        "fi",
        "# Rendezvous: the first node of the allocation is the head.",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# NOTES: NodeAddr is the address the nodes use for each other; it defaults to the node name.",
        "MASTER_ADDR=$(scontrol show node \"$HEAD_NODE\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' | head -n 1)",
        'export MASTER_ADDR=${MASTER_ADDR:-$HEAD_NODE}',
        f"export MASTER_PORT={plan.master_port} NNODES={plan.nodes}",
        'echo "[uccl-ep] job ${SLURM_JOB_ID}: ${NNODES} node(s), head ${HEAD_NODE} at ${MASTER_ADDR}:${MASTER_PORT}"',
        "",
        "# What each node runs; NODE_RANK comes from Slurm on the node itself.",
        "read -r -d '' NODE_SCRIPT <<'UCCL_EP_NODE' || true",
        "export NODE_RANK=${SLURM_NODEID}",
        'echo "[uccl-ep] node ${NODE_RANK}/${NNODES} ${SLURMD_NODENAME:-$(hostname)} starting"',
    ]
    head_cmd = argv_to_shell(plan.head_argv)
    worker_cmd = argv_to_shell(plan.worker_argv)
    if head_cmd == worker_cmd:
        lines.append("exec " + head_cmd)
    else:
        lines += ['if [ "$NODE_RANK" -eq 0 ]; then', "  exec " + head_cmd.replace("\n", "\n  "), "else",
                  "  exec " + worker_cmd.replace("\n", "\n  "), "fi"]
    lines += ["UCCL_EP_NODE", ""]
    srun = [f"srun --nodes={plan.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --wait={opts.srun_wait_s}"]
    if image:
        srun.append(f"  --container-image={_q(image)}")
        if recipe.container.mounts:
            srun.append(f"  --container-mounts={_q(','.join(recipe.container.mounts))}")
        if recipe.container.workdir:
            srun.append(f"  --container-workdir={_q(recipe.container.workdir)}")
    srun.append('  bash -c "$NODE_SCRIPT" &')
    lines.append(" \\\n".join(srun))
    lines.append("SRUN_PID=$!")
    if plan.ready_port:
        lines += [
            "# Servers: report when the head's port answers (bounded by the job's time limit).",
            f'until (exec 3<>"/dev/tcp/$MASTER_ADDR/{plan.ready_port}") 2>/dev/null; do',
            '  kill -0 "$SRUN_PID" 2>/dev/null || break',
            "  sleep 10",
            "done",
            f'kill -0 "$SRUN_PID" 2>/dev/null && echo "[uccl-ep] ready: http://$MASTER_ADDR:{plan.ready_port}"',
        ]
    lines += ['wait "$SRUN_PID"', ""]
    return "\n".join(lines)


def submit(script_path: Path, wait: bool, timeout_s: float) -> tuple[int, str]:
    """``sbatch --parsable [--wait] SCRIPT``; returns (exit code, job id).

    With ``wait``, the job is bounded by ``timeout_s`` too: past it the job is cancelled and
    ``Timeout`` is raised (the job's own ``--time`` is the other bound).
    """
    import shutil
    import time
    if shutil.which("sbatch") is None:
        raise MissingDependency("`sbatch` is not on PATH: run on a Slurm login node, or use --dry-run")
    cmd = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + [str(script_path)]
    import selectors
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    # NOTES: --parsable prints the job id as soon as the job is queued, long before --wait returns;
    # the read is bounded too, in case the controller never answers.
    job_id = ""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout=min(timeout_s, 300.0)):
            job_id = proc.stdout.readline().strip().split(";")[0]
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
        raise Timeout(f"slurm job {job_id or '?'} (cancelled)", timeout_s)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0 and not job_id:
        raise InvalidArgument("sbatch", "a submitted job", err.strip() or f"exit code {proc.returncode}")
    return proc.returncode, job_id
