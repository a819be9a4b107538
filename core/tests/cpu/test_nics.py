"""Each GPU's NICs chosen from the PCI topology (UCCL_EP_FABRIC_DOMAINS=auto, the default), on
sysfs trees built from recorded topologies of p5en, p6-b200, MI300X + Thor-2 and MI300X + CX7
(core/tests/cpu/data/topo_*.txt; each file's header says which public facts it encodes), plus
synthetic trees for the fallbacks (NUMA node only, no relation, no addresses)."""

import os
import random

import pytest

from uccl_ep.errors import InvalidArgument
from uccl_ep.proxy import transport_unavailable_reason
from uccl_ep.proxy.bootstrap import resolve_domains
from uccl_ep.proxy.nics import (auto_domains, closest_nics, describe, domains_for_local_rank, host_gpus, nic_plan,
                                nic_pci_address, numa_node, pci_chain)

pytestmark = pytest.mark.cpu

DATA = os.path.join(os.path.dirname(__file__), "data")


def build_sysfs(root, lines):
    """A sysfs tree under `root` from topology lines (`kind path numa=.. vendor=.. class=.. [ib=..]`):
    devices/pci<dom>:<bus>/<bdf>/... with vendor, class and numa_node files, bus/pci/devices links
    for every device on the paths, class/infiniband/<ib>/device links. Returns (gpus, nics) as
    (pci address, ib name) lists in file order."""
    devices = os.path.join(root, "devices")
    links = os.path.join(root, "bus", "pci", "devices")
    ib = os.path.join(root, "class", "infiniband")
    os.makedirs(links, exist_ok=True)
    os.makedirs(ib, exist_ok=True)
    gpus, nics = [], []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, path, *attrs = line.split()
        kv = dict(a.split("=", 1) for a in attrs)
        bdfs = path.split("/")
        host_bridge = "pci" + bdfs[0].rsplit(":", 1)[0]
        d = os.path.join(devices, host_bridge)
        for bdf in bdfs:
            d = os.path.join(d, bdf)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "numa_node"), "w") as f:
                f.write(kv.get("numa", "-1") + "\n")
            if not os.path.lexists(os.path.join(links, bdf)):
                os.symlink(d, os.path.join(links, bdf))
        for key, name in (("vendor", "vendor"), ("class", "class")):
            with open(os.path.join(d, name), "w") as f:
                f.write(kv[key] + "\n")
        if "ib" in kv:
            os.makedirs(os.path.join(ib, kv["ib"]), exist_ok=True)
            os.symlink(d, os.path.join(ib, kv["ib"], "device"))
        if kind == "gpu":
            gpus.append(bdfs[-1])
        elif kind == "nic":
            nics.append((bdfs[-1], kv.get("ib", "")))
    return gpus, nics


def machine(tmp_path, name):
    with open(os.path.join(DATA, f"topo_{name}.txt")) as f:
        return build_sysfs(str(tmp_path), f.read().splitlines())


def provider_list(nics, suffix="", with_pci=True, seed=0):
    """What a libfabric provider reports: (domain name, PCI address or ""), in its own order."""
    out = [(ib + suffix, bdf if with_pci else "") for bdf, ib in nics]
    random.Random(seed).shuffle(out)
    return out


def _plan(tmp_path, name, **kw):
    gpus, nics = machine(tmp_path, name)
    sysfs = str(tmp_path)
    assert host_gpus(sysfs) == sorted(gpus)          # GPUs found by vendor and class, NVSwitches not
    plan = nic_plan(provider_list(nics, **kw), sysfs=sysfs)
    return [plan[g] for g in sorted(gpus)], sysfs, gpus, nics


def test_p5en_two_efa_per_gpu_from_the_four_behind_a_gpu_pair(tmp_path):
    plan, sysfs, gpus, nics = _plan(tmp_path, "p5en", suffix="-rdm")
    by_gpu = [names for names, _ in plan]
    efa = [ib + "-rdm" for _, ib in sorted(nics)]
    assert by_gpu == [efa[2 * g:2 * g + 2] for g in range(8)]      # GPU 2k: first two of its switch's four
    assert sorted(sum(by_gpu, [])) == sorted(efa)                  # every NIC used, none twice
    assert all(why == "same PCIe switch, 4 NICs shared by 2 GPUs" for _, why in plan)
    # one GPU's process asks for itself alone: the same answer (it sees the other GPUs in sysfs)
    for g, names in zip(sorted(gpus), by_gpu):
        assert auto_domains(provider_list(nics, suffix="-rdm", seed=3), g, sysfs) == ",".join(names)


def test_p6_b200_one_400g_efa_per_gpu(tmp_path):
    plan, sysfs, gpus, nics = _plan(tmp_path, "p6-b200", suffix="-rdm")
    efa = [ib + "-rdm" for _, ib in sorted(nics)]
    assert [names for names, _ in plan] == [[n] for n in efa]
    assert all(why == "same PCIe switch, 2 NICs shared by 2 GPUs" for _, why in plan)


def test_mi300x_thor2_one_nic_per_gpu_behind_its_switch(tmp_path):
    plan, sysfs, gpus, nics = _plan(tmp_path, "mi300x-thor2")
    assert [names for names, _ in plan] == [[f"bnxt_re{k}"] for k in range(8)]
    assert all(why == "same PCIe switch" for _, why in plan)
    assert pci_chain(sorted(gpus)[1], sysfs)[:4] == ["pci0000:18", "0000:18:01.1", "0000:19:00.0", "0000:1a:04.0"]
    assert numa_node(sorted(gpus)[5], sysfs) == 1


