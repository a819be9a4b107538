"""`uccl-ep doctor`: what this machine has (GPUs, NVLink, libfabric providers, RDMA devices,
compilers, framework plugins) and what that means for uccl-ep. It never initializes a GPU
context beyond what torch's device queries do, and never fails: a missing piece is reported."""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
from typing import Any

__all__ = ["add_parser", "run", "collect"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="report what this machine has and what it means for uccl-ep")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=run)


def _cmd(argv: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return out.stdout if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _gpus() -> dict[str, Any]:
    info: dict[str, Any] = {"count": 0, "devices": [], "peer_access": None}
    try:
        import torch
        if not torch.cuda.is_available():
            return info
        n = torch.cuda.device_count()
        info["count"] = n
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            gcn = str(getattr(p, "gcnArchName", "") or "")  # AMD: "gfx942:sramecc+:xnack-"
            info["devices"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                    "arch": gcn.split(":")[0] if gcn.startswith("gfx") else f"sm_{p.major}{p.minor}",
                                    "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)})
        info["peer_access"] = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
        topo = _cmd(["nvidia-smi", "topo", "-m"])
        info["nvlink"] = bool(topo and "NV" in topo)
    except Exception as e:  # noqa: BLE001 - doctor reports, never fails
        info["error"] = str(e)
    return info


def _libfabric() -> dict[str, Any]:
    from .. import _C
    probe = dict(_C.probe_library("fabric"))
    providers = []
    listing = _cmd(["fi_info", "-l"])
    if listing:
        providers = [line.strip().rstrip(":") for line in listing.splitlines() if line.strip().endswith(":")]
    probe["providers"] = providers
    if probe.get("loadable"):
        from .. import env
        from ..proxy import native
        try:  # what UCCL_EP_FABRIC_DOMAINS can name, with PCI addresses where the provider gives them
            pairs = native().fabric_domain_pci(env.get("UCCL_EP_FABRIC_PROVIDER") or "")
            probe["nics"] = [f"{name} ({pci})" if pci else name for name, pci in pairs]
            # each GPU's NICs as its proxy threads would stripe over them (UCCL_EP_FABRIC_DOMAINS)
            from ..proxy.nics import describe, visible_gpu_pci_addresses
            spec = str(env.get("UCCL_EP_FABRIC_DOMAINS"))
            probe["nic_choice"] = {"spec": spec,
                                   "gpus": describe(spec, list(pairs), visible_gpu_pci_addresses())}
        except Exception as e:  # noqa: BLE001 - a report, never a failure
            probe.setdefault("nics", [f"? ({e})"])
            probe["nic_choice"] = {"spec": "", "gpus": [], "error": str(e)}
        try:  # can a provider register GPU memory for the NIC (FI_HMEM: the cuda backend between hosts)?
            from ..cuda.gpu_transport import gpu_memory_provider
            name, why = gpu_memory_provider(env.get("UCCL_EP_FABRIC_PROVIDER") or "")
            probe["gpu_memory"] = {"provider": name, "why_not": why}
        except Exception as e:  # noqa: BLE001 - a report, never a failure
            probe["gpu_memory"] = {"provider": "", "why_not": str(e)}
    return probe


def _rdma_devices() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob("/sys/class/infiniband/*"))


def _compilers() -> dict[str, Any]:
    from .. import env
    found: dict[str, Any] = {}
    candidates = []
    if env.get("UCCL_EP_NVCC"):
        candidates.append(env.get("UCCL_EP_NVCC"))
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    if shutil.which("nvcc"):
        candidates.append(shutil.which("nvcc"))
    try:
        import nvidia.cuda_nvcc as pkg  # type: ignore
        for base in getattr(pkg, "__path__", []):
            candidates.append(os.path.join(base, "bin", "nvcc"))
    except ImportError:
        pass
    nvcc = next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)
    found["nvcc"] = nvcc
    if nvcc:
        out = _cmd([nvcc, "--version"])
        found["nvcc_version"] = out.strip().splitlines()[-1] if out else None
    try:
        from ..cuda.jit import compiler_version, find_hipcc
        hipcc = find_hipcc()
        found["hipcc"] = str(hipcc)
        found["hipcc_version"] = compiler_version(hipcc).splitlines()[0]
    except Exception as e:  # noqa: BLE001 - doctor reports, never fails
        found["hipcc"] = None
        found["hipcc_why"] = str(e)
    return found


