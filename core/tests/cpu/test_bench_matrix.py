"""`uccl-ep bench --matrix` on CPU: a tiny matrix end to end (uccl-ep on the host backend, a DeepEP
stand-in on the reference backend), DeepEP detection that refuses uccl-ep's drop-in `deep_ep`,
budgets that list what they skip, and the report's baseline and ratio columns."""

import json
import os
import subprocess
import sys
import textwrap

import pytest


pytestmark = pytest.mark.cpu

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHIM = os.path.join(REPO, "integrations", "deep_ep")
TINY = ["--matrix-tokens", "8,16", "--matrix-hidden", "256", "--matrix-routing", "2x8", "--matrix-sms", "24",
        "--iters", "2", "--warmup", "0"]

# A test double with DeepEP V1's Buffer API (the calls the matrix makes), delegating to uccl_ep's
# reference backend by composition: it exercises the baseline's plumbing on CPU, where the real
# DeepEP cannot run. Detection accepts it because it is not uccl_ep.Buffer nor a subclass, and it
# ships a `deep_ep_cpp` module, as the real build does.
FAKE_DEEP_EP = '''
import torch
import uccl_ep

DESTROYED = []
CORRUPT = False  # a broken baseline: its normal-mode dispatch returns wrong rows


class Buffer:
    num_sms = 20

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, use_fabric=False,
                 explicitly_destroy=False, enable_shrink=False, comm=None):
        self.explicitly_destroy = explicitly_destroy
        self.runtime = uccl_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode=low_latency_mode,
                                      num_qps_per_rank=num_qps_per_rank, backend="reference",
                                      allow_nvlink_for_low_latency_mode=allow_nvlink_for_low_latency_mode)

    def __getattr__(self, name):
        return getattr(self.__dict__["runtime"], name)

    def dispatch(self, x, *args, **kwargs):
        out = self.runtime.dispatch(x, *args, **kwargs)
        if CORRUPT and isinstance(x, torch.Tensor):
            out = (out[0] + 1, *out[1:])
        return out

    def destroy(self):
        assert self.explicitly_destroy
        self.runtime = None
        DESTROYED.append(True)

    @staticmethod
    def set_num_sms(n):
        Buffer.num_sms = n
        uccl_ep.Buffer.set_num_sms(n)

    @staticmethod
    def get_dispatch_config(num_ranks):
        return uccl_ep.Buffer.get_dispatch_config(num_ranks)

    @staticmethod
    def get_combine_config(num_ranks):
        return uccl_ep.Buffer.get_combine_config(num_ranks)

    @staticmethod
    def get_low_latency_rdma_size_hint(t, h, r, e):
        return uccl_ep.Buffer.get_low_latency_rdma_size_hint(t, h, r, e)
'''


def _write_fake(root, with_cpp=True):
    pkg = root / "deep_ep"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(FAKE_DEEP_EP))
    if with_cpp:
        (root / "deep_ep_cpp.py").write_text("")
    return str(root)


@pytest.fixture
def clean_deep_ep(monkeypatch):
    """Each case imports its own `deep_ep`; none leaks into other tests."""
    def drop():
        for name in [m for m in sys.modules if m == "deep_ep_cpp" or m == "deep_ep" or m.startswith("deep_ep.")]:
            del sys.modules[name]
    drop()
    yield monkeypatch
    drop()


def test_detection_refuses_the_shim(clean_deep_ep, tmp_path):
    from uccl_ep.bench.deepep import find_deepep
    clean_deep_ep.syspath_prepend(SHIM)
    found = find_deepep()
    assert not found.found and "drop-in" in found.reason


def test_detection_refuses_the_shim_beside_an_extension(clean_deep_ep, tmp_path):
    """A `deep_ep_cpp` on the path does not make uccl-ep's drop-in count as DeepEP."""
    from uccl_ep.bench.deepep import find_deepep
    (tmp_path / "deep_ep_cpp.py").write_text("")
    clean_deep_ep.syspath_prepend(str(tmp_path))
    clean_deep_ep.syspath_prepend(SHIM)
    found = find_deepep()
    assert not found.found and "drop-in" in found.reason


