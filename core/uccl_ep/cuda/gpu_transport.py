"""Which proxy transport moves GPU memory for the cuda executor's proxy paths (LL through the proxy,
normal mode between nodes).

- ``ipc`` (all ranks on one host): the sending proxy copies into the peer's GPU buffer with the copy
  engine, then hands over the immediate. The stand-in for a NIC on machines without one (its
  numbers: docs/benchmarks.md).
- ``ipc+fabric`` (split transport, csrc/transport/split.cc): ``ipc`` to the ranks of this node,
  libfabric RMA writes with immediate data to the others, the buffer registered as GPU memory
  (``FI_HMEM``, i.e. GPUDirect RDMA: efa, or verbs with nvidia-peermem). Chosen only with
  ``UCCL_EP_TRANSPORT=fabric`` (or ``ipc+fabric``): it is built, the split is tested on CPU over host
  memory (ipc + tcp;ofi_rxm), and a provider that cannot register GPU memory is refused at set-up
  with what every provider answered (``uccl-ep doctor``); but no machine of this project has such a
  NIC, so GPU memory has never crossed one. With one GPU per node (``ranks_per_node=1`` on one
  host) every peer is "another node": the traffic goes through the NIC's loopback, which is how a
  single machine with such a NIC tests it before a cluster run.

``UCCL_EP_TRANSPORT=auto`` keeps ranks on several hosts off the GPU proxy path (the executor then
says how to opt in); ``loop`` cannot reach GPU memory at all.
"""

from __future__ import annotations

from functools import lru_cache

from .. import env

__all__ = ["choose", "unavailable_reason", "multi_host_guess", "gpu_memory_provider"]


def multi_host_guess(ctx) -> bool:
    """Whether the group spans hosts, without a collective: torchrun's LOCAL_WORLD_SIZE below the group
    size, else more ranks than this process sees GPUs.
    NOTES: a guess for backend selection only; the executor's set-up compares host names exactly."""
    import os

    import torch
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 0:
        return int(local) < ctx.num_ranks
    return ctx.num_ranks > torch.cuda.device_count()


@lru_cache(maxsize=None)
def gpu_memory_provider(provider: str = "") -> tuple[str, str]:
    """(fabric endpoint name, '') when `provider` ("" = the default order) can register GPU memory
    (FI_HMEM), else ('', every provider's answer). Cached per process: each probe opens and closes a
    fabric endpoint, and every Buffer's backend choice and proxy engine asks.
    NOTES: whether a provider grants FI_HMEM does not depend on the GPU; the ordinal matters when
    the region is registered, which the proxy does with the buffer's real device."""
    from ..proxy import native
    name, why = native().fabric_probe(provider, "", 0)
    return name, why


def _probe_fabric() -> str | None:
    name, why = gpu_memory_provider(str(env.get("UCCL_EP_FABRIC_PROVIDER") or ""))
    return None if name else why


def unavailable_reason(multi_host: bool) -> str | None:
    """None when a transport can move this process's GPU buffers to every peer, else why not."""
    transport = str(env.get("UCCL_EP_TRANSPORT"))
    if transport in ("fabric", "ipc+fabric"):
        why = _probe_fabric()
        return f"UCCL_EP_TRANSPORT={transport}: {why}" if why else None
    if transport not in ("auto", "ipc"):
        return (f"UCCL_EP_TRANSPORT={transport} cannot move GPU memory; the GPU proxy path uses ipc (one host) or "
                "fabric (GPU memory registered with FI_HMEM)")
    if multi_host:
        return ("ranks span several hosts: the GPU proxy path between hosts is the fabric transport with GPU memory "
                "registered for the NIC (FI_HMEM, GPUDirect RDMA), built but not yet run on a NIC; opt in with "
                "UCCL_EP_TRANSPORT=fabric (`uccl-ep doctor` says whether a provider here can), or use "
                "backend='host'" + ("" if transport == "auto" else "; ipc reaches the GPUs of one host only"))
    return None


def choose(multi_host: bool) -> str:
    """The transport name for ``start_proxy``; raises `Unsupported` with the reason when none fits."""
    why = unavailable_reason(multi_host)
    if why:
        from ..errors import Unsupported
        raise Unsupported(f"the cuda backend's proxy path: {why}")
    # NOTES: with the NIC in play the ranks of one node still reach each other over the copy engine
    # (NVLink): the second hop of internode normal mode stays off the NIC, as in DeepEP.
    return "ipc+fabric" if str(env.get("UCCL_EP_TRANSPORT")) in ("fabric", "ipc+fabric") else "ipc"