def _gpu_runtimes() -> dict[str, Any]:
    """Which GPU runtime uccl_ep would use (the one torch was built for) and what loading each found."""
    from .. import _C
    out: dict[str, Any] = {}
    try:
        from ..cuda.runtime import torch_gpu_runtime
        out["torch_uses"] = torch_gpu_runtime()
    except Exception as e:  # noqa: BLE001 - doctor reports, never fails
        out["torch_uses"] = f"? ({e})"
    for name in ("cuda", "hip"):
        try:
            out[name] = dict(_C.cuda.probe_runtime(name))
        except Exception as e:  # noqa: BLE001
            out[name] = {"loadable": False, "usable": False, "path": "", "why": str(e), "version": 0}
    return out


def _torch_ops() -> dict[str, Any]:
    """Whether uccl_ep's torch ops (eager LL ops in one native call: cuda/native_ops.py) load here."""
    try:
        from ..cuda import native_ops
        why = native_ops.unavailable_reason()
    except Exception as e:  # noqa: BLE001 - a report, not a failure
        why = f"{type(e).__name__}: {e}"
    return {"loaded": why is None, "why": why}


def _plugins() -> dict[str, Any]:
    from importlib import metadata
    result: dict[str, Any] = {}
    for group, label in (("sglang.srt.plugins", "sglang"), ("vllm.general_plugins", "vllm")):
        try:
            eps = metadata.entry_points(group=group)
        except Exception:  # noqa: BLE001
            eps = []
        ours = [f"{ep.name} = {ep.value}" for ep in eps if "uccl" in ep.value or "uccl" in ep.name]
        result[label] = {"entry_points": ours}
    for label, module in (("sglang", "uccl_ep_sglang"), ("vllm", "uccl_ep_vllm"), ("megatron", "uccl_ep_megatron")):
        entry = result.setdefault(label, {})
        try:
            mod = __import__(module)
            status = getattr(mod, "plugin_status", None)
            entry["status"] = status() if callable(status) else {"installed": True}
        except ImportError:
            entry.setdefault("status", {"installed": False})
        except Exception as e:  # noqa: BLE001
            entry["status"] = {"installed": True, "error": str(e)}
    return result


def collect() -> dict[str, Any]:
    from .. import __version__, _C, env
    from ..backends import _REGISTRY, available_here
    report: dict[str, Any] = {"uccl_ep": {"version": __version__, "build": dict(_C.build_info())}}
    try:
        import torch
        report["torch"] = torch.__version__
    except ImportError:
        report["torch"] = None
    report["cuda_driver"] = dict(_C.probe_library("cuda"))
    report["hip_runtime"] = dict(_C.probe_library("hip"))
    report["gpu_runtimes"] = _gpu_runtimes()
    report["torch_ops"] = _torch_ops()
    report["gpus"] = _gpus()
    report["libfabric"] = _libfabric()
    report["rdma_devices"] = _rdma_devices()
    report["compilers"] = _compilers()
    report["backends_registered"] = sorted(_REGISTRY)
    # NOTES: what this machine can run (not just what is registered): name -> None, or why not
    report["backends_available"] = {name: why for name, why in available_here().items()}
    report["plugins"] = _plugins()
    report["env_set"] = {k: v for k, v in env.snapshot().items() if env.is_set(k)}
    report["verdict"] = _verdict(report)
    return report


def _verdict(r: dict[str, Any]) -> list[str]:
    lines = []
    gpus = r["gpus"]["count"]
    rt = r["gpu_runtimes"]
    for name in ("cuda", "hip"):
        p = rt[name]
        lines.append(f"{name.upper()} runtime: {p['path']} found and usable." if p["usable"] else
                     f"{name.upper()} runtime absent: {p['why']}")
    if rt["torch_uses"] == "hip":
        lines.append("ROCm torch: the cuda backend runs on the HIP runtime (kernels compiled by hipcc for the "
                     "device's gfx target; compiled and loader-tested, not yet run on an AMD GPU: docs/amd.md).")
        if not r["compilers"]["hipcc"]:
            lines.append("No hipcc found: install ROCm's hipcc or set UCCL_EP_HIPCC before the first GPU call.")
    cuda_why = r.get("backends_available", {}).get("cuda")
    if gpus and cuda_why:
        lines.append(f"GPU tensors will NOT get the fast CUDA-kernel path here ({cuda_why}); backend=\"auto\" falls "
                     "back to the reference executor with a warning, UCCL_EP_BACKEND=cuda makes it an error.")
    if gpus == 0:
        lines.append("No GPU: Buffers run CPU tensors on the host executor (or the reference); good for "
                     "tests and CI, not for serving.")
    else:
        lines.append(f"{gpus} GPU(s): the cuda backend runs kernels (JIT-compiled on first use).")
        if gpus > 1:
            full = all(all(row) for row in (r["gpus"]["peer_access"] or [[False]]))
            lines.append("Peer access between all GPUs: intranode traffic goes over NVLink/P2P stores." if full else
                         "Not every GPU pair has peer access: those pairs go through the proxy.")
        if rt["torch_uses"] != "hip" and not r["compilers"]["nvcc"]:
            lines.append("No nvcc found: install it with `pip install nvidia-cuda-nvcc` (or set UCCL_EP_NVCC / "
                         "CUDA_HOME) before the first GPU call.")
    rdma = r["rdma_devices"]
    fab = r["libfabric"]
    if not fab.get("loadable"):
        lines.append("libfabric is not loadable: multi-node traffic needs it (apt install libfabric1, or the AWS "
                     "EFA installer on EFA hosts).")
    else:
        provs = fab.get("providers") or []
        if any(d.startswith("efa") or "efa" in d for d in rdma) or "efa" in provs:
            lines.append("EFA present: the proxy uses libfabric's efa provider (SRD, unordered: uccl-ep orders it).")
        elif rdma:
            lines.append(f"RDMA devices {', '.join(rdma)}: the proxy uses libfabric verbs;ofi_rxm (set the GID index "
                         "for RoCE, see docs/nic-tuning.md).")
        else:
            lines.append("No RDMA NIC: multi-node traffic falls back to libfabric tcp;ofi_rxm (functional, slow).")
        gm = fab.get("gpu_memory") or {}
        if gm.get("provider"):
            lines.append(f"GPU memory over the NIC (FI_HMEM): {gm['provider']} can register it; the cuda backend "
                         "between hosts takes UCCL_EP_TRANSPORT=fabric (not yet run on a NIC by this project).")
        elif gpus:
            lines.append("No libfabric provider here registers GPU memory (FI_HMEM): between hosts the cuda backend "
                         "is unavailable (GPUDirect RDMA needs efa, or verbs with nvidia-peermem).")
    return lines


