"""`uccl_ep.refs`: the pure-torch reference of DeepEP V1's Buffer semantics.

It defines what every executor must produce. Use it directly with
``uccl_ep.Buffer(group, ..., backend="reference")``, or call its pieces:

- `refs.normal`: layout, dispatch, cached dispatch, combine (normal mode);
- `refs.low_latency`: per-expert dispatch and weighted combine (LL mode);
- `refs.logfmt`: LogFMT-10, the format of ``low_latency_combine(use_logfmt=True)``;
- `refs.fp8`: DeepEP's per-128-channel e4m3 cast, UE8M0 packing, dequantization.
"""

from . import fp8, logfmt, low_latency, normal
from .fp8 import per_token_cast_back, per_token_cast_to_fp8, pack_ue8m0, unpack_ue8m0
from .normal import dispatch_layout

__all__ = ["fp8", "logfmt", "normal", "low_latency", "dispatch_layout", "per_token_cast_to_fp8", "per_token_cast_back",
           "pack_ue8m0", "unpack_ue8m0"]
