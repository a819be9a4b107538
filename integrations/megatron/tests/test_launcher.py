"""The ``uccl-ep-megatron`` launcher, as users run it (subprocesses): the hook is in place before
the training script parses Megatron's arguments, the script runs as ``__main__`` with its folder
on sys.path, and configuration mistakes end with one error line and exit status 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import neighbour  # found because the launcher puts the script's folder first on sys.path
    from megatron.training.arguments import parse_args
    import uccl_ep_megatron
    args = parse_args()
    print("RESULT " + json.dumps({"name": __name__, "argv0": sys.argv[0], "neighbour": neighbour.VALUE,
                                  "backend": args.moe_flex_dispatcher_backend,
                                  "uccl": uccl_ep_megatron.current().buffer_kwargs()}))
""")


def launch(env, *argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "uccl_ep_megatron", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def script(tmp_path):
    (tmp_path / "neighbour.py").write_text("VALUE = 42\n")
    path = tmp_path / "my_pretrain.py"
    path.write_text(SCRIPT)
    return str(path)


def test_run_script_with_uccl_flags(subprocess_env, script):
    proc = launch(subprocess_env, script, "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                  "uccl", "--uccl-timeout-s", "30", "--uccl-backend", "reference")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result == {"name": "__main__", "argv0": script, "neighbour": 42, "backend": "uccl",
                      "uccl": {"backend": "reference", "timeout_s": 30.0}}


def test_config_mistake_is_one_line_exit_2(subprocess_env, script):
    proc = launch(subprocess_env, "run", script, "--moe-token-dispatcher-type", "alltoall",
                  "--moe-flex-dispatcher-backend", "uccl")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("uccl-ep-megatron: error:")]
    assert len(errors) == 1 and "--moe-token-dispatcher-type" in errors[0] and "'flex'" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_and_info(subprocess_env):
    proc = launch(subprocess_env, "check", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                  "uccl", "--uccl-num-sms", "24", "--uccl-gpu-timeout-s", "9")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "uccl",
                       "moe_flex_dispatcher_num_sms": 24, "uccl": {"gpu_timeout_s": 9.0}}
    proc = launch(subprocess_env, "info")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["megatron_core"] == "0.19.2" and info["megatron_core_in_tested_window"]
    assert info["tested"] == ["0.19.0", "0.19.2"] and info["tested_window"] == "0.19.0..0.19.2"


def test_usage_errors(subprocess_env, tmp_path):
    proc = launch(subprocess_env, str(tmp_path / "missing.py"))
    assert proc.returncode == 2 and "no such training script" in proc.stderr
    proc = launch(subprocess_env, "pretrian")
    assert proc.returncode == 2 and "unknown command 'pretrian'" in proc.stderr


def test_console_script_installed(subprocess_env):
    """ci/setup.d/30-megatron.sh installs the distribution; its console script must work."""
    exe = shutil.which("uccl-ep-megatron", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.fail("uccl-ep-megatron console script missing next to the venv's python: run ci/setup.sh --test")
    proc = subprocess.run([exe, "info"], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout.splitlines()[-1])["megatron_core"] == "0.19.2"
