"""uccl-ep-vllm on vLLM 0.33.0 (CPU): CLI values, ParallelConfig, process flag, `deep_ep` alias,
the DeepEP path each value selects, errors, plugin_status()."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import PLUGIN_ROOT, REPO, run_py

_SELECT = """
    import json, os, argparse
    import vllm.engine.arg_utils as au          # loaded in the front end before plugins run
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.config.parallel import ParallelConfig
    choices = au.get_kwargs(ParallelConfig)["all2all_backend"]["choices"]
    p = argparse.ArgumentParser()
    p.add_argument("--all2all-backend", **au.get_kwargs(ParallelConfig)["all2all_backend"])
    parsed = p.parse_args(["--all2all-backend", {value!r}]).all2all_backend
    pc = ParallelConfig(all2all_backend=parsed, data_parallel_size=1)
    dbo = ParallelConfig(all2all_backend=parsed, enable_dbo=True)   # --enable-dbo stays allowed
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig
    moe = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=2, ep_size=2, tp_rank=0, pcp_rank=0, dp_rank=0,
                                 ep_rank=0, sp_size=1, use_ep=True, all2all_backend=pc.all2all_backend,
                                 enable_eplb=False)
    import uccl_ep
    from vllm.utils.import_utils import has_deep_ep
    import deep_ep
    print(json.dumps({{"choices": [c for c in choices if c.startswith("uccl")], "parsed": parsed,
                      "config": pc.all2all_backend, "flag": os.environ.get("UCCL_EP_VLLM"),
                      "ray_copy": os.environ.get("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"),
                      "dbo": [dbo.all2all_backend, dbo.use_ubatching, dbo.num_ubatches],
                      "ht": moe.use_deepep_ht_kernels, "ll": moe.use_deepep_ll_kernels,
                      "has_deep_ep": has_deep_ep(), "alias": deep_ep.Buffer is uccl_ep.Buffer}}))
