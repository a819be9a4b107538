"""uccl_ep's torch ops (core/csrc/torch_ops, loaded by uccl_ep.cuda.native_ops): an eager LL op's
allocation and launches in one native call must launch exactly what the Python path launches.

Both paths run one LowLatencyEngine over the HIP stand-in runtime (hip_standin.c logs every launch
with its parameter bytes), the same calls in the same buffer sets, fresh random inputs; every field of
every launch is compared, the per-call pointers against the tensors each path returned."""

from __future__ import annotations

import json
import os
import struct
import textwrap

import pytest

import hip_toolchain
from test_hip_runtime_loader import _calls, _run, _standin

pytestmark = pytest.mark.cpu


def test_the_torch_ops_are_built_and_load():
    from uccl_ep.cuda import native_ops
    assert native_ops.ops() is not None, native_ops.unavailable_reason()
    assert native_ops.unavailable_reason() is None


def test_a_missing_or_mismatched_library_is_refused_with_the_reason(monkeypatch, tmp_path):
    from uccl_ep import _C
    from uccl_ep.cuda import native_ops
    real = native_ops._library_path()
    monkeypatch.setattr(native_ops, "_library_path", lambda: str(tmp_path / "_ops.so"))
    ops, why = native_ops._load()
    assert ops is None and "was not built" in why and str(tmp_path) in why
    # an _ops.so built beside another _C (its op plan layout differs) is not trusted with plans
    monkeypatch.setattr(native_ops, "_library_path", lambda: real)
    monkeypatch.setattr(_C.cuda, "op_plan_abi", lambda: 0x1000000008)
    ops, why = native_ops._load()
    assert ops is None and "built for another uccl_ep._C" in why and "rebuild" in why
    monkeypatch.undo()
    ops, why = native_ops._load()
    assert ops is not None and why is None


def test_op_plans_refuse_what_the_driver_did_not_hand_out():
    """An OpPlan holds function handles and a host address the torch ops use as they are: a forged
    handle, a malformed launch or a missing error word is refused by name when the plan is made."""
    from uccl_ep import _C
    from uccl_ep.errors import InvalidArgument
    launch = (0, 0x1234, 256, 0, bytes(16), [0])
    with pytest.raises(InvalidArgument, match="function"):
        _C.cuda.OpPlan(launch, launch, [], 4096)
    with pytest.raises(InvalidArgument, match="send"):
        _C.cuda.OpPlan((0, 0x1234), launch, [], 4096)


