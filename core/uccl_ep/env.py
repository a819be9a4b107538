"""The one registry of environment variables read by uccl_ep.

Rules (see docs/env.md, generated from this file by ``python -m uccl_ep.env``):
- every variable uccl_ep reads is declared here, typed, with its default and meaning;
- values are parsed by typed parsers that reject bad input with ``InvalidArgument`` naming the
  variable (no silent ``atoi``-style zero);
- uccl_ep never writes ``os.environ``;
- an env var only overrides a default: every knob is also a constructor/CLI argument;
- only what an operator sets for a machine or a job; kernel tuning is `uccl_ep.Tuning`.

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

__all__ = ["Var", "REGISTRY", "get", "is_set", "snapshot", "render_markdown"]


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
    Var("UCCL_EP_FORCE_PROXY", "bool", False,
        "Send same-host GPU peers' traffic through the CPU proxy instead of NVLink stores, so the "
        "whole GPU -> queue -> proxy -> transport -> counter path runs on one host.",
        used_by="CUDA kernels"),
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
        "rank, proxy threads striped over them), `seed=<n>`, `mates=1` (node mates through the NIC too: the "
        "all-RDMA case, not with a split transport), `overlap=0` (the stand-in transport's own delivery time "
        "adds to `lat_us` instead of counting toward it, the model's first form; default 1), `trace=<n>` (each "
        "endpoint keeps its last n events for "
        "tools/lab/trace_nic.py), or a preset followed by overrides "
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


def render_markdown() -> str:
    lines = [
        "# Environment variables",
        "",
        "Generated from `core/uccl_ep/env.py` (`python -m uccl_ep.env > docs/env.md`); a test keeps",
        "the two identical. uccl_ep reads only these variables and never writes the environment.",
        "Each one overrides a default; the same knob is also a constructor or CLI argument.",
        "They are what an operator sets for a machine or a job; kernel tuning is not here but in",
        "`uccl_ep.Tuning`, passed as `Buffer(..., tuning=Tuning(...))` (docs/api.md, \"Tuning\").",
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
