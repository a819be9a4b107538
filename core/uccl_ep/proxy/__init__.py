"""Python side of the proxy core: protocol limits, bootstrap over a torch.distributed Store, and
the native `Proxy` (csrc/proxy/proxy.h) that executes 16-byte TransferCmds over a transport.

    from uccl_ep import proxy
    proxy.check_protocol_limits(num_ranks=..., num_experts=..., num_max_tokens=..., hidden=...)
    p = proxy.start_proxy(group, region_bytes=1 << 24, num_counters=64)   # collective
    idx = p.push(0, *proxy.native().encode_counted_write(1, 0, 0, 4096, 3), 10.0)
    p.wait_counter(src=0, counter=3, target=1, timeout_s=10.0, phase="demo")
    p.stop()
"""

from __future__ import annotations

from .limits import check_protocol_limits, protocol_limits
from .bootstrap import fabric_domains, native, start_proxy, token_digest, transport_unavailable_reason

__all__ = ["check_protocol_limits", "protocol_limits", "native", "start_proxy", "token_digest",
           "transport_unavailable_reason", "fabric_domains"]