CHILD = """
import json, os
import torch
from uccl_ep.cuda import ll, native_ops
from uccl_ep.tuning import Tuning
from standin_engine import KernelError, engine_context

ec, errors, mem = engine_context(Tuning(), 1 << 23)
eng = ll.LowLatencyEngine(ec)
ops = eng._torch_ops
assert ops is not None, native_ops.unavailable_reason()
gen = torch.Generator().manual_seed(int(os.environ["SEED"]))
T, H, E, K, num_max = 5, 1024, 8, 3, 6
x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
topk = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
w = torch.rand(T, K, generator=gen)
y = torch.randn(E // 2, 2 * num_max, H, generator=gen).to(torch.bfloat16)
cum = torch.zeros(E // 2, dtype=torch.int32)
wait = torch.zeros(2, dtype=torch.int64)
out_given = torch.empty(T, H, dtype=torch.bfloat16)
log = open(os.environ["STANDIN_LOG"], "a")


def desc(t):
    return None if t is None else [str(t.dtype), list(t.shape), list(t.stride()), t.data_ptr()]


result = {}
# per path the same calls in the same buffer sets: dispatch (FP8, stats), combine, dispatch by hook
# (BF16), combine into `out` by hook, zero-copy combine, then a dispatch with the error word set
for path in ("op", "python"):
    eng._torch_ops = ops if path == "op" else None
    rows = []
    log.write(f"PATH {path}\\n"); log.flush()
    (rx, sc), cnt, h, fin = eng.dispatch(None, x, topk, num_max, E, True, False, False, set(), cum, wait,
                                         recv_follows=True)
    fin(True)
    rows.append(dict(outs=[desc(t) for t in (rx, sc, cnt, h[0], h[1])]))
    res, fin = eng.combine(y, topk, w, h, set(), None, wait, False, recv_follows=True)
    fin(True)
    rows.append(dict(outs=[desc(res)], src=[h[0].data_ptr(), h[1].data_ptr()]))
    rx, cnt, h, fin = eng.dispatch(None, x, topk, num_max, E, False, False, False, set(), None, None)
    fin()
    rows.append(dict(outs=[desc(t) for t in (rx, cnt, h[0], h[1])]))
    res, fin = eng.combine(y, topk, w, h, set(), out_given, None, False)
    fin()
    rows.append(dict(outs=[desc(res)], src=[h[0].data_ptr(), h[1].data_ptr()], same=res is out_given))
    res, fin = eng.combine(y, topk, w, h, set(), None, None, True, recv_follows=True)
    fin(True)
    rows.append(dict(outs=[desc(res)], src=[h[0].data_ptr(), h[1].data_ptr()]))
    errors.set_int32(0, 5)
    (rx, sc), cnt, h, fin = eng.dispatch(None, x, topk, num_max, E, True, False, False, set(), None, None,
                                         recv_follows=True)
    try:
        fin(True)
        raised = False
    except KernelError:
        raised = True
    errors.set_int32(0, 0)
    rows.append(dict(raised=raised))
    # an empty batch (a rank with no tokens this step): one block still runs each kernel
    (rx, sc), cnt, h, fin = eng.dispatch(None, x[:0], topk[:0], num_max, E, True, False, False, set(), None, None,
                                         recv_follows=True)
    fin(True)
    rows.append(dict(outs=[desc(t) for t in (rx, sc, cnt, h[0], h[1])]))
    res, fin = eng.combine(y, topk[:0], w[:0], h, set(), None, None, False, recv_follows=True)
    fin(True)
    rows.append(dict(outs=[desc(res)], src=[h[0].data_ptr(), h[1].data_ptr()]))
    result[path] = rows
log.write("END\\n"); log.flush()
print(json.dumps(dict(result, x=x.data_ptr(), topk=topk.data_ptr(), w=w.data_ptr(), y=y.data_ptr(),
                      cum=cum.data_ptr(), wait=wait.data_ptr(), send_area=mem.ptr)))
"""

