"""What the pieces of an eager call's host path cost on this machine: not a test.

python tools/lab/host_costs.py        (one GPU, no process group)

Each row is the host µs of one call of a primitive an eager LL op is made of (torch allocations and
views, pointer reads, the stream query, a launch through uccl_ep's driver binding, parameter
packing, the handle and event objects), best of 5 batches. Launches are timed while a sleep kernel
keeps the GPU busy, so none waits for the device. Issue 30: where the host path's microseconds go.
"""

from __future__ import annotations

import time

import torch


def _best(fn, n=2000, rounds=5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    return best


def _launches(fn, n=200, rounds=5) -> float:
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e7))
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return best


def main() -> None:
    from uccl_ep.cuda.ht import launch_layout
    from uccl_ep.cuda.ll import dispatch_outputs
    from uccl_ep.cuda.runtime import ParamTemplate, current_stream, driver, load_kernel
    from uccl_ep.events import EventOverlap
    from uccl_ep.handles import LowLatencyHandle
    from uccl_ep.protocol.ll_plan import LowLatencyPlan
    from uccl_ep.validate import tensor_signature

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(0)
    E_loc, R, T, H = 144, 2, 128, 7168
    x = torch.randn(T, H, device=dev).to(torch.bfloat16)
    idx = torch.randint(0, 288, (T, 8), device=dev)
    ints = torch.empty(1024, dtype=torch.int32, device=dev)
    rows = {}
    rows["torch.empty fp8 [E_loc, R*T, H]"] = _best(lambda: torch.empty((E_loc, R * T, H), dtype=torch.float8_e4m3fn,
                                                                       device=dev))
    rows["torch.empty int32 [n] (device int)"] = _best(lambda: torch.empty(1024, dtype=torch.int32, device=0))
    rows["torch.empty_strided f32"] = _best(lambda: torch.empty_strided((E_loc, R * T, 56), (56 * R * T, 1, R * T),
                                                                        dtype=torch.float32, device=dev))
    rows["x.new_empty(shape)"] = _best(lambda: x.new_empty((T, H)))
    rows["ints[:E] (slice)"] = _best(lambda: ints[:144])
    rows["ints[pad:].view(shape)"] = _best(lambda: ints[256:].view(2, 384))
    rows["x.data_ptr()"] = _best(lambda: x.data_ptr())
    rows["x.contiguous() (already)"] = _best(lambda: x.contiguous())
    rows["x.shape"] = _best(lambda: x.shape)
    rows["x.device"] = _best(lambda: x.device)
    rows["x.is_contiguous()"] = _best(lambda: x.is_contiguous())
    rows["tensor_signature(x)"] = _best(lambda: tensor_signature(x))
    rows["current_stream(0)"] = _best(lambda: current_stream(0))
    rows["torch.cuda.current_stream()"] = _best(lambda: torch.cuda.current_stream())
    rows["dispatch_outputs (fp8)"] = _best(lambda: dispatch_outputs(dev, E_loc, R, T, H, True, False), n=500)
    send = ParamTemplate("HTLayoutParams", ("topk_idx", "num_tokens_per_rank", "num_tokens"), num_tokens_per_expert=0,
                         is_token_in_rank=0, num_topk=8, num_experts=288, num_ranks=2)
    rows["ParamTemplate.pack (3 fields)"] = _best(lambda: send.pack(x.data_ptr(), idx.data_ptr(), T))
    plan = dict(num_tokens=T, num_max=T, hidden=H, num_experts=288, recv_count=ints, masked_at_dispatch=())
    rows["LowLatencyPlan(...)"] = _best(lambda: LowLatencyPlan(**plan))
    p = LowLatencyPlan(**plan)
    rows["LowLatencyHandle(...)"] = _best(lambda: LowLatencyHandle((ints, ints, T, H, 288), None, p))
    rows["EventOverlap(None)"] = _best(lambda: EventOverlap(None))
    rows["torch.cuda.Event()"] = _best(lambda: torch.cuda.Event())
    k = load_kernel(0, "layout.cu", "ht_layout")
    drv = driver()
    small = torch.randint(0, 64, (1, 2), device=dev)
    out = torch.zeros(128, dtype=torch.int32, device=dev)
    inr = torch.empty(1, 2, dtype=torch.bool, device=dev)
    from uccl_ep.cuda.runtime import pack_params
    params = pack_params("HTLayoutParams", topk_idx=small.data_ptr(), num_tokens_per_rank=out.data_ptr(),
                         num_tokens_per_expert=out.data_ptr() + 8, is_token_in_rank=inr.data_ptr(), num_tokens=1,
                         num_topk=2, num_experts=64, num_ranks=2)
    s = current_stream(0)
    rows["Kernel.launch (ht_layout, 1 block)"] = _launches(lambda: k.launch(1, 256, params, s, smem=4 * 66))
    rows["drv.launch direct"] = _launches(lambda: drv.launch(0, k.function, (1, 1, 1), (256, 1, 1), 264, s, params,
                                                             False, False))
    rows["Kernel.launch programmatic"] = _launches(lambda: k.launch(1, 256, params, s, smem=4 * 66, programmatic=True))
    rows["launch_layout (alloc + launch)"] = _launches(lambda: launch_layout(k, 2, small, 64))
    rows["torch add_ (a torch kernel launch)"] = _launches(lambda: out.add_(1))
    torch.cuda.synchronize()
    print(f"{'piece':44s} {'host us':>8s}")
    for name, us in rows.items():
        print(f"{name:44s} {us:8.2f}")


if __name__ == "__main__":
    main()
