"""Train a small MoE GPT with Megatron-Core's public API; report per-step loss and tokens/s as JSON.

    torchrun --nproc-per-node 2 train_moe_gpt.py --moe-token-dispatcher-type flex \\
        --moe-flex-dispatcher-backend uccl [--output-json run.json] [Megatron flags...]

Megatron's own parser reads the command line (parse_args + validate_args), so
``--moe-flex-dispatcher-backend uccl`` and the ``--uccl-*`` flags go through the same path as in
``pretrain_gpt.py``; the hook is installed by the first import below. Defaults describe a small
model (4 layers, hidden 512, 8 experts top-2, EP = world size, bf16, 20 steps); any Megatron flag
overrides them (``--precision fp32`` drops ``--bf16``; Megatron's fp16/bf16 optimizer is CUDA-only). The model is `GPTModel` with the local (non-TransformerEngine) layer spec and
MoE layers; training uses Megatron's DistributedDataParallel, its optimizer and its
forward-backward schedule.

Mock data: each sample is an arithmetic token sequence ``(a + k*d) mod V`` with random start
``a`` and stride ``d``, drawn from a generator seeded by (seed, step, micro-batch, DP rank), so
two runs with the same flags see the same tokens and the loss has something to learn.

Output: one JSON line per step on rank 0 (``{"step", "loss", "step_time_s", "tokens_per_s"}``)
and, with ``--output-json``, a summary ``{"config", "steps": [...], "tokens_per_s"}`` where
tokens/s is the mean over steps after the first ``--warmup-steps``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional, Sequence

import uccl_ep_megatron  # noqa: F401  (the one-line hook; `install()` below makes it explicit)

DEFAULTS = [
    "--num-layers", "4", "--hidden-size", "512", "--ffn-hidden-size", "1024", "--num-attention-heads", "8",
    "--seq-length", "256", "--max-position-embeddings", "256", "--vocab-size", "1024",
    "--micro-batch-size", "4", "--global-batch-size", "16", "--train-iters", "20",
    "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "512", "--moe-router-dtype", "fp32",
    "--lr", "3e-4", "--min-lr", "3e-4", "--weight-decay", "0.0",
    "--clip-grad", "1.0", "--seed", "1234",
    "--transformer-impl", "local", "--attention-backend", "unfused", "--no-persist-layer-norm",
    "--no-masked-softmax-fusion", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion",
    "--no-gradient-accumulation-fusion", "--disable-bias-linear", "--attention-dropout", "0",
    "--hidden-dropout", "0", "--no-rope-fusion", "--position-embedding-type", "rope",
]


def _extra_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="train_moe_gpt")
    group.add_argument("--output-json", default=None, help="write the run summary here (rank 0)")
    group.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the tokens/s mean")
    group.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                       help="cpu = gloo and CPU tensors (a functional check; needs CUDA shims, see tests)")
    group.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                       help="bf16 (Megatron --bf16: bf16 params, fp32 main grads) or fp32")
    return parser


def _script_options(argv: Sequence[str]) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default="cuda")
    pre.add_argument("--precision", default="bf16")
    return pre.parse_known_args(list(argv))[0]


def _merge_defaults(argv: Sequence[str]) -> list[str]:
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    merged, i = [], 0
    while i < len(DEFAULTS):
        flag = DEFAULTS[i]
        has_value = i + 1 < len(DEFAULTS) and not DEFAULTS[i + 1].startswith("--")
        if flag not in given:
            merged += DEFAULTS[i:i + 2] if has_value else [flag]
        i += 2 if has_value else 1
    return merged + list(argv)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Megatron's parse_args + validate_args over DEFAULTS + argv (argv wins)."""
    from megatron.training import arguments

    uccl_ep_megatron.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    saved = sys.argv
    precision = ["--bf16"] if _script_options(argv).precision == "bf16" and "--bf16" not in argv else []
    sys.argv = [saved[0] if saved else "train_moe_gpt.py", *_merge_defaults(argv), *precision]
    try:
        args = arguments.parse_args(extra_args_provider=_extra_args)
    finally:
        sys.argv = saved
    args.expert_model_parallel_size = args.expert_model_parallel_size if "--expert-model-parallel-size" in argv \
        else int(os.environ.get("WORLD_SIZE", "1"))
    args.use_cpu_initialization = args.use_cpu_initialization or args.device == "cpu"
    arguments.validate_args(args)
    # NOTES: no tokenizer here (mock tokens), so the vocabulary is used as given (a multiple of 128).
    args.padded_vocab_size = args.vocab_size
    return args


def init_distributed(args) -> None:
    import torch
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tensor_model_parallel_size,
                                 expert_model_parallel_size=args.expert_model_parallel_size)


