"""The one registry of environment variables read by uccl_ep.

Rules (see docs/env.md, generated from this file by ``python -m uccl_ep.env``):
- every variable uccl_ep reads is declared here, typed, with its default and meaning;
- values are parsed by typed parsers that reject bad input with ``InvalidArgument`` naming the
  variable (no silent ``atoi``-style zero);
- uccl_ep never writes ``os.environ``;
- an env var only overrides a default: every knob is also a constructor/CLI argument.

Usage::

    from uccl_ep import env
    env.get("UCCL_EP_TIMEOUT_S")        # typed value (env value or default)
    env.is_set("UCCL_EP_BACKEND")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidArgument

__all__ = ["Var", "REGISTRY", "get", "is_set", "snapshot", "render_markdown", "shared_values",
           "require_same_across_ranks"]


@dataclass(frozen=True)
class Var:
    name: str
    kind: str  # "bool" | "int" | "float" | "str" | "choice"
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    used_by: str = ""

    def parse(self, raw: str) -> Any:
        text = raw.strip()
        if self.kind == "bool":
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise InvalidArgument(self.name, "a boolean (1/0, true/false, yes/no, on/off)", repr(raw))
        if self.kind == "int":
            try:
                value: Any = int(text, 0)
            except ValueError:
                raise InvalidArgument(self.name, "an integer", repr(raw)) from None
        elif self.kind == "float":
            try:
                value = float(text)
            except ValueError:
                raise InvalidArgument(self.name, "a number", repr(raw)) from None
        elif self.kind == "choice":
            if text not in self.choices:
                raise InvalidArgument(self.name, f"one of {', '.join(self.choices)}", repr(raw))
            return text
        else:
            return text
        if self.minimum is not None and value < self.minimum:
            raise InvalidArgument(self.name, f"a value >= {self.minimum}", repr(raw))
        if self.maximum is not None and value > self.maximum:
            raise InvalidArgument(self.name, f"a value <= {self.maximum}", repr(raw))
        return value


_VARS: list[Var] = [
    Var("UCCL_EP_BACKEND", "choice", "auto",
        "Executor behind `uccl_ep.Buffer` when the constructor says `backend=\"auto\"`: "
        "`reference` (pure torch over torch.distributed), `host` (CPU threads through the proxy), "
        "`cuda` (GPU kernels). `auto` picks the fastest one available for the tensors' device; GPU tensors "
        "never get a CPU executor, and when `auto` cannot give them `cuda` it warns once (reason and fix, "
        "`uccl-ep doctor`). A named backend that cannot serve a Buffer is an error, never a fallback.",
        choices=("auto", "reference", "host", "cuda"), used_by="Buffer"),
    Var("UCCL_EP_TIMEOUT_S", "float", 100.0,
        "Bound of every host-side wait (CPU spin on counters, proxy drain, bootstrap); on expiry "
        "a `uccl_ep.errors.Timeout` names rank, peer and phase. Constructor argument `timeout_s`.",
        minimum=0.001, used_by="Buffer, proxy, bootstrap"),
    Var("UCCL_EP_GPU_TIMEOUT_S", "float", 100.0,
        "Bound of every device-side spin; the kernel writes an error word and exits, the host "
        "raises `Timeout`. Constructor argument `gpu_timeout_s`.",
        minimum=0.001, used_by="CUDA kernels"),
    Var("UCCL_EP_RANKS_PER_NODE", "int", 0,
        "Ranks per node (NVLink domain) in the group. 0 = detect from host names. Lets the GPUs of "
        "one host act as several nodes (2 GPUs as 2 nodes: set 1; 4 GPUs as 2 x 2: set 2) to run the "
        "internode protocol through the proxy; low-latency mode then runs hybrid (a node's peers over "
        "NVLink, the other nodes through the proxy).",
        minimum=0, used_by="Buffer topology"),
    Var("UCCL_EP_NUM_PROXY_THREADS", "int", 4,
        "CPU proxy threads per local rank; thread i talks only to thread i of each peer.",
        minimum=1, used_by="proxy"),
    Var("UCCL_EP_PROXY_IDLE_SLEEP_US", "str", "auto",
        "Longest sleep of an idle proxy thread, in microseconds (0 = spin and yield, never sleep). "
        "`spin`: spin only, never yield the core (dedicated cores). "
        "`auto`: 0 on hosts with >= 16 CPUs, 50 on smaller ones (CI).",
        used_by="proxy"),
    Var("UCCL_EP_PROXY_WRITE_KB", "int", 16383,
        "Largest Write the low-latency proxy path pushes, in KiB (1..16383; a 16-byte command carries "
        "24 bits of length). Each (op, peer) region goes out as ceil(bytes / this) Writes. Every rank must "
        "use the same value (checked when a Buffer is built).",
        minimum=1, maximum=16383, used_by="cuda"),
    Var("UCCL_EP_TRANSPORT", "choice", "auto",
        "Proxy transport: `fabric` (libfabric RDM), `ipc` (same-host peer copies), `ipc+fabric` (ipc to the "
        "ranks of this node, fabric to the others), `loop` (in-process, tests). `auto`: host executor loop on one "
        "host, fabric across hosts; cuda backend ipc on one host, and across hosts only with `fabric` or "
        "`ipc+fabric` set (both mean ipc+fabric there: GPU memory registered for the NIC, FI_HMEM).",
        choices=("auto", "fabric", "ipc", "ipc+fabric", "loop"), used_by="proxy"),
    Var("UCCL_EP_FABRIC_DOMAINS", "str", "auto",
        "NICs (libfabric domains) of the `fabric` transport; proxy thread i of a rank uses entry i % n, so a "
        "GPU's threads stripe over its NICs and their line rates add up. `auto`: each GPU's nearest NICs by the "
        "PCI topology (sysfs: same PCIe switch, then root port, host bridge, NUMA node), NICs that several GPUs "
        "find equally near divided among them (p5en: 2 of the 4 EFA devices behind a GPU pair's switch each; "
        "p6-b200 and MI300X hosts: 1 each); the provider's first NIC where nothing can be told (no GPU, no PCI "
        "addresses). `first`: the provider's first NIC for every thread. Else NIC names, comma-separated, e.g. "
        "`rdmap79s0-rdm,rdmap80s0-rdm`, or one list per local rank separated by `;` (local rank L takes list "
        "L mod n). `uccl-ep doctor` shows each GPU's choice.",
        used_by="proxy"),
    Var("UCCL_EP_FABRIC_PROVIDER", "str", "",
        "libfabric provider for the `fabric` transport, e.g. `efa`, `verbs;ofi_rxm`, "
        "`tcp;ofi_rxm`. Empty = first available of efa, verbs;ofi_rxm, tcp;ofi_rxm.",
        used_by="fabric transport"),
    Var("UCCL_EP_MAX_INFLIGHT", "int", 256,
        "Most transfers one proxy thread keeps in flight per peer (back-pressure for NICs with "
        "small queues, e.g. Thor-2 and Pollara want 16-64).",
        minimum=1, used_by="proxy"),
    Var("UCCL_EP_IPC_COPY", "choice", "kernel",
        "How the `ipc` transport moves the low-latency proxy path's Writes between GPUs of one host (the "
        "stand-in for a NIC there): `kernel`: the proxy writes a descriptor into a ring in host memory and a "
        "copy kernel of the sender, launched after each send kernel, executes it over NVLink (no CUDA call "
        "on the proxy thread, like a NIC's DMA engine); `cuda`: the proxy thread calls cuMemcpyDtoDAsync "
        "per Write (can wait inside the driver behind the application thread: ms per op).",
        choices=("kernel", "cuda"), used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_IPC_COPY_BLOCKS", "int", 16,
        "Blocks of the `ipc` copy kernel (UCCL_EP_IPC_COPY=kernel) per proxy thread's descriptor ring "
        "(512 threads each); groups whose ring has nothing to copy leave at once (2 x H200, 128 tokens: "
        "graph D+C 106.4 / 106.4 / 106.5 us with 16, 105.6 / 107.1 with 8, 114.1 with 32; 16 copies 0.5-1 us "
        "faster per op).",
        minimum=1, maximum=64, used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_FORCE_PROXY", "bool", False,
        "Send same-host GPU peers' traffic through the CPU proxy instead of NVLink stores, so the "
        "whole GPU -> queue -> proxy -> transport -> counter path runs on one host.",
        used_by="CUDA kernels"),
    Var("UCCL_EP_LL_COMBINE_RECV_THREADS", "int", 512,
        "Threads per block of the low-latency combine's receive kernel over NVLink (one block per token; a multiple "
        "of 32). Its loads of the top-k rows are what it waits on, so more threads keep more of them in "
        "flight (2 x H200, 128 tokens: CUDA-graph D+C 73.3 / 70.0 / 68.3 us at 128 / 256 / 512 threads; "
        "flat at 512 tokens). A tuning switch, read when a Buffer first runs a low-latency op; ranks may differ.",
        minimum=32, maximum=512, used_by="CUDA kernels (low-latency mode)"),
    Var("UCCL_EP_LL_OWN_ROWS_IN_Y", "bool", True,
        "LL proxy-path combine without a receive hook: leave the rank's own rows in the caller's tensor "
        "(the receive kernel, which follows on the stream, reads them there as in zero copy) instead of "
        "staging them (2 x H200, graph D+C: 113.4 / 114.5 vs 119.9 / 121.3 us at 128 tokens, 260.6 vs "
        "276.3 at 512). 0 stages them as behind a hook.",
        used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_LL_PROXY_PARTS", "int", 1,
        "Most parts an LL proxy-path op's region towards a peer is spread over, each part through another "
        "proxy thread (so another copy ring and receiving thread) with its own fenced Atomic; parts of at "
        "least 256 KiB, at most one per proxy thread. An experiment switch (1: one part), not yet measured on "
        "a GPU. Every rank must use the same value (checked when a Buffer is built).",
        minimum=1, maximum=8, used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_LL_COPY_OVERLAP", "bool", False,
        "Launch the LL proxy path's copy kernel (UCCL_EP_IPC_COPY=kernel) with programmatic dependent launch "
        "(sm_90+), so it polls its descriptor ring while the send kernel still runs. An experiment switch, off "
        "by default: on 2 x H200 graph D+C at 128 tokens is 111.7 / 111.8 us with it vs 106.0 / 106.4 without "
        "(push -> descriptor seen 5.2-5.7 vs 7.8-8.2 us, yet slower; docs/benchmarks.md).",
        used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_LL_STAGE_SPLIT", "int", 4,
        "LL proxy-path combine send: most warps that stage one row into the send region (each a contiguous "
        "share), used when the grid has that many warps per row to spare. 1: a warp per row (2 x H200, 128 "
        "tokens: combine send 16.3-17.4 -> 13.3 us with 4, graph D+C 114.9 / 116.8 -> 112.9 / 112.9 us).",
        minimum=1, maximum=16, used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_LL_PUSH_FENCE", "choice", "auto",
        "LL proxy-path send kernels: the system fence before an op's pushes. `auto`: only where a NIC or the "
        "proxy's driver copies read the staged bytes (not with UCCL_EP_IPC_COPY=kernel, whose copy kernel "
        "reads them after the send kernel on the stream); `system`: always (the earlier behaviour, for "
        "comparison; 2 x H200 graph D+C at 128 tokens 116.2 / 116.3 vs 114.9 / 116.8 us without it).",
        choices=("auto", "system"), used_by="CUDA kernels (low-latency proxy path)"),
    Var("UCCL_EP_LL_PDL", "bool", True,
        "Launch the low-latency receive kernels over NVLink with programmatic dependent launch (sm_90+), so they "
        "start while the send kernel's last blocks run instead of after it; they synchronize with it through "
        "flags in memory anyway, and wait for it to complete before they do. Only when the receive phase "
        "follows the send directly (not through a return_recv_hook). Off: plain stream order. On the proxy "
        "path (UCCL_EP_IPC_COPY=kernel) the same for the receive kernels after their copy kernel (2 x H200, "
        "128 tokens: graph D+C 99.5 / 99.4 us vs 104.8 / 104.1 off). Read when a Buffer first runs a "
        "low-latency op.",
        used_by="CUDA kernels (low-latency mode)"),
    Var("UCCL_EP_HT_WARPS", "int", 16,
        "Warps per block of the cuda backend's normal (HT) intranode kernels: "
        "each rank's share is warps / ranks. More warps keep more bytes in flight per SM. Read when "
        "a Buffer first runs a normal-mode op; every rank of a group must use the same value (a Buffer whose "
        "ranks differ is refused when it is built).",
        minimum=8, maximum=32, used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_COMBINE_WARPS", "int", 16,
        "Warps per block of the HT intranode combine kernel (0: UCCL_EP_HT_WARPS). Its receivers are "
        "bound by loads in flight; on sm_80+ they stage rows through shared memory by cp.async (1 KiB "
        "per warp per stage and vector of unroll), which 16 warps fill best (2 x H200: 332 GB/s; 20 "
        "warps 280, 24 warps 215; without staging 24 warps were best at 310). Both kernels use the same "
        "rings and per-warp counters, which only grow, so a counter one kernel leaves unused is never "
        "ahead of the other's positions.",
        minimum=0, maximum=32, used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_COMBINE_CE", "bool", True,
        "HT intranode combine with the copy engines moving the rows (ht/nvlink/combine_ce.cu): x's rows "
        "from each source rank are one contiguous run, so they go back in R - 1 plain copies on a side "
        "stream while every SM of the combine sums (2 x H200, EP2: 415 GB/s at 12 SMs vs 192 with the "
        "ring combine; 466 vs 349 at 24). Needs the row counts of a non-cached dispatch (num_worst_tokens "
        "handles keep the ring combine) and a staging buffer per rank beside the NVL buffer: (ranks - 1) "
        "x the largest per-pair token count x (hidden x 2 + top-k x 4) bytes (EP2, 4096 tokens, hidden "
        "7168: 59 MB). 0: the ring combine. Every rank must use the same value (checked when a Buffer "
        "is built).",
        used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_DISPATCH_CE", "choice", "auto",
        "HT intranode dispatch with the receiver's copy engines (ht/nvlink/dispatch_ce.cu): the SMs copy "
        "each row once (own rows into recv_x, peers' rows into the peer's staging buffer) and the "
        "receiving rank's copy engines move each source's run into recv_x, chunk by chunk after a "
        "bounded one-thread wait for the chunk's flag. auto: at EP2 for calls whose Config has <= 12 "
        "SMs (2 x H200, 12 SMs: 416.8 GB/s BF16 vs the ring's 269.2; 24 SMs: 441.5 vs 479.6; not yet "
        "measured at EP4 / EP8, which keep the ring); 1: every call; 0: never. Needs UCCL_EP_HT_COMBINE_CE (same staging buffer, grown by the dispatch "
        "regions, ~the combine's size again) and handles with host counts. Every rank must use the "
        "same value.",
        choices=("auto", "1", "0"), used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_CE_CHUNK_KB", "int", 8192,
        "KiB of rows per copy-engine chunk of the copy-engine HT ops (UCCL_EP_HT_COMBINE_CE / "
        "_DISPATCH_CE): each chunk has its own flag, so the receiver starts on a chunk as soon as it "
        "landed; smaller chunks start earlier, each costs a flag and (dispatch) a wait + copy step (2 x "
        "H200, EP2, 12 SMs: dispatch 416.8 / combine 393.5 GB/s at 8 MiB, 399.8 / 371.1 at 4 MiB). At "
        "most 128 chunks per region (larger chunks then). Every rank must use the same value.",
        minimum=64, used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_COMBINE_CE_MAX_MB", "int", 2048,
        "Most MiB of the copy-engine combine's staging buffer per rank (UCCL_EP_HT_COMBINE_CE); a "
        "dispatch whose token counts need more keeps the ring combine for its handle (every rank "
        "decides alike from the same counts).",
        minimum=1, used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_HT_DEFINES", "str", "",
        "Extra compile-time settings of the `default` HT intranode kernels, space-separated NAME=VALUE "
        "(names in core/kernels/include/uccl_ep/device/ht_tuning.cuh, e.g. "
        "`UCCL_EP_HT_PUBLISH_EVERY=8 UCCL_EP_HT_RELAXED_HEAD=1`). A tuning experiment switch: every "
        "rank must use the same values, and a setting that wins becomes the header's default.",
        used_by="CUDA kernels (normal mode)"),
    Var("UCCL_EP_JIT_CACHE_DIR", "str", "~/.cache/uccl_ep/jit",
        "Where JIT-compiled kernels are cached (keyed by a hash of sources, headers, flags, arch "
        "and compiler version; published by atomic rename, safe on shared file systems).",
        used_by="JIT"),
    Var("UCCL_EP_CUDA_ARCH", "str", "",
        "Target arch for the JIT, e.g. `sm_90a`, `sm_100a`, or `gfx942` / `gfx950` on AMD. Empty = the "
        "current device's.", used_by="JIT"),
    Var("UCCL_EP_NVCC", "str", "",
        "Path of nvcc. Empty = `$CUDA_HOME/bin/nvcc`, then `nvcc` on PATH, then the "
        "`nvidia-cuda-nvcc` pip package.", used_by="JIT"),
    Var("UCCL_EP_HIPCC", "str", "",
        "Path of the HIP compiler for AMD GPUs (hipcc, or a clang with the AMDGPU backend and HIP headers). "
        "Empty = `$ROCM_PATH/bin/hipcc` (`$HIP_PATH`), then `/opt/rocm/bin/hipcc`, then `hipcc` on PATH.",
        used_by="JIT"),
    Var("UCCL_EP_JOB_TOKEN", "str", "",
        "Per-job secret: at bootstrap every rank proves it holds it (HMAC-SHA256 over fresh nonces and "
        "its endpoint record), so a rank without it is refused with PeerProtocolError. Empty = a random "
        "session string rank 0 writes into the store: it separates jobs and sessions but authenticates "
        "nothing (docs/troubleshooting.md, \"Job token\").", used_by="bootstrap"),
    Var("UCCL_EP_FAULT", "str", "",
        "Fault injection around the proxy transport, for tests: comma-separated `reorder=<p>` (probability a "
        "write or completion is held back and reordered), `delay=<polls>` (longest hold), `tear=<p>` "
        "(probability a write is split into pieces landing in random order), `pieces=<n>`, `seed=<n>`. "
        "Empty = off. Never drops or duplicates completions.", used_by="proxy"),
    Var("UCCL_EP_NIC_MODEL", "str", "",
        "A NIC model around the proxy transport's traffic to other nodes, to see what the proxy protocols reach "
        "against a line rate on machines without that NIC: a preset (`efa-400g`: 50 GB/s, 10 us, reordered "
        "like EFA's SRD over a 10 us window; `efa-200g`: 25 GB/s, same; `cx7-400g`: 50 GB/s, 3 us, in order), "
        "comma-separated `bw=<bytes/s>`, `lat_us=<us>`, `reorder=<p>`, `window_us=<us>`, `nics=<n>` (NICs per "
        "rank, proxy threads striped over them), `seed=<n>`, or a preset followed by overrides "
        "(`efa-200g,nics=2` for a p5en GPU). Empty or `off` = no model. `uccl-ep bench --nic-model` sets it.",
        used_by="proxy"),
    Var("UCCL_EP_LOG_LEVEL", "choice", "warning",
        "Level of the `uccl_ep` logger (standard `logging`; the framework plugins log below it as "
        "`uccl_ep.sglang`, `uccl_ep.vllm`, ...). Unset: `warning`, records go to the application's logging "
        "setup. Set: uccl_ep also prints its records to stderr itself (once, not through the root logger).",
        choices=("debug", "info", "warning", "error"), used_by="logging"),
    Var("UCCL_EP_SGLANG", "bool", False,
        "Run SGLang's DeepEP dispatcher on uccl_ep in this process. Set to 1 by the uccl-ep-sglang "
        "plugin when `--moe-a2a-backend uccl` is resolved (scheduler processes inherit it); setting "
        "it by hand with `--moe-a2a-backend deepep` selects uccl_ep the same way.",
        used_by="uccl-ep-sglang plugin"),
    Var("UCCL_EP_VLLM", "bool", False,
        "Make `deep_ep` mean uccl_ep for vLLM's DeepEP managers and prepare/finalize classes in this "
        "process. Set to 1 by the uccl-ep-vllm plugin when `--all2all-backend uccl_*` is chosen "
        "(engine-core and worker processes inherit it; it is added to VLLM_RAY_EXTRA_ENV_VARS_TO_COPY "
        "for Ray); setting it by hand with `--all2all-backend deepep_*` selects uccl_ep the same way.",
        used_by="uccl-ep-vllm plugin"),
]

REGISTRY: Mapping[str, Var] = {v.name: v for v in _VARS}


def _lookup(name: str) -> Var:
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidArgument("name", f"a registered uccl_ep env var ({', '.join(REGISTRY)})", repr(name)) from None


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    _lookup(name)
    return name in (os.environ if environ is None else environ)


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Typed value of ``name``: parsed from the environment if set, else the default.

    Read at call time (not cached) so tests and launchers that set variables before building a
    Buffer see their values; parsing is cheap and never on a per-token path.
    """
    var = _lookup(name)
    source = os.environ if environ is None else environ
    raw = source.get(name)
    if raw is None:
        return var.default
    return var.parse(raw)


