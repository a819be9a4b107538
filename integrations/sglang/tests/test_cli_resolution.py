"""`--moe-a2a-backend uccl` through SGLang's own parser and resolution (0.5.23 and 0.5.12)."""

from __future__ import annotations

import json

from conftest import run_py

_PARSE_AND_RESOLVE = """
    import json, os, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    argv = ["--model-path", {model!r}, "--tp", "2", "--load-format", "dummy", "--skip-tokenizer-init",
            "--device", "cpu"] + {extra!r}
    sa = prepare_server_args(argv)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
        from sglang.srt.arg_groups.model_override_base import resolved_view
        view = resolved_view(sa)
    else:
        view = sa   # before 0.5.19 resolution ran in __post_init__
    import uccl_ep
    import sglang.srt.layers.moe.token_dispatcher.deepep as dm
    print(json.dumps({{"backend": view.moe_a2a_backend, "ep_size": view.ep_size, "tp_size": view.tp_size,
                      "deepep_mode": str(view.deepep_mode), "flag": os.environ.get("UCCL_EP_SGLANG"),
                      "buffer_is_uccl_ep": getattr(dm, "Buffer", None) is uccl_ep.Buffer,
                      "config_is_uccl_ep": getattr(dm, "Config", None) is uccl_ep.Config,
                      "use_deepep": dm.use_deepep}}))
"""


def _resolve(model_dir, extra, version_path=None, env=None):
    return run_py(_PARSE_AND_RESOLVE.format(model=model_dir, extra=extra), version_path=version_path, env=env)


def test_uccl_resolves_to_deepep_path_with_ep_size(model_dir, sglang_version):
    _, path = sglang_version
    out = _resolve(model_dir, ["--moe-a2a-backend", "uccl", "--deepep-mode", "low_latency"], path)
    assert out["backend"] == "deepep"          # every DeepEP rule and model predicate applies
    assert out["ep_size"] == 2 == out["tp_size"]
    assert "low_latency" in out["deepep_mode"]
    assert out["flag"] == "1"
    assert out["buffer_is_uccl_ep"] and out["config_is_uccl_ep"] and out["use_deepep"]


def test_plain_deepep_is_left_alone(model_dir, sglang_version):
    _, path = sglang_version
    out = _resolve(model_dir, ["--moe-a2a-backend", "deepep"], path)
    assert out["backend"] == "deepep" and out["flag"] is None
    assert not out["buffer_is_uccl_ep"] and not out["config_is_uccl_ep"]


def test_uccl_is_rejected_when_the_plugin_is_not_loaded(model_dir):
    code = f"""
        import json, subprocess, sys
        from sglang.srt.plugins import load_plugins
        load_plugins()          # SGLANG_PLUGINS allows only another name: ours is skipped
        from sglang.srt.server_args import prepare_server_args
        try:
            prepare_server_args(["--model-path", {model_dir!r}, "--moe-a2a-backend", "uccl", "--device", "cpu"])
            print(json.dumps({{"exit": None}}))
        except SystemExit as e:
            print(json.dumps({{"exit": e.code}}))
    """
    assert run_py(code, env={"SGLANG_PLUGINS": "someone_else"}) == {"exit": 2}


def test_speculative_flag_accepts_uccl(model_dir, sglang_version):
    _, path = sglang_version
    code = f"""
        import json
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import argparse
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(["--model-path", {model_dir!r}, "--speculative-moe-a2a-backend", "uccl",
                                "--moe-a2a-backend", "uccl"])
        print(json.dumps({{"draft": ns.speculative_moe_a2a_backend, "main": ns.moe_a2a_backend}}))
    """
    assert run_py(code, version_path=path) == {"draft": "uccl", "main": "uccl"}


_ERRORS = """
    import json, logging, os
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from uccl_ep_sglang import support
    warned = []
    class H(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warned.append(record.getMessage())
    logging.getLogger("uccl_ep.sglang").addHandler(H())
    base = ["--model-path", {model!r}, "--tp", "2", "--load-format", "dummy", "--skip-tokenizer-init",
            "--device", "cpu", "--moe-a2a-backend", "uccl"]
    def attempt(extra):
        try:
            sa = prepare_server_args(base + extra)
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
            return {{"error": None}}
        except Exception as e:
            return {{"error": type(e).__name__, "msg": str(e), "mro": [c.__name__ for c in type(e).__mro__]}}
    out = {{}}
    out["mix"] = attempt(["--speculative-moe-a2a-backend", "deepep"])
    out["sbo"] = attempt(["--enable-single-batch-overlap"])
    if {new!r}:
        out["nvfp4"] = attempt(["--deepep-dispatcher-output-dtype", "nvfp4"])
    support.installed_version = lambda: "0.5.40"
    out["untested"] = attempt([])
    out["untested"]["warnings"] = [w for w in warned if "0.5.40" in w]
    support.installed_version = lambda: "0.5.9"
    out["too_old"] = attempt([])
    print(json.dumps(out))
"""


def test_unsupported_combinations_fail_clearly(model_dir, sglang_version):
    label, path = sglang_version
    out = run_py(_ERRORS.format(model=model_dir, new=label != "0.5.12"), version_path=path)
    assert out["mix"]["error"] == "InvalidArgument"
    assert "--speculative-moe-a2a-backend" in out["mix"]["msg"] and "deepep" in out["mix"]["msg"]
    assert out["sbo"]["error"] == "Unsupported" and "--enable-single-batch-overlap" in out["sbo"]["msg"]
    if "nvfp4" in out:
        assert out["nvfp4"]["error"] == "InvalidArgument"
        assert "--deepep-dispatcher-output-dtype" in out["nvfp4"]["msg"] and "nvfp4" in out["nvfp4"]["msg"]
    # outside the tested window: a warning naming the window, not a refusal
    assert out["untested"]["error"] is None
    assert len(out["untested"]["warnings"]) == 1 and "0.5.12..0.5.23" in out["untested"]["warnings"][0]
    assert out["too_old"]["error"] == "Unsupported" and "deep_ep drop-in" in out["too_old"]["msg"]
    # typed errors still satisfy callers that catch builtins
    assert "ValueError" in out["mix"]["mro"] and "NotImplementedError" in out["sbo"]["mro"]
