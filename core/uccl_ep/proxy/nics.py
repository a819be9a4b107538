"""Which NICs serve which GPU: the default choice behind ``UCCL_EP_FABRIC_DOMAINS`` (``auto``).

A GPU's NICs are the ones whose PCI path (sysfs: host bridge, root port, switch ports) shares the
most with the GPU's, then the ones on its NUMA node. Where several GPUs find the same NICs equally
close -- p5en: two H200s and four 200 Gb/s EFA devices behind one PCIe switch; p6-b200: two B200s
and two 400 Gb/s EFA devices -- the NICs are divided among those GPUs in PCI order (GPU j of k
takes the j-th share), so every NIC of the host carries one GPU's traffic and no GPU shares a NIC
it need not share. A GPU's proxy threads then stripe over its NICs (thread i -> NIC i mod n, the
fabric transport's rule), so their line rates add up.

A NIC's PCI address comes from the libfabric provider (fi_info's nic bus attributes) or, where the
provider gives none, from ``/sys/class/infiniband/<device>/device``. Without a GPU, without sysfs
or without NIC addresses nothing can be told apart, and every thread keeps the provider's first
NIC (the fabric transport's own default).

NOTES: this is the sysfs half of NCCL's topology search (its PIX/PXB/PHB/NODE levels) plus the
division of equally close NICs that UCCL-EP hard-codes per instance type and NVSHMEM lacks
(GPU pairs that share a switch both took the first NIC there).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

__all__ = ["SYSFS", "pci_chain", "numa_node", "nic_pci_address", "host_gpus", "nic_plan", "closest_nics",
           "gpu_pci_address", "visible_gpu_pci_addresses", "auto_domains", "domains_for_local_rank", "resolve_domains", "describe"]

log = logging.getLogger("uccl_ep")

SYSFS = "/sys"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# PCI vendor -> class prefixes of its GPUs (NVIDIA: 3D / VGA controller; AMD Instinct: processing
# accelerator, display or VGA controller). NVSwitches (class 0x0680) are not GPUs.
_GPU_CLASSES = {"0x10de": ("0x0302", "0x0300"), "0x1002": ("0x1200", "0x0380", "0x0302", "0x0300")}
# Domain-name suffixes libfabric providers add to the RDMA device name (efa: rdmap79s0-rdm).
_DOMAIN_SUFFIX = re.compile(r"-(rdm|dgrm|xrc)$")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def pci_chain(bdf: str, sysfs: str = SYSFS) -> list[str]:
    """The PCI path of device ``bdf`` from its host bridge down (``pci0000:00``, root port,
    switch ports, the device), read from sysfs; [] when sysfs does not know the device."""
    link = os.path.join(sysfs, "bus", "pci", "devices", bdf.lower())
    if not os.path.exists(link):
        return []
    parts = [p for p in os.path.realpath(link).split(os.sep) if p]
    return [p for p in parts if p.startswith("pci") or _BDF.match(p)]


def numa_node(bdf: str, sysfs: str = SYSFS) -> int | None:
    """NUMA node of device ``bdf`` (None when unknown or -1)."""
    text = _read(os.path.join(sysfs, "bus", "pci", "devices", bdf.lower(), "numa_node"))
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def nic_pci_address(name: str, pci: str, sysfs: str = SYSFS) -> str:
    """PCI address of libfabric domain ``name``: the provider's, else the RDMA device's in sysfs
    (``/sys/class/infiniband/<name without -rdm/-dgrm>/device``); "" when neither says."""
    if pci:
        return pci.lower()
    dev = os.path.join(sysfs, "class", "infiniband", _DOMAIN_SUFFIX.sub("", name), "device")
    if not os.path.exists(dev):
        return ""
    base = os.path.basename(os.path.realpath(dev))
    return base if _BDF.match(base) else ""


def host_gpus(sysfs: str = SYSFS) -> list[str]:
    """PCI addresses of every GPU of the host (NVIDIA and AMD), sorted: the GPUs that may share
    NICs with this process's GPU, whether or not this process can see them."""
    root = os.path.join(sysfs, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for bdf in names:
        vendor = _read(os.path.join(root, bdf, "vendor"))
        cls = _read(os.path.join(root, bdf, "class")) or ""
        if vendor in _GPU_CLASSES and cls.startswith(_GPU_CLASSES[vendor]):
            out.append(bdf)
    return out


@dataclass(frozen=True)
class _Dev:
    name: str
    bdf: str
    chain: tuple[str, ...]
    numa: int | None


# How close two devices are: (PCI path elements in common, same NUMA node). Tuples compare in order.
def _closeness(a: _Dev, b: _Dev) -> tuple[int, bool]:
    common = 0
    for x, y in zip(a.chain[:-1], b.chain[:-1]):  # the devices themselves never match
        if x != y:
            break
        common += 1
    return common, a.numa is not None and a.numa == b.numa


def _level(closeness: tuple[int, bool]) -> str:
    common, same_numa = closeness
    if common >= 3:
        return "same PCIe switch"
    if common == 2:
        return "same root port"
    if common == 1:
        return "same host bridge"
    return "same NUMA node" if same_numa else "no relation"


def _nic_devs(nics: list[tuple[str, str]], sysfs: str) -> list[_Dev]:
    out, seen = [], set()
    for name, pci in nics:
        bdf = nic_pci_address(name, pci, sysfs)
        if not bdf or bdf in seen:  # one domain per NIC (a provider may list several per device)
            continue
        chain = tuple(pci_chain(bdf, sysfs))
        if chain:
            seen.add(bdf)
            out.append(_Dev(name, bdf, chain, numa_node(bdf, sysfs)))
    return sorted(out, key=lambda d: d.bdf)


def nic_plan(nics: list[tuple[str, str]], gpus: list[str] | None = None,
             sysfs: str = SYSFS) -> dict[str, tuple[list[str], str]]:
    """For every GPU of the host (``gpus``, default: :func:`host_gpus`): the NICs (domain names,
    from ``nics`` = the provider's ``(name, pci address)`` list) its proxy threads use, and why
    (``same PCIe switch`` ... ``no relation``). GPUs that find the same NICs closest divide them
    in PCI order; a GPU with no related NIC gets [] (the provider's first NIC)."""
    ndevs = _nic_devs(nics, sysfs)
    gdevs = []
    for bdf in sorted(g.lower() for g in (host_gpus(sysfs) if gpus is None else gpus)):
        chain = tuple(pci_chain(bdf, sysfs))
        if chain:
            gdevs.append(_Dev(bdf, bdf, chain, numa_node(bdf, sysfs)))
    best: dict[str, tuple[tuple[str, ...], tuple[int, bool]]] = {}
    for g in gdevs:
        scores = [(_closeness(g, n), n.name) for n in ndevs]
        top = max((s for s, _ in scores), default=(0, False))
        if top == (0, False):
            best[g.bdf] = ((), top)
        else:
            best[g.bdf] = (tuple(name for s, name in scores if s == top), top)
    plan: dict[str, tuple[list[str], str]] = {}
    for g in gdevs:
        cands, top = best[g.bdf]
        if not cands:
            plan[g.bdf] = ([], _level(top))
            continue
        sharing = [h.bdf for h in gdevs if best[h.bdf][0] == cands]  # sorted: gdevs is
        j, k, n = sharing.index(g.bdf), len(sharing), len(cands)
        mine = list(cands[j * n // k:(j + 1) * n // k]) if n >= k else [cands[j % n]]
        why = _level(top) + (f", {n} NICs shared by {k} GPUs" if k > 1 else "")
        plan[g.bdf] = (mine, why)
    return plan


def closest_nics(gpu_bdf: str, nics: list[tuple[str, str]], sysfs: str = SYSFS) -> list[str]:
    """The NICs (domain names) of GPU ``gpu_bdf`` by :func:`nic_plan`; [] when nothing relates."""
    gpus = host_gpus(sysfs)
    bdf = gpu_bdf.lower()
    plan = nic_plan(nics, gpus if bdf in gpus else gpus + [bdf], sysfs)
    return plan.get(bdf, ([], ""))[0]


def gpu_pci_address() -> str | None:
    """PCI address of this process's current GPU (CUDA or ROCm torch), or None without one."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - no GPU information: no automatic choice
        return None


def visible_gpu_pci_addresses() -> list[str]:
    """PCI addresses of the GPUs torch sees, in its order (the local ranks' order); [] without."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return [f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0" for p in props]
    except Exception:  # noqa: BLE001 - no GPU information
        return []


def auto_domains(nics: list[tuple[str, str]], gpu_bdf: str | None, sysfs: str = SYSFS) -> str:
    """The comma-separated NIC list ``auto`` stands for ("" = the provider's first NIC)."""
    if not gpu_bdf:
        return ""
    return ",".join(closest_nics(gpu_bdf, nics, sysfs))


def domains_for_local_rank(spec: str, local_rank: int) -> str:
    """This local rank's NIC list from an explicit UCCL_EP_FABRIC_DOMAINS: one comma-separated list
    for every rank, or one list per local rank separated by `;` (local rank L takes list L mod n),
    e.g. `nic0,nic1;nic2,nic3;...` for 2 NICs per GPU on an 8-GPU node."""
    from ..errors import InvalidArgument
    groups = [g.strip() for g in spec.split(";")] if spec.strip() else []
    if any(not g for g in groups):
        raise InvalidArgument("UCCL_EP_FABRIC_DOMAINS", "NIC names, comma-separated, one list per local rank "
                              "separated by ';' (no empty list), `auto` or `first`", spec)
    return groups[local_rank % len(groups)] if groups else ""


def resolve_domains(spec: str, local_rank: int, provider: str, sysfs: str = SYSFS) -> str:
    """The NIC list this rank's proxy threads stripe over: ``auto`` (and empty) -> the GPU's NICs
    by the PCI topology (:func:`nic_plan`); ``first`` -> "" (the provider's first NIC for every
    thread); else :func:`domains_for_local_rank`."""
    key = spec.strip().lower()
    if key == "first":
        return ""
    if key in ("", "auto"):
        from .native import native
        gpu = gpu_pci_address()
        chosen = auto_domains(list(native().fabric_domain_pci(provider)), gpu, sysfs)
        log.info("uccl_ep: GPU %s -> NICs %s (UCCL_EP_FABRIC_DOMAINS=auto)", gpu, chosen or "<provider's first>")
        return chosen
    return domains_for_local_rank(spec, local_rank)


def describe(spec: str, nics: list[tuple[str, str]], gpus: list[str], sysfs: str = SYSFS) -> list[dict]:
    """What each GPU of ``gpus`` (PCI addresses in local-rank order, as torch lists them) gets
    under ``spec``: rows of {gpu, pci, nics, why} for `uccl-ep doctor`."""
    key = spec.strip().lower()
    rows = []
    plan = nic_plan(nics, sorted(set(host_gpus(sysfs)) | {g.lower() for g in gpus}), sysfs) \
        if key in ("", "auto") else {}
    for i, bdf in enumerate(gpus):
        if key == "first":
            names, why = [], "UCCL_EP_FABRIC_DOMAINS=first"
        elif key in ("", "auto"):
            names, why = plan.get(bdf.lower(), ([], "GPU not in sysfs"))
        else:
            names, why = domains_for_local_rank(spec, i).split(","), "UCCL_EP_FABRIC_DOMAINS list"
        rows.append({"gpu": i, "pci": bdf, "nics": names or ["<provider's first>"], "why": why})
    return rows