def snapshot(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """All registered variables with their effective values (for `uccl-ep doctor` and logs)."""
    return {name: get(name, environ) for name in REGISTRY}


def shared_values(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> tuple | str:
    """This process's values of variables every rank must agree on, for an exchange between ranks;
    the text of the first invalid one instead of raising, so that a bad value on one rank is refused
    on every rank after the exchange (require_same_across_ranks) rather than leaving the others
    waiting in it."""
    try:
        return tuple(get(name, environ) for name in names)
    except InvalidArgument as e:
        return str(e)


def require_same_across_ranks(names: tuple[str, ...], per_rank: list, why: str = "") -> None:
    """Raise on every rank alike when the ranks' shared_values() answers differ or one is invalid."""
    label = " / ".join(names)
    errors = [(r, v) for r, v in enumerate(per_rank) if isinstance(v, str)]
    if errors:
        raise InvalidArgument(label, "valid settings on every rank", f"rank {errors[0][0]}: {errors[0][1]}")
    if len(set(per_rank)) > 1:
        show = lambda x: str(int(x)) if isinstance(x, bool) else str(x)  # noqa: E731
        listing = ", ".join(f"rank {r}: {'/'.join(show(x) for x in v)}" for r, v in enumerate(per_rank))
        raise InvalidArgument(label, "the same values on every rank" + (f" ({why})" if why else ""), listing,
                              hint="set these variables alike for every process")


def render_markdown() -> str:
    lines = [
        "# Environment variables",
        "",
        "Generated from `core/uccl_ep/env.py` (`python -m uccl_ep.env > docs/env.md`); a test keeps",
        "the two identical. uccl_ep reads only these variables and never writes the environment.",
        "Each one overrides a default; the same knob is also a constructor or CLI argument.",
        "",
        "| variable | type | default | used by | meaning |",
        "|---|---|---|---|---|",
    ]
    for v in _VARS:
        kind = v.kind if v.kind != "choice" else " \\| ".join(v.choices)
        default = "(empty)" if v.default == "" else f"`{v.default}`"
        lines.append(f"| `{v.name}` | {kind} | {default} | {v.used_by} | {v.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown(), end="")