def test_mi300x_cx7_skips_the_front_end_ports_and_finds_addresses_in_sysfs(tmp_path):
    # verbs;ofi_rxm may report no PCI address: /sys/class/infiniband/<name>/device says it
    plan, sysfs, gpus, nics = _plan(tmp_path, "mi300x-cx7", with_pci=False)
    assert [names for names, _ in plan] == [[f"mlx5_{k}"] for k in (0, 2, 3, 4, 5, 7, 8, 9)]
    assert nic_pci_address("mlx5_1", "", sysfs) == "0000:0a:00.0"
    assert nic_pci_address("rdmap73s0-rdm", "", sysfs) == ""        # no such device here


SYNTH = [  # two sockets; GPU a shares a switch with nothing, NIC x is on its NUMA node only
    "gpu 0000:10:01.0/0000:11:00.0 numa=0 vendor=0x10de class=0x030200",
    "nic 0000:20:01.0/0000:21:00.0 numa=0 vendor=0x15b3 class=0x020700 ib=x",
    "nic 0000:90:01.0/0000:91:00.0 numa=1 vendor=0x15b3 class=0x020700 ib=y",
    "gpu 0000:a0:01.0/0000:a1:00.0 numa=-1 vendor=0x10de class=0x030200",  # no NUMA information
]


def test_numa_node_then_nothing(tmp_path):
    gpus, nics = build_sysfs(str(tmp_path), SYNTH)
    plan = nic_plan(provider_list(nics), sysfs=str(tmp_path))
    assert plan["0000:11:00.0"] == (["x"], "same NUMA node")
    assert plan["0000:a1:00.0"] == ([], "no relation")               # the provider's first NIC
    assert auto_domains(provider_list(nics), "0000:a1:00.0", str(tmp_path)) == ""
    assert auto_domains(provider_list(nics), None, str(tmp_path)) == ""      # no GPU
    assert closest_nics("0000:11:00.0", [("x", ""), ("z", "")], str(tmp_path)) == ["x"]   # z: no address
    assert closest_nics("0000:11:00.0", [("q", ""), ("z", "")], str(tmp_path)) == []


def test_one_domain_per_nic_and_more_gpus_than_nics(tmp_path):
    lines = ["gpu 0000:10:01.0/0000:11:00.0/0000:12:0%d.0/0000:1%d:00.0 numa=0 vendor=0x1002 class=0x120000" % (i, 3 + i)
             for i in range(3)]
    lines.append("nic 0000:10:01.0/0000:11:00.0/0000:12:05.0/0000:18:00.0 numa=0 vendor=0x1d0f class=0x020000 ib=e0")
    lines.append("nic 0000:10:01.0/0000:11:00.0/0000:12:06.0/0000:19:00.0 numa=0 vendor=0x1d0f class=0x020000 ib=e1")
    gpus, nics = build_sysfs(str(tmp_path), lines)
    listed = [("e0-rdm", "0000:18:00.0"), ("e0-dgrm", "0000:18:00.0"), ("e1-rdm", "0000:19:00.0")]
    plan = nic_plan(listed, sysfs=str(tmp_path))
    assert [plan[g][0] for g in sorted(gpus)] == [["e0-rdm"], ["e1-rdm"], ["e0-rdm"]]


def test_override_and_explicit_lists():
    # on this CPU machine: no CUDA device, tcp NICs report no PCI address
    assert resolve_domains("auto", 0, "tcp;ofi_rxm") == ""
    assert resolve_domains("", 0, "tcp;ofi_rxm") == ""
    assert resolve_domains("first", 3, "tcp;ofi_rxm") == ""
    assert resolve_domains("lo;eth0", 1, "tcp;ofi_rxm") == "eth0"
    assert domains_for_local_rank("a,b;c", 2) == "a,b" and domains_for_local_rank("a,b;c", 3) == "c"
    with pytest.raises(InvalidArgument, match="UCCL_EP_FABRIC_DOMAINS"):
        resolve_domains("a;;b", 0, "tcp;ofi_rxm")


def test_describe_for_doctor(tmp_path):
    gpus, nics = machine(tmp_path, "p6-b200")
    listed = provider_list(nics, suffix="-rdm")
    rows = describe("auto", listed, sorted(gpus)[:2], str(tmp_path))
    assert [(r["gpu"], r["nics"]) for r in rows] == [(0, ["rdmap73s0-rdm"]), (1, ["rdmap74s0-rdm"])]
    assert rows[0]["why"] == "same PCIe switch, 2 NICs shared by 2 GPUs"
    assert describe("first", listed, gpus[:1], str(tmp_path))[0]["nics"] == ["<provider's first>"]
    assert describe("a,b;c", listed, gpus[:2], str(tmp_path))[1]["nics"] == ["c"]


@pytest.mark.skipif(transport_unavailable_reason("fabric") is not None, reason="libfabric is not installed")
def test_doctor_reports_each_gpus_nics():
    from uccl_ep.cli.doctor import _libfabric
    choice = _libfabric()["nic_choice"]
    assert choice["spec"] == "auto" and "error" not in choice
    assert choice["gpus"] == []   # this CPU machine: no GPU, every thread opens the provider's first NIC