def run(args) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table
    console = Console()
    table = Table(title=f"uccl-ep doctor (uccl_ep {report['uccl_ep']['version']}, torch {report['torch']})",
                  show_header=False)
    table.add_column("item", style="bold")
    table.add_column("finding")
    g = report["gpus"]
    table.add_row("GPUs", ", ".join(f"{d['index']}: {d['name']} ({d['arch']}, {d['sms']} SMs/CUs)"
                                    for d in g["devices"]) or "none")
    if g.get("peer_access") is not None:
        table.add_row("peer access / NVLink", f"{g['peer_access']} / nvlink={g.get('nvlink')}")
    rt = report["gpu_runtimes"]
    for name, label in (("cuda", "CUDA driver"), ("hip", "HIP runtime")):
        p = rt[name]
        table.add_row(label, f"{p['path']} (version {p['version']}): usable" if p["usable"] else
                      f"absent: {p['why']}")
    table.add_row("GPU runtime torch uses", rt["torch_uses"])
    ops = report["torch_ops"]
    table.add_row("uccl_ep torch ops", "loaded (eager LL ops in one native call)" if ops["loaded"] else
                  f"not loaded: {ops['why']} (eager LL ops take the Python path)")
    fab = report["libfabric"]
    table.add_row("libfabric", f"{fab['path']} {fab['version']}; providers: {', '.join(fab['providers']) or '?'}"
                  if fab["loadable"] else f"not loadable ({fab['error']})")
    if fab.get("nics") is not None:
        table.add_row("fabric NICs (UCCL_EP_FABRIC_DOMAINS)", ", ".join(fab["nics"]) or "none")
    choice = fab.get("nic_choice")
    if choice is not None:
        table.add_row(f"NICs per GPU (UCCL_EP_FABRIC_DOMAINS={choice['spec'] or 'auto'})",
                      "; ".join(f"GPU{g['gpu']} {g['pci']}: {', '.join(g['nics'])} ({g['why']})" for g in choice["gpus"])
                      or choice.get("error") or "no GPU: every proxy thread opens the provider's first NIC")
    table.add_row("RDMA devices", ", ".join(report["rdma_devices"]) or "none")
    c = report["compilers"]
    table.add_row("nvcc", f"{c['nvcc']} ({c.get('nvcc_version')})" if c["nvcc"] else "not found")
    table.add_row("hipcc", f"{c['hipcc']} ({c.get('hipcc_version')})" if c["hipcc"] else f"not found ({c.get('hipcc_why')})")
    avail = report["backends_available"]
    table.add_row("backends available here", ", ".join(n for n, why in avail.items() if why is None) or "none")
    for name, why in avail.items():
        if why is not None:
            table.add_row(f"backend {name}", f"unavailable: {why}")
    for name, p in report["plugins"].items():
        table.add_row(f"{name} plugin", f"{p.get('status')}; entry points: {p.get('entry_points') or 'none'}")
    table.add_row("env (set)", ", ".join(f"{k}={v}" for k, v in report["env_set"].items()) or "none")
    console.print(table)
    for line in report["verdict"]:
        console.print(f"• {line}")
    return 0
