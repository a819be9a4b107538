"""Recording fakes of the CUDA driver layer for the engines' host-side tests on CPU (no GPU): device
memory as address ranges, kernels that log their launches, the parameter unpacker, and one dispatch
through a recording engine (the fixture of test_ipc_transport_proxy_path.py)."""

from __future__ import annotations

import struct

import torch

from uccl_ep.cuda import runtime

DEV = 1 << 46  # fake device address = host address + DEV


class FakeDrv:
    """The driver calls the proxy session and the LL engines make: host registration checked and
    recorded, device pointers = host pointers + `offset`, copies to the device recorded (not done)."""

    ATTR_SM_COUNT = 16

    def __init__(self, sms=3, offset=DEV):
        self.sms, self.offset = sms, offset
        self.registered, self.unregistered, self.h2d = [], [], {}

    def device_attribute(self, dev, attr):
        return self.sms

    def host_register(self, dev, base, nbytes):
        assert base % 4096 == 0 and nbytes % 4096 == 0
        self.registered.append((base, nbytes))

    def host_unregister(self, dev, base):
        self.unregistered.append(base)

    def host_device_pointer(self, dev, p):
        assert any(b <= p < b + n for b, n in self.registered), f"{p:#x} is not registered"
        return p + self.offset

    def memset_d8(self, dev, ptr, value, nbytes, stream):
        pass

    def memcpy_htod(self, dev, ptr, blob):
        self.h2d[ptr] = bytes(blob)

    def memcpy_dtoh(self, dev, ptr, nbytes):
        return self.h2d[ptr][:nbytes]

    def synchronize(self, dev):
        pass


class FakeMem:
    next_ptr = 1 << 40

    def __init__(self, device, nbytes):
        self.device, self.nbytes, self.ptr = device, nbytes, FakeMem.next_ptr
        FakeMem.next_ptr += (nbytes // 4096 + 2) * 4096

    def free(self):
        self.ptr = 0


class FakeKernel:
    def __init__(self, log, name, defines=()):
        self.log, self.name, self.defines = log, name, defines

    def launch(self, grid, block, params, stream, smem=0, cooperative=False, programmatic=False):
        self.log.append((self.name, grid, block, params, smem, programmatic))


def unpack_params(struct_name, params):
    fields = runtime.param_fields(struct_name)
    assert len(params) == 8 * len(fields)
    return dict(zip(fields, struct.unpack(f"<{len(fields)}q", params)))


def dispatched(engine, seed):
    """One FP8 dispatch of fresh random tokens (top-4) through the recording engine, its receive
    launched: (topk, weights, handle, zeroed combine input y)."""
    eng, T, H, E, R = engine.eng, engine.T, engine.H, engine.E, engine.R
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16()
    topk = torch.rand(T, E, generator=g).topk(4, dim=1).indices
    w = torch.rand(T, 4, generator=g)
    out = eng.dispatch(None, x, topk, T, E, True, False, False, set(), None, None)
    out[3]()
    return topk, w, out[2], torch.zeros(E // R, R * T, H, dtype=torch.bfloat16)
