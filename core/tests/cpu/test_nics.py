"""UCCL_EP_FABRIC_DOMAINS=auto: a GPU's NICs are the ones closest on the PCI tree (a synthetic sysfs)."""

import os

import pytest

from uccl_ep.proxy.bootstrap import resolve_domains
from uccl_ep.proxy.nics import auto_domains, closest_nics, pci_chain

pytestmark = pytest.mark.cpu

# Two root complexes; under root 0 a switch with GPU0 + 2 NICs and another switch with GPU1 + 1 NIC;
# under root 1 a NIC alone.
TREE = {
    "0000:03:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",  # GPU0
    "0000:04:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",  # NIC a (GPU0's switch)
    "0000:05:00.0": "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0",  # NIC b (GPU0's switch)
    "0000:13:00.0": "pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:00.0/0000:13:00.0",  # GPU1
    "0000:14:00.0": "pci0000:00/0000:00:02.0/0000:11:00.0/0000:12:01.0/0000:14:00.0",  # NIC c (GPU1's switch)
    "0000:81:00.0": "pci0000:80/0000:80:01.0/0000:81:00.0",                              # NIC d (other root)
}
NICS = [("d", "0000:81:00.0"), ("a", "0000:04:00.0"), ("c", "0000:14:00.0"), ("b", "0000:05:00.0"), ("x", "")]


@pytest.fixture
def sysfs(tmp_path):
    devices = tmp_path / "devices"
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for bdf, path in TREE.items():
        (devices / path).mkdir(parents=True, exist_ok=True)
        os.symlink(devices / path, links / bdf)
    return str(links)


def test_pci_chain_from_sysfs(sysfs):
    assert pci_chain("0000:03:00.0", sysfs) == TREE["0000:03:00.0"].split("/")
    assert pci_chain("0000:99:00.0", sysfs) == []


def test_each_gpu_gets_the_nics_behind_its_switch(sysfs):
    assert closest_nics("0000:03:00.0", NICS, sysfs) == ["a", "b"]   # provider order kept
    assert closest_nics("0000:13:00.0", NICS, sysfs) == ["c"]
    assert auto_domains(NICS, "0000:03:00.0", sysfs) == "a,b"
    assert auto_domains(NICS, None, sysfs) == ""                     # no GPU: the provider's first NIC
    assert closest_nics("0000:99:00.0", NICS, sysfs) == []           # unknown GPU: nothing to choose
    assert closest_nics("0000:03:00.0", [("x", ""), ("y", "")], sysfs) == []   # NICs without PCI addresses


def test_auto_without_gpu_or_pci_information_keeps_the_default():
    # on this CPU machine: no CUDA device, tcp NICs report no PCI address
    assert resolve_domains("auto", 0, "tcp;ofi_rxm") == ""
    assert resolve_domains("lo;eth0", 1, "tcp;ofi_rxm") == "eth0"
