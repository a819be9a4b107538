"""Per-framework command lines: a validated ``Recipe`` becomes a ``Plan``.

How each framework goes multi-node (as its own multi-node documentation does it):

- bench, megatron, primus: ``torchrun`` (``python -m torch.distributed.run``) with a static
  rendezvous: ``--nnodes N --nproc-per-node G --node-rank R --master-addr HEAD --master-port P``.
- sglang: every node runs ``sglang.launch_server ... --dist-init-addr HEAD:P --nnodes N --node-rank R``.
- vllm: every node runs ``vllm serve`` in data-parallel mode; node 0 owns the DP RPC port, the
  others add ``--data-parallel-start-rank R*G --headless``.

Recipe ``[args]`` become flags in file order (``key = value`` -> ``--key value``; ``true`` ->
``--key``; ``false`` -> omitted; a list -> ``--key v1 v2``), then ``recipe.extra_args`` verbatim.
``[buffers]`` are translated into whatever the framework reads; a buffer field the framework has
no knob for is an error rather than silently ignored.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .errors import InvalidArgument
from .plan import MASTER_ADDR, MASTER_PORT, NODE_RANK, NodeVar, Plan, Token, tok
from .schema import Recipe

__all__ = ["build_plan", "flags_from_args"]


def flags_from_args(args: dict[str, Any]) -> list[Token]:
    out: list[Token] = []
    for key, value in args.items():
        flag = "--" + key
        if value is True:
            out.append(tok(flag))
        elif value is False:
            continue
        elif isinstance(value, list):
            out.append(tok(flag))
            out.extend(tok(_text(v)) for v in value)
        else:
            out.extend((tok(flag), tok(_text(value))))
    return out


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _reject_buffers(r: Recipe, supported: tuple[str, ...]) -> None:
    for name in ("nvl_mb", "rdma_mb", "ll_max_tokens_per_rank", "num_sms"):
        if getattr(r.buffers, name) and name not in supported:
            raise InvalidArgument(f"{r.source}: buffers.{name}",
                                  f"unset for framework {r.framework} (it has knobs only for "
                                  f"{', '.join(supported) or 'none of them'})", getattr(r.buffers, name))


def _torchrun(r: Recipe) -> list[Token]:
    return [tok(r.launch.python), tok("-m"), tok("torch.distributed.run"),
            tok("--nnodes"), tok(r.cluster.nodes), tok("--nproc-per-node"), tok(r.cluster.nproc),
            tok("--node-rank"), tok(NODE_RANK), tok("--master-addr"), tok(MASTER_ADDR),
            tok("--master-port"), tok(MASTER_PORT)]


def _bench(r: Recipe) -> tuple[list[Token], list[Token], dict[str, str]]:
    _reject_buffers(r, ("num_sms",))
    entry = [tok(e) for e in (r.launch.entry or ("-m", "uccl_ep.cli.main", "bench"))]
    argv = _torchrun(r) + entry + [tok("--dist"), tok("env")]
    if r.buffers.num_sms:
        argv += [tok("--num-sms"), tok(r.buffers.num_sms)]
    argv += flags_from_args(r.args) + [tok(a) for a in r.extra_args]
    return argv, argv, {}


def _trainer(sms_flag: str) -> Callable[[Recipe], tuple[list[Token], list[Token], dict[str, str]]]:
    """Megatron-Core and Primus: torchrun of the recipe's entry (script or -m module) + flags."""
    def build(r: Recipe) -> tuple[list[Token], list[Token], dict[str, str]]:
        _reject_buffers(r, ("num_sms",))
        argv = _torchrun(r) + [tok(e) for e in r.launch.entry]
        if r.buffers.num_sms:
            argv += [tok(sms_flag), tok(r.buffers.num_sms)]
        argv += flags_from_args(r.args) + [tok(a) for a in r.extra_args]
        return argv, argv, {}
    return build


def _sglang(r: Recipe) -> tuple[list[Token], list[Token], dict[str, str]]:
    _reject_buffers(r, ("ll_max_tokens_per_rank",))
    if not r.model:
        raise InvalidArgument(f"{r.source}: recipe.model", "a model path or hub id for sglang", r.model)
    argv = [tok(r.launch.python), tok("-m"), tok("sglang.launch_server"), tok("--model-path"), tok(r.model),
            tok("--dist-init-addr"), tok(MASTER_ADDR, ":", MASTER_PORT), tok("--nnodes"), tok(r.cluster.nodes),
            tok("--node-rank"), tok(NODE_RANK)]
    argv += flags_from_args(r.args) + [tok(a) for a in r.extra_args]
    env = {}
    if r.buffers.ll_max_tokens_per_rank:
        env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] = str(r.buffers.ll_max_tokens_per_rank)
    return argv, argv, env


def _vllm(r: Recipe) -> tuple[list[Token], list[Token], dict[str, str]]:
    _reject_buffers(r, ("nvl_mb",))
    if not r.model:
        raise InvalidArgument(f"{r.source}: recipe.model", "a model path or hub id for vllm", r.model)
    g = r.cluster.nproc
    common = [tok("vllm"), tok("serve"), tok(r.model), tok("--data-parallel-size"), tok(r.cluster.nodes * g),
              tok("--data-parallel-size-local"), tok(g), tok("--data-parallel-address"), tok(MASTER_ADDR),
              tok("--data-parallel-rpc-port"), tok(MASTER_PORT)]
    tail = flags_from_args(r.args) + [tok(a) for a in r.extra_args]
    head = common + tail
    worker = common + [tok("--data-parallel-start-rank"), tok(NodeVar("node_rank", g)), tok("--headless")] + tail
    env = {}
    if r.buffers.nvl_mb:
        env["VLLM_DEEPEP_BUFFER_SIZE_MB"] = str(r.buffers.nvl_mb)
    return head, worker, env


_BUILDERS: dict[str, Callable[[Recipe], tuple[list[Token], list[Token], dict[str, str]]]] = {
    "bench": _bench,
    "megatron": _trainer("--moe-flex-dispatcher-num-sms"),
    # NOTES: Primus' turbo DeepEP path reads its CU count from the experiment config; Primus takes
    # config overrides as flags after the config.
    "primus": _trainer("--turbo_deepep_num_cu"),
    "sglang": _sglang, "vllm": _vllm,
}


def build_plan(r: Recipe) -> Plan:
    head, worker, extra_env = _BUILDERS[r.framework](r)
    env = dict(r.env)
    for k, v in extra_env.items():
        if k in env and env[k] != v:
            raise InvalidArgument(f"{r.source}: env.{k}", f"unset or {v!r} (it is derived from [buffers])", env[k])
        env[k] = v
    return Plan(name=r.name, nodes=r.cluster.nodes, gpus_per_node=r.cluster.gpus_per_node,
                nproc_per_node=r.cluster.nproc, master_port=r.launch.master_port, timeout_s=r.launch.timeout_s,
                head_argv=head, worker_argv=worker, env=env, cpus_per_node=r.cluster.cpus_per_node,
                ready_port=r.launch.ready_port, source=r.source)


def describe(r: Recipe) -> str:
    """A JSON summary (for `uccl-ep launch show`)."""
    return json.dumps(r.as_dict(), indent=2, default=list)
