"""Which NICs serve which GPU, for ``UCCL_EP_FABRIC_DOMAINS=auto``.

A GPU's NICs are the ones whose PCI path (root complex, bridges, switches: sysfs) shares the most
with the GPU's -- on p5en the two EFA devices behind the GPU's PCIe switch. The proxy threads of
that GPU's rank then spread over them (thread i -> NIC i mod n), as with an explicit list.

NOTES: this is the sysfs half of what NCCL's topology search does (its PATH_PIX/PXB/PHB levels);
a GPU whose NICs cannot be told apart (no PCI address from the provider, no sysfs) keeps the
provider's first NIC, as without the variable.
"""

from __future__ import annotations

import os
import re

__all__ = ["SYSFS_PCI", "pci_chain", "closest_nics", "gpu_pci_address", "auto_domains"]

SYSFS_PCI = "/sys/bus/pci/devices"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pci_chain(bdf: str, sysfs: str = SYSFS_PCI) -> list[str]:
    """The PCI path of device ``bdf`` from its root complex down (``pci0000:00``, bridges, the
    device), read from sysfs; [] when sysfs does not know the device."""
    link = os.path.join(sysfs, bdf.lower())
    if not os.path.exists(link):
        return []
    parts = [p for p in os.path.realpath(link).split(os.sep) if p]
    return [p for p in parts if p.startswith("pci") or _BDF.match(p)]


def closest_nics(gpu_bdf: str, nics: list[tuple[str, str]], sysfs: str = SYSFS_PCI) -> list[str]:
    """Names of the NICs (``(name, pci address)``, provider order) whose PCI path shares the most
    with the GPU's; [] when that cannot be told (no paths, or nothing in common)."""
    gpu = pci_chain(gpu_bdf, sysfs)
    best, out = 0, []
    for name, bdf in nics:
        chain = pci_chain(bdf, sysfs) if bdf else []
        common = 0
        for a, b in zip(gpu, chain):
            if a != b:
                break
            common += 1
        if common > best:
            best, out = common, [name]
        elif common == best and common > 0:
            out.append(name)
    return out


def gpu_pci_address() -> str | None:
    """PCI address of this process's current CUDA device, or None without CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - no GPU information: no automatic choice
        return None


def auto_domains(nics: list[tuple[str, str]], gpu_bdf: str | None, sysfs: str = SYSFS_PCI) -> str:
    """The comma-separated NIC list ``auto`` stands for ("" = the provider's first NIC)."""
    if not gpu_bdf:
        return ""
    return ",".join(closest_nics(gpu_bdf, nics, sysfs))
