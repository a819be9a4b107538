"""The env-var registry: typed parsing, clear errors, docs in sync, never writes os.environ."""

import os
import pathlib
import re

import pytest

from uccl_ep import env
from uccl_ep.errors import InvalidArgument

pytestmark = pytest.mark.cpu


def test_defaults_when_unset():
    assert env.get("UCCL_EP_TIMEOUT_S", environ={}) == 100.0
    assert env.get("UCCL_EP_BACKEND", environ={}) == "auto"
    assert env.get("UCCL_EP_FORCE_PROXY", environ={}) is False


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("ON", True), ("0", False), ("no", False)])
def test_bool_parsing(raw, value):
    assert env.get("UCCL_EP_FORCE_PROXY", environ={"UCCL_EP_FORCE_PROXY": raw}) is value


def test_int_float_choice_parsing():
    assert env.get("UCCL_EP_NUM_PROXY_THREADS", environ={"UCCL_EP_NUM_PROXY_THREADS": "0x8"}) == 8
    assert env.get("UCCL_EP_TIMEOUT_S", environ={"UCCL_EP_TIMEOUT_S": "2.5"}) == 2.5
    assert env.get("UCCL_EP_BACKEND", environ={"UCCL_EP_BACKEND": "reference"}) == "reference"


@pytest.mark.parametrize("name,raw,expect", [
    ("UCCL_EP_NUM_PROXY_THREADS", "four", "an integer"),
    ("UCCL_EP_NUM_PROXY_THREADS", "0", ">= 1"),
    ("UCCL_EP_MAX_INFLIGHT", "0", ">= 1"),
    ("UCCL_EP_TIMEOUT_S", "soon", "a number"),
    ("UCCL_EP_BACKEND", "nccl", "one of auto, reference, host, cuda"),
    ("UCCL_EP_FORCE_PROXY", "maybe", "a boolean"),
    ("UCCL_EP_IPC_COPY", "dma", "one of kernel, cuda"),
])
def test_bad_values_name_the_variable(name, raw, expect):
    with pytest.raises(InvalidArgument) as e:
        env.get(name, environ={name: raw})
    assert name in str(e.value) and expect in str(e.value)


def test_listed_choices_are_checked():
    """A variable that lists choices is parsed as a choice (a `str` kind would let any text through)."""
    assert [v.name for v in env.REGISTRY.values() if v.choices and v.kind != "choice"] == []


def test_unknown_variable_is_refused():
    with pytest.raises(InvalidArgument, match="registered uccl_ep env var"):
        env.get("UCCL_EP_NOT_A_THING")


def test_snapshot_does_not_write_environ():
    before = dict(os.environ)
    snap = env.snapshot()
    assert set(snap) == set(env.REGISTRY)
    assert dict(os.environ) == before


def test_docs_env_md_is_generated_from_registry():
    doc = pathlib.Path(__file__).resolve().parents[3] / "docs" / "env.md"
    assert doc.read_text() == env.render_markdown(), \
        "docs/env.md is stale: run `python -m uccl_ep.env > docs/env.md`"


@pytest.mark.parametrize("raw,ns", [("spin", -1), ("0", 0), ("2.5", 2500), ("auto", None)])
def test_proxy_idle_sleep(monkeypatch, raw, ns):
    """UCCL_EP_PROXY_IDLE_SLEEP_US: `spin` never yields (-1), a number is the sleep cap in ns, `auto`
    follows the CPU count; anything else is refused naming the variable."""
    from uccl_ep.proxy import bootstrap
    monkeypatch.setenv("UCCL_EP_PROXY_IDLE_SLEEP_US", raw)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert bootstrap.idle_sleep_ns() == (50_000 if ns is None else ns)
    monkeypatch.setenv("UCCL_EP_PROXY_IDLE_SLEEP_US", "-3")
    with pytest.raises(InvalidArgument, match="UCCL_EP_PROXY_IDLE_SLEEP_US"):
        bootstrap.idle_sleep_ns()


_ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_registry_holds_operator_settings_only():
    """At most 22 variables, each documented; kernel tuning lives in uccl_ep.Tuning, not here."""
    assert len(env.REGISTRY) <= 22, sorted(env.REGISTRY)
    for v in env.REGISTRY.values():
        assert v.doc.strip() and v.used_by, v.name
    tuning_like = [n for n in env.REGISTRY if n.startswith(("UCCL_EP_LL_", "UCCL_EP_HT_"))]
    assert tuning_like == []


# os.environ / os.getenv reads of a uccl_ep variable: a literal name, or a name held in a constant.
_READ = re.compile(r"(os\.environ(\.get)?\s*[\[(]|os\.getenv\s*\(|environ\)?\.get\s*\()\s*"
                   r"(['\"]UCCL_EP_|FLAG\b|support\.FLAG\b)")
_WRITE = re.compile(r"os\.environ\[[^]]+\]\s*=(?!=)|os\.environ\.(setdefault|update)\(")


def _sources():
    roots = [_ROOT / "core" / "uccl_ep"] + sorted((_ROOT / "integrations").glob("*/uccl_ep_*"))
    for root in roots:
        for path in root.rglob("*.py"):
            if path != _ROOT / "core" / "uccl_ep" / "env.py":
                yield path


def test_no_env_reads_outside_the_registry():
    """Every UCCL_EP_* variable is read through uccl_ep.env (typed, documented), nowhere by hand."""
    hits = [f"{p.relative_to(_ROOT)}:{i}: {line.strip()}" for p in _sources()
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if _READ.search(line) and not _WRITE.search(line)]
    assert hits == []


def test_every_uccl_ep_name_in_sources_is_registered():
    """A UCCL_EP_* name a library module passes to env.get / env.is_set is in the registry."""
    used = set()
    for p in _sources():
        used |= set(re.findall(r"env\.(?:get|is_set)\(\s*\"(UCCL_EP_[A-Z0-9_]+)\"", p.read_text()))
    assert used and used <= set(env.REGISTRY), sorted(used - set(env.REGISTRY))


def test_read_pattern_catches_hand_parsing():
    """The grep above is not vacuous: the hand-parsing forms the library used to have match it."""
    for line in ('forced = os.environ.get("UCCL_EP_FORCE_PROXY", "0")', "raw = os.environ.get(FLAG, '')",
                 "return (os.environ if environ is None else environ).get(FLAG, '')",
                 "os.getenv('UCCL_EP_LL_PDL')", 'os.environ["UCCL_EP_X"]'):
        assert _READ.search(line), line
    assert not _READ.search('os.environ.get("CUDA_HOME")')


def test_library_writes_environ_only_where_allowed():
    """uccl_ep's library code never writes os.environ (the CLI's rank launcher and the framework plugins,
    which hand a flag to processes they start, are the exceptions)."""
    allowed = {"core/uccl_ep/spawn.py", "core/uccl_ep/cli/bench.py"}
    hits = [str(p.relative_to(_ROOT)) for p in _sources() if _WRITE.search(p.read_text())
            and str(p.relative_to(_ROOT)) not in allowed and "plugin.py" not in p.name]
    assert hits == []