"""


@pytest.mark.parametrize("value,vllm_value", [("uccl_low_latency", "deepep_low_latency"),
                                              ("uccl_high_throughput", "deepep_high_throughput")])
def test_value_parses_validates_and_selects_deepep_path(value, vllm_value):
    out = run_py(_SELECT.format(value=value))
    assert out["choices"] == ["uccl_low_latency", "uccl_high_throughput"]
    assert out["parsed"] == value and out["config"] == vllm_value
    assert out["flag"] == "1" and "UCCL_EP_VLLM" in out["ray_copy"].split(",")
    # DBO: allowed with both values (test_modular_kernel.py drives vLLM's DBO path on uccl_ep)
    assert out["dbo"] == [vllm_value, True, 2]
    # the prepare/finalize class vLLM picks for this config: DeepEP HT or LL
    assert out["ht"] is (value == "uccl_high_throughput") and out["ll"] is (value == "uccl_low_latency")
    assert out["has_deep_ep"] and out["alias"]


def test_values_are_refused_without_the_plugin():
    code = """
        import json
        from vllm.plugins import load_general_plugins
        load_general_plugins()                       # VLLM_PLUGINS names another plugin: ours is skipped
        from vllm.config.parallel import ParallelConfig
        import vllm.engine.arg_utils as au
        try:
            ParallelConfig(all2all_backend="uccl_low_latency"); err = None
        except Exception as e:
            err = type(e).__name__
        print(json.dumps({"err": err, "choices": [c for c in au.get_kwargs(ParallelConfig)["all2all_backend"]["choices"]
                                                  if c.startswith("uccl")]}))
    """
    assert run_py(code, env={"VLLM_PLUGINS": "someone_else"}) == {"err": "ValidationError", "choices": []}


def test_worker_process_with_flag_gets_alias_and_managers_build_uccl_ep():
    # An engine-core/worker process: inherits UCCL_EP_VLLM, loads general plugins, and vLLM's DeepEP
    # modules (imported before or after) see uccl_ep as deep_ep.
    code = """
        import json
        import vllm.model_executor.layers.fused_moe.all2all_utils as utils   # imported before the plugin ran
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import uccl_ep, uccl_ep_vllm
        import vllm.distributed.device_communicators.all2all as a2a
        import vllm.model_executor.layers.fused_moe.prepare_finalize.deepep_ll as ll
        print(json.dumps({"ll_module": ll.deep_ep.Buffer is uccl_ep.Buffer,
                          "utils_ht": utils.DeepEPHTPrepareAndFinalize.__module__,
                          "status": uccl_ep_vllm.plugin_status()["deep_ep_is_uccl_ep"]}))
    """
    out = run_py(code, env={"UCCL_EP_VLLM": "1"})
    assert out == {"ll_module": True, "status": True,
                   "utils_ht": "vllm.model_executor.layers.fused_moe.prepare_finalize.deepep_ht"}


def test_errors_name_the_problem():
    code = """
        import json, logging, os
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm.config.parallel import ParallelConfig
        from uccl_ep_vllm import support
        warned = []
        class H(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.WARNING:
                    warned.append(record.getMessage())
        logging.getLogger("uccl_ep.vllm").addHandler(H())
        def attempt(value):
            try:
                ParallelConfig(all2all_backend=value); return None
            except Exception as e:
                return [type(e).__name__, str(e)]
        out = {}
        os.environ["VLLM_DEEPEPLL_NVFP4_DISPATCH"] = "1"
        out["nvfp4"] = attempt("uccl_low_latency")
        out["nvfp4_ht"] = attempt("uccl_high_throughput")
        del os.environ["VLLM_DEEPEPLL_NVFP4_DISPATCH"]
        support.installed_version = lambda: "0.34.1"
        out["untested"] = attempt("uccl_low_latency")
        out["warnings"] = [w for w in warned if "0.34.1" in w]
        support.installed_version = lambda: "0.33.2+cu130"
        out["patch_release"] = attempt("uccl_low_latency")
        out["warnings_patch"] = [w for w in warned if "0.33.2" in w]
        print(json.dumps(out))
    """
    out = run_py(code)
    assert out["nvfp4"][0] == "Unsupported" and "VLLM_DEEPEPLL_NVFP4_DISPATCH" in out["nvfp4"][1]
    assert out["nvfp4_ht"] is None
    # outside the tested window: a warning naming the window, not a refusal; a patch release is inside
    assert out["untested"] is None and len(out["warnings"]) == 1 and "0.33.x" in out["warnings"][0]
    assert out["patch_release"] is None and out["warnings_patch"] == []


def test_plugin_status_is_cheap_and_complete():
    out = run_py("""
        import json, sys
        import uccl_ep_vllm
        st = uccl_ep_vllm.plugin_status()
        print(json.dumps({"status": st, "heavy": sorted(m for m in ("torch", "vllm", "uccl_ep.buffer") if m in sys.modules)}))
    """)
    st = out["status"]
    assert out["heavy"] == []
    assert st["framework_version"] == "0.33.0" and st["in_supported_range"] and st["entry_point_registered"]
    assert st["problems"] == [] and st["flag_set"] is False and st["deep_ep_is_uccl_ep"] is False
    assert st["backends"] == {"uccl_low_latency": "deepep_low_latency",
                              "uccl_high_throughput": "deepep_high_throughput"}


@pytest.mark.parametrize("backend", ["host", "reference"])
def test_vllm_deepep_prepare_finalize_run_on_uccl_ep_cpu(backend, executor_summary):
    # host: the real queue -> proxy -> transport path under vLLM's calls; reference: the oracle run.
    # Both are checked against an independent torch MoE inside the driver.
    proc = subprocess.run([sys.executable, str(PLUGIN_ROOT / "gpu" / "drive_deepep_prepare_finalize.py"),
                           "--device", "cpu", "--backend", backend, "--timeout", "240"], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["vllm_deepep_prepare_finalize"] == "PASS" and summary["executors"] == [backend]
    executor_summary.append(f"vLLM DeepEP HT/LL prepare/finalize driver ({', '.join(summary['modes'])}): {backend}")


def test_vllm_deepep_backends_with_the_deep_ep_drop_in(executor_summary):
    # vLLM's own deepep_* path, no uccl_* value, no alias: `deep_ep` is uccl-ep's drop-in package.
    env = {k: v for k, v in __import__("os").environ.items() if k != "UCCL_EP_VLLM"}
    proc = subprocess.run([sys.executable, str(PLUGIN_ROOT / "gpu" / "drive_deepep_prepare_finalize.py"),
                           "--device", "cpu", "--route", "drop-in", "--timeout", "240"], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["vllm_deepep_prepare_finalize"] == "PASS" and summary["route"] == "drop-in"
    assert summary["executors"] == ["host"]
    executor_summary.append("vLLM deepep_* prepare/finalize with the deep_ep drop-in (ht, ll): host")
