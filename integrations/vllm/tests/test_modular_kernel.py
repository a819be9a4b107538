"""vLLM's modular MoE kernel on uccl_ep (CPU, host executor): `FusedMoEKernel` around vLLM's DeepEP
LL/HT prepare/finalize, with BF16, FP8 and UE8M0 dispatch, each without and with DBO micro-batching
(`--enable-dbo`), against an independent torch MoE (gpu/drive_modular_kernel.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import PLUGIN_ROOT, REPO

CASES = ["ll-bf16", "ll-fp8", "ll-ue8m0", "ht-bf16", "ht-fp8"]


def test_fused_moe_kernel_fp8_ue8m0_and_dbo_on_uccl_ep(executor_summary):
    # One run for all cases (each ~1 s; the two vLLM rank processes cost the rest).
    proc = subprocess.run([sys.executable, str(PLUGIN_ROOT / "gpu" / "drive_modular_kernel.py"), "--device", "cpu",
                           "--dbo", "both", "--timeout", "240"], capture_output=True, text=True, timeout=300,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    lines = [json.loads(l) for l in proc.stdout.strip().splitlines() if l.startswith("{")]
    summary, ranks = lines[-1], lines[:-1]
    keys = CASES + [c + "+dbo" for c in CASES]
    assert summary["vllm_modular_kernel"] == "PASS" and summary["cases"] == keys
    assert summary["executors"] == ["host"]
    for res in ranks:
        assert res["ll-fp8"]["dispatched"] == {"use_fp8": True, "round_scale": False, "use_ue8m0": False}
        # vLLM's post_init_setup turned UE8M0 on because the experts take packed scales
        assert res["ll-ue8m0"]["dispatched"] == {"use_fp8": True, "round_scale": True, "use_ue8m0": True}
        assert res["ht-fp8"]["dispatched"] == ["torch.float8_e4m3fn", "torch.float32"]
        assert res["ll-bf16+dbo"]["ops"] == [["dispatch", 0], ["dispatch", 1], ["combine", 0], ["combine", 1]]
        assert all(res[k]["calc_diff"] < 2e-5 for k in keys)
    executor_summary.append("vLLM FusedMoEKernel (DeepEP LL/HT prepare/finalize; BF16, FP8, UE8M0; "
                            "without and with DBO): host")