_POINTER_OUTPUTS = {"ll_dispatch_recv": ("recv_x", "recv_scales", "recv_count", "src_info", "layout_range")}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_torch_op_launches_what_the_python_path_launches(tmp_path, seed):
    if hip_toolchain.clang() is None:
        if os.environ.get("CI"):
            pytest.fail("clang-22 / HIP headers missing on CI: ci/setup.d/20-gpu-toolchain.sh should install them")
        pytest.skip("clang-22 with Debian's HIP headers not installed (ci/setup.d/20-gpu-toolchain.sh)")
    from uccl_ep.cuda import runtime
    structs = {"ll_dispatch_send": "LLDispatchParams", "ll_dispatch_recv": "LLDispatchRecvParams",
               "ll_combine_send": "LLCombineParams", "ll_combine_recv": "LLCombineRecvParams"}
    fields = {k: runtime.param_fields(v) for k, v in structs.items()}
    lib, log = tmp_path / "lib", tmp_path / "calls.log"
    _standin(lib)
    here = os.path.dirname(os.path.abspath(__file__))
    out = _run(lib, log, textwrap.dedent(CHILD), SEED=str(seed), UCCL_EP_CUDA_ARCH="gfx942",
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
               UCCL_EP_HIPCC=str(hip_toolchain.hipcc_wrapper(tmp_path)),
               UCCL_EP_JIT_CACHE_DIR=os.path.expanduser("~/.cache/uccl_ep/ci-hip-jit"),
               STANDIN_PARAM_BYTES=",".join(f"{k}={8 * len(v)}" for k, v in fields.items()))
    calls = _calls(log)
    op_at, py_at, end = calls.index(["PATH", "op"]), calls.index(["PATH", "python"]), calls.index(["END"])

    def launches(part):
        return [dict(kernel=c[1], geometry=c[2:10], params=dict(zip(fields[c[1]], struct.unpack(
            f"<{len(fields[c[1]])}Q", bytes.fromhex(c[10]))))) for c in part if c[0] == "hipModuleLaunchKernel"]

    op, py = launches(calls[op_at:py_at]), launches(calls[py_at:end])
    # dispatch, combine, dispatch (hook), combine (hook), zero-copy combine: two launches each; the
    # dispatch with the error word set: its send only
    expected = ["ll_dispatch_send", "ll_dispatch_recv", "ll_combine_send", "ll_combine_recv"] * 2 + [
        "ll_combine_send", "ll_combine_recv", "ll_dispatch_send"] + [
        "ll_dispatch_send", "ll_dispatch_recv", "ll_combine_send", "ll_combine_recv"]
    assert [l["kernel"] for l in py] == expected
    assert [l["kernel"] for l in op] == expected

    # outputs: same dtypes, shapes and strides; the launches' pointers are each path's own tensors
    for a, b in zip(out["op"][:5] + out["op"][6:], out["python"][:5] + out["python"][6:]):
        assert [o and o[:3] for o in a["outs"]] == [o and o[:3] for o in b["outs"]]
    assert out["op"][3]["same"] and out["python"][3]["same"], "combine into `out` returns `out`"
    assert out["op"][5]["raised"] and out["python"][5]["raised"], "a set error word raises before the receive"

    def per_call(path, i, launch):
        """The fields one call fills in, as the caller's tensors say they must be."""
        rows, p = out[path], launch["params"]
        k = launch["kernel"]
        T = 0 if i >= 6 else 5
        if k == "ll_dispatch_send":  # with no tokens the kernel reads neither (an empty tensor may have no address)
            return dict(x=out["x"] if T else p["x"], topk_idx=out["topk"] if T else p["topk_idx"], num_tokens=T)
        if k == "ll_dispatch_recv":
            outs = rows[i]["outs"]
            ptrs = [o[3] for o in outs] if len(outs) == 5 else [outs[0][3], 0, *(o[3] for o in outs[1:])]
            stats = (out["cum"], out["wait"]) if i == 0 else (0, 0)
            return dict(zip(("recv_x", "recv_scales", "recv_count", "src_info", "layout_range", "cumulative_stats",
                             "wait_stats"), (*ptrs, *stats)))
        if k == "ll_combine_send":
            y = p["y"] if i == 4 else out["y"]  # zero-copy: the engine's own send area
            return dict(y=y, src_info=rows[i]["src"][0], layout_range=rows[i]["src"][1])
        return dict(topk_idx=out["topk"] if T else p["topk_idx"], topk_weights=out["w"] if T else p["topk_weights"],
                    out=rows[i]["outs"][0][3], wait_stats=out["wait"] if i == 1 else 0, num_tokens=T, num_topk=3)

    call_of = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 6, 7, 7]
    for j, (a, b) in enumerate(zip(op, py)):
        assert a["geometry"] == b["geometry"], (j, a["kernel"])
        want_a, want_b = per_call("op", call_of[j], a), per_call("python", call_of[j], b)
        for name, value in want_a.items():
            assert a["params"][name] == value, (j, a["kernel"], name)
        for name, value in want_b.items():
            assert b["params"][name] == value, (j, b["kernel"], name)
        fixed = [n for n in fields[a["kernel"]] if n not in want_a]
        assert {n: a["params"][n] for n in fixed} == {n: b["params"][n] for n in fixed}, (j, a["kernel"])
    assert op[8]["params"]["y"] == py[8]["params"]["y"] != out["y"], "zero-copy combine sends from the buffer"
    assert json.dumps(out["op"][5]) == json.dumps(out["python"][5])