def build(args, with_optimizer: bool = True):
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.training.arguments import core_transformer_config_from_args

    torch.manual_seed(args.seed)
    if args.device == "cuda":
        model_parallel_cuda_manual_seed(args.seed)
    config = core_transformer_config_from_args(args)
    spec = get_gpt_layer_local_spec(num_experts=args.num_experts, moe_grouped_gemm=args.moe_grouped_gemm)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                     max_sequence_length=args.max_position_embeddings,
                     position_embedding_type=args.position_embedding_type)
    if args.device == "cuda":
        model = model.cuda()
    if args.bf16 or args.fp16:
        model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    if not with_optimizer:
        return config, model, None
    opt_config = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                                 bf16=args.bf16, fp16=args.fp16, params_dtype=config.params_dtype,
                                 clip_grad=args.clip_grad, use_distributed_optimizer=False)
    optimizer = get_megatron_optimizer(opt_config, [model])
    return config, model, optimizer


def mock_batch(args, step: int, micro: int, device):
    """Arithmetic token sequences: tokens, labels, loss mask, positions, causal mask."""
    import torch
    from megatron.core import parallel_state as ps

    vocab, seq, mbs = args.padded_vocab_size, args.seq_length, args.micro_batch_size
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + micro * 31 + ps.get_data_parallel_rank())
    start = torch.randint(0, vocab, (mbs, 1), generator=gen)
    stride = torch.randint(1, 8, (mbs, 1), generator=gen)
    seqs = (start + stride * torch.arange(seq + 1)) % vocab
    tokens, labels = seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
    positions = torch.arange(seq).unsqueeze(0).expand(mbs, -1).contiguous()
    causal = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
    to = lambda t: t.to(device)  # noqa: E731
    return to(tokens), to(labels), to(torch.ones(mbs, seq)), to(positions), to(causal)


def micro_batches(args, step: int, device) -> list:
    from megatron.core import parallel_state as ps

    num_micro = args.global_batch_size // (args.micro_batch_size * ps.get_data_parallel_world_size())
    return [mock_batch(args, step, m, device) for m in range(num_micro)]


def forward_backward(args, config, model, batches: list) -> list:
    """One global batch (`micro_batches`) through Megatron's forward-backward schedule (the
    EP-overlap 1F1B one with --overlap-moe-expert-parallel-comm); grads land in the DDP buffers.
    -> per-micro-batch loss dicts."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync

    def forward_step(data_iterator, model_chunk, return_schedule_plan=False):
        tokens, labels, loss_mask, positions, causal = next(data_iterator)
        # NOTES: --overlap-moe-expert-parallel-comm runs Megatron's combined 1F1B schedule,
        # which asks for the model's schedule plan instead of its output (as pretrain_gpt does).
        per_token = (model_chunk.build_schedule_plan(tokens, positions, causal, labels=labels)
                     if return_schedule_plan else model_chunk(tokens, positions, causal, labels=labels))

        def loss_func(output):
            loss = (output.float() * loss_mask).sum() / loss_mask.sum()
            # NOTES: clone: the schedule divides the returned loss in place by the micro-batch count.
            return loss, {"lm loss": loss.detach().clone()}

        return per_token, loss_func

    model.zero_grad_buffer()
    return get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                                       num_microbatches=len(batches), seq_length=args.seq_length,
                                       micro_batch_size=args.micro_batch_size, forward_only=False)


def train(args, config, model, optimizer) -> list[dict]:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    tokens_per_step = args.global_batch_size * args.seq_length
    records = []
    for step in range(1, args.train_iters + 1):
        batches = micro_batches(args, step, device)
        if args.device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        optimizer.zero_grad()
        losses = forward_backward(args, config, model, batches)
        ok, grad_norm, _ = optimizer.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        loss = torch.stack([x["lm loss"].float() for x in losses]).mean()
        dist.all_reduce(loss, group=ps.get_data_parallel_group())
        loss = float(loss) / ps.get_data_parallel_world_size()
        record = {"step": step, "loss": loss, "grad_norm": None if grad_norm is None else float(grad_norm),
                  "step_time_s": elapsed, "tokens_per_s": tokens_per_step / elapsed, "update_ok": bool(ok)}
        records.append(record)
        if dist.get_rank() == 0:
            print(json.dumps(record), flush=True)
    return records


def summarize(args, records: list[dict]) -> dict:
    timed = records[args.warmup_steps:] or records
    dispatcher = args.moe_token_dispatcher_type
    if dispatcher == "flex":
        dispatcher += "/" + args.moe_flex_dispatcher_backend
    return {
        "config": {"dispatcher": dispatcher, "world_size": args.world_size, "ep": args.expert_model_parallel_size,
                   "num_layers": args.num_layers, "hidden": args.hidden_size, "experts": args.num_experts,
                   "topk": args.moe_router_topk, "seq_length": args.seq_length,
                   "global_batch_size": args.global_batch_size, "bf16": bool(args.bf16), "device": args.device,
                   "uccl": uccl_ep_megatron.current().buffer_kwargs()},
        "steps": records,
        "losses": [r["loss"] for r in records],
        "tokens_per_s": sum(r["tokens_per_s"] for r in timed) / len(timed),
    }


def main(argv: Optional[Sequence[str]] = None) -> dict:
    import torch.distributed as dist

    args = parse(argv)
    init_distributed(args)
    config, model, optimizer = build(args)
    records = train(args, config, model, optimizer)
    summary = summarize(args, records)
    if dist.get_rank() == 0 and args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
