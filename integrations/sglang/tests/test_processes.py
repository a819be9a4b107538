"""The dispatcher swap in fresh processes (as SGLang's scheduler processes start), and SGLang's own
DeepEP dispatcher classes driving uccl_ep on 2 CPU ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import PLUGIN_ROOT, REPO, run_py

_CHILD_VIEW = """
    import json
    {before}
    from sglang.srt.plugins import load_plugins
    load_plugins()            # first line of run_scheduler_process
    import uccl_ep, uccl_ep_sglang
    import sglang.srt.layers.moe.token_dispatcher.deepep as dm
    swapped = getattr(dm, "Buffer", None) is uccl_ep.Buffer
    print(json.dumps({{"buffer": swapped,
                      "config": swapped and isinstance(dm.Config(num_sms=24), uccl_ep.Config),
                      "num_sms": dm.Buffer.num_sms if swapped else None, "use_deepep": dm.use_deepep,
                      "status": uccl_ep_sglang.plugin_status()["dispatcher_swapped"]}}))
"""


def test_fresh_process_with_flag_swaps_dispatcher(sglang_version):
    _, path = sglang_version
    out = run_py(_CHILD_VIEW.format(before=""), version_path=path, env={"UCCL_EP_SGLANG": "1"})
    assert out == {"buffer": True, "config": True, "num_sms": 20, "use_deepep": True, "status": True}


def test_dispatcher_imported_before_plugins_is_rebound():
    before = "import sglang.srt.layers.moe.token_dispatcher.deepep as early; assert early.use_deepep is False"
    out = run_py(_CHILD_VIEW.format(before=before), env={"UCCL_EP_SGLANG": "1"})
    assert out["buffer"] and out["use_deepep"] and out["status"]


def test_fresh_process_without_flag_keeps_sgl_deep_ep():
    out = run_py(_CHILD_VIEW.format(before=""))
    # on this GPU-less machine sgl-deep-ep's import fails and SGLang keeps DeepEP off, untouched
    assert out == {"buffer": False, "config": False, "num_sms": None, "use_deepep": False, "status": False}


def test_spawned_child_inherits_selection(model_dir):
    # The launcher resolves `--moe-a2a-backend uccl`; a process it spawns afterwards (as SGLang spawns
    # its schedulers) loads plugins and must come up with the swapped dispatcher without any flag of ours.
    code = f"""
        import json, multiprocessing as mp
        def child(q):
            from sglang.srt.plugins import load_plugins
            load_plugins()
            import uccl_ep
            import sglang.srt.layers.moe.token_dispatcher.deepep as dm
            q.put(dm.Buffer is uccl_ep.Buffer)
        if __name__ == "__main__":
            from sglang.srt.plugins import load_plugins
            load_plugins()
            from sglang.srt.server_args import prepare_server_args
            sa = prepare_server_args(["--model-path", {model_dir!r}, "--tp", "2", "--moe-a2a-backend", "uccl",
                                      "--load-format", "dummy", "--skip-tokenizer-init", "--device", "cpu"])
            sa.resolve_once()
            ctx = mp.get_context("spawn"); q = ctx.Queue(); p = ctx.Process(target=child, args=(q,))
            p.start(); got = q.get(timeout=180); p.join(timeout=30)
            print(json.dumps({{"child_swapped": got}}))
    """
    path = REPO / ".pytest-sglang-spawn.py"
    path.write_text(__import__("textwrap").dedent(code))
    try:
        out = run_py(f"import runpy; runpy.run_path({str(path)!r}, run_name='__main__')")
    finally:
        path.unlink()
    assert out == {"child_swapped": True}


@pytest.mark.parametrize("backend", ["host", "reference"])
def test_sglang_deepep_dispatcher_runs_on_uccl_ep_cpu(backend, executor_summary):
    # host: the real queue -> proxy -> transport path under SGLang's calls; reference: the oracle run.
    # Both are checked against an independent torch MoE inside the driver.
    proc = subprocess.run([sys.executable, str(PLUGIN_ROOT / "gpu" / "drive_deepep_dispatcher.py"), "--device", "cpu",
                           "--backend", backend, "--timeout", "240"], capture_output=True, text=True, timeout=300,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["sglang_deepep_dispatcher"] == "PASS" and summary["executors"] == [backend]
    assert {"low_latency+tbo", "auto+tbo"} <= set(summary["scenarios"])
    executor_summary.append(f"SGLang DeepEPDispatcher driver ({', '.join(summary['scenarios'])}): {backend}")
