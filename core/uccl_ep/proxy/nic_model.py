"""The NIC model around a proxy transport (``UCCL_EP_NIC_MODEL``, ``uccl-ep bench --nic-model``).

A NIC model caps each NIC's send rate (bytes/s, one serialized link per NIC shared by the proxy
threads on it), adds a one-way latency to every message and, like EFA's SRD, lets messages
overtake each other within a window, so a machine without such a NIC shows what the proxy
protocols reach against a line rate. The native decorator is ``csrc/transport/nic_model.cc``;
only traffic to ranks of other nodes goes through it (node mates pass straight through), unless
``mates=1``: then node mates cost NIC time too, as with a transport that sends every peer over the
fabric (no NVLink or ipc path; the all-RDMA baseline hybrid paths are measured against).

Specs: a preset name, ``key=value`` pairs, or a preset followed by overrides::

    efa-400g                        50 GB/s, 10 us, reordered over a 10 us window
    efa-200g,nics=2                 a p5en GPU: two 200 Gb/s EFA devices, threads striped over them
    bw=50e9,lat_us=10,reorder=1     the same as efa-400g, spelled out

Keys: ``bw`` (bytes/s of one NIC), ``lat_us``, ``reorder`` (probability a message gets a uniform
extra delay in [0, window_us]), ``window_us`` (default: lat_us), ``nics`` (NICs per rank),
``seed``, ``mates`` (0 or 1), ``overlap`` (0 or 1, default 1: the stand-in transport's own
delivery time counts toward ``lat_us`` instead of adding to it; nic_model.cc says why), ``trace`` (keep each endpoint's last n events for
``Proxy.transport_trace()``: a lab measurement, tools/lab/trace_nic.py). The presets are model parameters (nominal line rates; latency of the order the
vendors quote), not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import InvalidArgument

__all__ = ["PRESETS", "NicModel", "parse_nic_model", "decorate"]

# name -> (bw bytes/s, lat_us, reorder, window_us, what it stands for)
PRESETS: dict[str, tuple[float, float, float, float, str]] = {
    "efa-400g": (50e9, 10.0, 1.0, 10.0, "one 400 Gb/s EFA device (p6-b200: one per GPU); SRD: unordered"),
    "efa-200g": (25e9, 10.0, 1.0, 10.0, "one 200 Gb/s EFA device (p5en: two per GPU, add nics=2); SRD: unordered"),
    "cx7-400g": (50e9, 3.0, 0.0, 0.0, "one 400 Gb/s ConnectX-7 (RC: in order)"),
}

_KEYS = {"bw": "bytes/s > 0 (e.g. 50e9)", "lat_us": "microseconds >= 0", "reorder": "a probability in [0, 1]",
         "window_us": "microseconds >= 0", "nics": "an integer in [1, 64]", "seed": "an integer >= 0",
         "mates": "0 or 1", "overlap": "0 or 1", "trace": "an integer in [0, 10000000]"}


@dataclass(frozen=True)
class NicModel:
    bw: float                 # bytes/s of one NIC
    lat_us: float = 0.0
    reorder: float = 0.0
    window_us: float = 0.0
    nics: int = 1             # NICs per rank (proxy thread t sends on NIC t mod nics)
    seed: int = 0
    mates: int = 0            # 1: node mates through the NIC too (the all-RDMA case)
    overlap: int = 1          # 1: the inner transport's delivery time counts toward lat_us; 0: adds to it
    trace: int = 0            # events each endpoint keeps for Proxy.transport_trace()
    label: str = ""           # the spec as given (for tables)

    @property
    def cap_bytes_per_s(self) -> float:
        """What one rank can send at most: every NIC of the rank at its line rate."""
        return self.bw * self.nics

    def spec(self) -> str:
        """The canonical form the native decorator parses (no ':' and no '+', so it nests in
        transport names)."""
        return (f"bw={int(round(self.bw))},lat_us={self.lat_us:.6f},reorder={self.reorder:.9f},"
                f"window_us={self.window_us:.6f},nics={self.nics},seed={self.seed},mates={self.mates},"
                f"overlap={self.overlap}"
                + (f",trace={self.trace}" if self.trace else ""))


def _number(argument: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"{argument} ({key})", _KEYS[key], repr(text)) from None
    if not math.isfinite(value):
        raise InvalidArgument(f"{argument} ({key})", _KEYS[key], repr(text))
    return value


def parse_nic_model(spec: str | None, argument: str = "UCCL_EP_NIC_MODEL") -> NicModel | None:
    """``spec`` -> NicModel, or None for an empty spec / ``off``. A bad preset, key or value raises
    InvalidArgument naming ``argument`` and the key."""
    text = (spec or "").strip()
    if text.lower() in ("", "off", "none", "0"):
        return None
    values: dict[str, float] = {}
    given: set[str] = set()
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if i == 0 and "=" not in part:
            if part not in PRESETS:
                raise InvalidArgument(argument, f"a preset ({', '.join(PRESETS)}) or key=value pairs "
                                                f"({', '.join(_KEYS)})", repr(part))
            bw, lat, reorder, window, _ = PRESETS[part]
            values.update(bw=bw, lat_us=lat, reorder=reorder, window_us=window)
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise InvalidArgument(argument, f"key=value pairs with keys {', '.join(_KEYS)} (after an optional "
                                            f"preset: {', '.join(PRESETS)})", repr(part))
        values[key] = _number(argument, key, value.strip())
        given.add(key)
    if "bw" not in values:
        raise InvalidArgument(f"{argument} (bw)", "a line rate: bw=<bytes/s> or a preset", repr(text))
    if not values["bw"] > 0:
        raise InvalidArgument(f"{argument} (bw)", _KEYS["bw"], values["bw"])
    for key in ("lat_us", "window_us"):
        if not values.get(key, 0.0) >= 0:
            raise InvalidArgument(f"{argument} ({key})", _KEYS[key], values[key])
    if not 0.0 <= values.get("reorder", 0.0) <= 1.0:
        raise InvalidArgument(f"{argument} (reorder)", _KEYS["reorder"], values["reorder"])
    for key, lo, hi in (("nics", 1, 64), ("seed", 0, 2**63 - 1), ("mates", 0, 1), ("overlap", 0, 1),
                         ("trace", 0, 10_000_000)):
        v = values.get(key, lo)
        if v != int(v) or not lo <= v <= hi:
            raise InvalidArgument(f"{argument} ({key})", _KEYS[key], v)
    model = NicModel(bw=values["bw"], lat_us=values.get("lat_us", 0.0), reorder=values.get("reorder", 0.0),
                     window_us=values.get("window_us", 0.0), nics=int(values.get("nics", 1)),
                     seed=int(values.get("seed", 0)), mates=int(values.get("mates", 0)),
                     overlap=int(values.get("overlap", 1)),
                     trace=int(values.get("trace", 0)), label=text)
    if "window_us" not in values and model.reorder > 0:
        model = replace(model, window_us=model.lat_us)
    return model


def decorate(transport: str, model: NicModel | None) -> str:
    """The transport name with the model around the part that reaches other nodes:
    ``loop`` -> ``nic:<spec>:loop``; ``ipc+fabric`` -> ``ipc+nic:<spec>:fabric``; a ``fault:``
    prefix stays outermost."""
    if model is None:
        return transport
    if transport.startswith("fault:"):
        return "fault:" + decorate(transport[len("fault:"):], model)
    if transport.startswith("nic:"):
        return transport
    local, plus, remote = transport.partition("+")
    if plus:
        if model.mates:  # the split transport's local part never reaches the model
            raise InvalidArgument("UCCL_EP_NIC_MODEL (mates)", f"0 with the split transport {transport!r} (its node "
                                  "mates go through the local part); mates=1 models a transport without one", 1)
        return f"{local}+{decorate(remote, model)}"
    return f"nic:{model.spec()}:{transport}"