def test_detection_needs_the_extension_and_accepts_a_real_layout(clean_deep_ep, tmp_path):
    from uccl_ep.bench.deepep import find_deepep
    clean_deep_ep.syspath_prepend(_write_fake(tmp_path / "nocpp", with_cpp=False))
    found = find_deepep()
    assert not found.found and "deep_ep_cpp" in found.reason
    for name in ("deep_ep",):
        del sys.modules[name]
    clean_deep_ep.syspath_prepend(_write_fake(tmp_path / "full"))
    found = find_deepep()
    assert found.found, found.reason


def _run_cli(args, env_extra=None, timeout=300):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "uccl_ep.cli.main", "bench", "--cpu", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_matrix_end_to_end_with_deepep_baseline(tmp_path):
    """2 CPU ranks: uccl-ep on the host backend, the DeepEP stand-in on the reference backend; every
    row verified for both, the JSON and the table carry the NCCL/gloo baseline and the DeepEP ratio,
    CUDA-graph rows are listed as skipped with the reason, and the plot command says what it needs
    (or draws) from the saved JSON."""
    fake = _write_fake(tmp_path / "fake")
    out = tmp_path / "m.json"
    proc = _run_cli(["--backend", "host", "--matrix", *TINY, "--deepep", "require", "--json", str(out)],
                    {"PYTHONPATH": fake + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for col in ("NCCL µs", "vs NCCL", "DeepEP µs", "DeepEP GB/s", "vs DeepEP", "DeepEP verified"):
        assert col in proc.stdout
    data = json.loads(out.read_text())
    assert data["deepep_found"] and data["ranks"] == 2
    rows = data["rows"]
    # two points per mode: ranks route differently, and every collective still pairs up
    assert [(r["mode"], r["op"], r["run"], r["tokens"]) for r in rows] == [
        ("ht", op, "24 SMs", t) for t in (8, 16) for op in ("dispatch", "dispatch", "combine")] + [
        ("ll", op, run, t) for t in (8, 16) for op, run in (("dispatch", "eager"), ("combine", "eager"),
                                                            ("dispatch+combine", "eager"), ("dispatch+combine",
                                                                                            "graph"))]
    graph = [r for r in rows if r["run"] == "graph"]
    for r in rows:
        if r["run"] == "graph":
            continue
        assert r["backend"] == "host" and r["verified"] == "ok" and r["deepep_verified"] == "ok"
        assert r["baseline"] == "gloo a2a" and r["baseline_s"] > 0 and r["ratio"] == pytest.approx(
            r["baseline_s"] / r["time_s"])
        assert r["deepep_s"] > 0 and r["deepep_bytes"] == r["bytes"]
        assert r["vs_deepep"] == pytest.approx(r["gbps"] / r["deepep_gbps"])
    assert all(r["verified"] == "skipped" and "CUDA graph" in r["note"] and "time_s" not in r for r in graph)
    assert not os.path.exists(str(out) + ".partial.jsonl")
    again = _run_cli(["--from-json", str(out), "--plot", str(tmp_path / "m.png")])
    assert again.returncode == 0 and "vs DeepEP" in again.stdout
    assert "plot written" in again.stdout or "needs matplotlib" in again.stderr


def test_matrix_flags_are_checked(capsys, clean_deep_ep):
    """Bad matrix flags and single-shape flags end the command (exit 2) with the flag named."""
    from uccl_ep.cli.main import main
    assert main(["bench", "--cpu", "--matrix", "--matrix-routing", "8-256"]) == 2
    assert "--matrix-routing" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--matrix", "--num-tokens", "64"]) == 2
    assert "--matrix-tokens" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--matrix", "--matrix-sms", "24,13"]) == 2
    assert "--matrix-sms" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--matrix", "ll", "--matrix-ll-runs", "eager,replay"]) == 2
    assert "--matrix-ll-runs" in capsys.readouterr().err
    with clean_deep_ep.context() as env:
        for k, v in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
            env.setenv(k, v)
        assert main(["bench", "--cpu", "--matrix"]) == 2
    assert "without torchrun" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--matrix", "--tune", "ht_warps=4"]) == 2  # a Tuning value out of range
    assert "tuning.ht_warps" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--matrix", "--tune", "no_such_field=1"]) == 2
    assert "--tune" in capsys.readouterr().err
    assert main(["bench", "--cpu", "--plot", "x.png"]) == 2
    assert "--matrix" in capsys.readouterr().err
    clean_deep_ep.syspath_prepend(SHIM)  # only uccl-ep's drop-in is importable: DeepEP is required but absent
    assert main(["bench", "--cpu", "--matrix", "--deepep", "require"]) == 2
    assert "--deepep require" in capsys.readouterr().err


def _spec(**kw):
    from uccl_ep.bench.matrix import MatrixSpec, spec_to_dict
    base = dict(backend="reference", ht_tokens=[8, 16], ll_tokens=[8], hiddens=[256], routings=[[2, 8]], sms=[24],
                iters=2, warmup=0, synced_iters=1, deepep="off")
    base.update(kw)
    return spec_to_dict(MatrixSpec(**base))


def test_overall_budget_lists_skipped_points(world1):
    from uccl_ep.bench.matrix import run_matrix_rank
    out = run_matrix_rank(0, 1, _spec(budget_s=1e-6))
    rows = out["rows"]
    assert len(rows) == 2 * 3 + 4 and not out["deepep_found"] and "--deepep off" in out["deepep"]
    assert all(r["verified"] == "skipped" and "overall budget" in r["note"] and "time_s" not in r for r in rows)


def test_tuning_reaches_uccl_ep_buffers_and_the_rows(world1, monkeypatch):
    """--tune with --matrix: every uccl-ep Buffer of the run gets the Tuning (to set one choice, e.g. the
    copy engines, beside DeepEP at every shape), and each row says which."""
    import uccl_ep
    from uccl_ep.bench.matrix import run_matrix_rank
    seen = []
    real = uccl_ep.Buffer.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("tuning"))
        real(self, *a, **kw)
    monkeypatch.setattr(uccl_ep.Buffer, "__init__", spy)
    rows = run_matrix_rank(0, 1, _spec(modes=["ht"], ht_tokens=[8], tune=["ht_combine_ce=0", "ht_ce_min_mb=0"]))["rows"]
    assert seen and all(t == uccl_ep.Tuning(ht_combine_ce=False, ht_ce_min_mb=0) for t in seen), seen
    assert len(rows) == 3 and all(r["tune"] == "ht_combine_ce=0 ht_ce_min_mb=0" and r["verified"] == "ok" for r in rows)
    assert all("tune" not in r for r in run_matrix_rank(0, 1, _spec(modes=["ht"], ht_tokens=[8]))["rows"])


def test_row_budget_skips_ops_that_cannot_fit(world1):
    from uccl_ep.bench.matrix import run_matrix_rank
    rows = run_matrix_rank(0, 1, _spec(modes=["ht"], ht_tokens=[8], row_budget_s=1e-6))["rows"]
    assert len(rows) == 3
    assert all(r["verified"] == "skipped" and "row budget" in r["note"] for r in rows)


def test_plot_without_matplotlib_says_so(monkeypatch):
    from uccl_ep.bench import matrix_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    row = dict(mode="ht", op="dispatch", dtype="bf16", run="24 SMs", tokens=8, hidden=256, topk=2, experts=8,
               vs_deepep=1.5)
    with pytest.raises(matrix_report.PlotUnavailable, match="matplotlib"):
        matrix_report.plot([row], "/nonexistent/x.png", "t")


def test_a_broken_baseline_is_seen(world1, clean_deep_ep, tmp_path):
    """DeepEP's results are checked too: wrong rows mark its column FAILED, uccl-ep's rows stay ok,
    and its buffers are destroyed at the end."""
    from uccl_ep.bench.matrix import run_matrix_rank
    clean_deep_ep.syspath_prepend(_write_fake(tmp_path / "fake"))
    import deep_ep
    deep_ep.CORRUPT = True
    out = run_matrix_rank(0, 1, _spec(modes=["ht"], ht_tokens=[8], deepep="require"))
    assert out["deepep_found"] and len(out["rows"]) == 3 and deep_ep.DESTROYED == [True]
    for r in out["rows"]:
        assert r["verified"] == "ok" and r["deepep_verified"].startswith("FAILED") and "deepep" in r["deepep_verified"]
        assert r["deepep_s"] > 0 and "vs_deepep" in r
